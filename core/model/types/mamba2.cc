// mamba2: fla's Mamba2 (fla/layers/mamba2.py, as mamba_ssm's Mamba2): one
// in_proj into [z | x B C | dt], a short convolution over x B C ending in
// SiLU, dt = clamp(softplus(dt + dt_bias), dt_limit), the gated rule per
// head with k = B and q = C of group h / (H/G), v = dt·x_h and g =
// dt·(−exp(A_log_h)), no scale; y = o + D ⊙ x, then the gated RMSNorm over
// groups of I/G channels (or y·SiLU(z) without rmsnorm), out_proj; no MLP.
// Reference: tools/linattn_ref.py's Mamba2Mixer.
#include "core/model/types/mamba2.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/model/row_ops.h"
#include "core/util/parallel_for.h"
#include "core/util/row_view.h"
#include "core/util/status_macros.h"

namespace linattn {

absl::Status ReadMamba2Shape(const json& j, const Mamba2Fields& f,
                             ModelConfig& c) {
  c.num_kv_heads = c.state_heads = c.num_heads;
  if (auto s = Dim(j, f.state_size, &c.state_size, f.state_size_default);
      !s.ok())
    return s;
  c.head_k = c.state_size;
  if (auto s = Dim(j, f.n_groups, &c.n_groups, 1); !s.ok()) return s;
  LINATTN_RETURN_IF_ERROR(
      Divides(f.n_groups, c.num_heads, c.n_groups, "the head count"));
  if (auto s = Dim(j, f.conv_kernel, &c.conv_size, 4); !s.ok()) return s;
  c.use_short_conv = true;
  LINATTN_RETURN_IF_ERROR(Bool(j, f.conv_bias, &c.use_conv_bias, true));
  return Bool(j, f.bias, &c.use_bias, false);
}

absl::Status ReadTimeStepLimit(const json& j, const char* field,
                               ModelConfig& c) {
  c.dt_min = 0;
  c.dt_max = std::numeric_limits<double>::infinity();
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_array() || it->size() != 2) {
    return ConfigFieldError(field, "must be [min, max]");
  }
  LINATTN_ASSIGN_OR_RETURN(c.dt_min, Number((*it)[0], field));
  LINATTN_ASSIGN_OR_RETURN(c.dt_max, Number((*it)[1], field));
  if (!(c.dt_min >= 0) || !std::isfinite(c.dt_min) || !(c.dt_max >= c.dt_min)) {
    return ConfigFieldError(
        field, absl::StrCat("must be [min, max] with 0 ≤ min ≤ max, got [",
                            c.dt_min, ", ", c.dt_max, "]"));
  }
  return absl::OkStatus();
}

absl::Status Mamba2Def::ReadConfig(const json& j, ModelConfig& c) const {
  uint32_t inner = 0;
  LINATTN_RETURN_IF_ERROR(Expand(j, "expand", 2, c.hidden_size, &inner));
  if (auto s = Dim(j, "head_dim", &c.head_v, 64); !s.ok()) return s;
  LINATTN_RETURN_IF_ERROR(
      Divides("head_dim", inner, c.head_v, "expand × hidden_size"));
  c.intermediate_size = c.mamba_inner = inner;
  c.num_heads = inner / c.head_v;
  // Mamba2Config derives num_heads; a stored one must agree (the layer
  // raises otherwise).
  uint32_t stored = c.num_heads;
  if (auto s = Dim(j, "num_heads", &stored, c.num_heads); !s.ok()) return s;
  if (stored != c.num_heads) {
    return ConfigFieldError(
        "num_heads", absl::StrCat("must be expand × hidden_size / head_dim = ",
                                  c.num_heads, ", got ", stored));
  }
  LINATTN_RETURN_IF_ERROR(
      ReadMamba2Shape(j,
                      {"state_size", 128, "n_groups", "conv_kernel",
                       "use_conv_bias", "use_bias"},
                      c));
  c.gated_norm_groups = c.n_groups;
  // fla wrote `rms_norm` before `rmsnorm`, and from September 2024 to April
  // 2026 applied the norm whatever it said (its first release honoured
  // it): false without `rmsnorm` has no one meaning.
  if (!j.contains("rmsnorm")) {
    bool old = true;
    LINATTN_RETURN_IF_ERROR(Bool(j, "rms_norm", &old, true));
    if (!old) {
      return ConfigFieldError(
          "rms_norm",
          "false is read differently by fla's releases; set "
          "\"rmsnorm\" explicitly");
    }
  }
  LINATTN_RETURN_IF_ERROR(Bool(j, "rmsnorm", &c.rmsnorm, true));
  LINATTN_RETURN_IF_ERROR(
      Bool(j, "norm_before_gate", &c.norm_before_gate, false));
  LINATTN_RETURN_IF_ERROR(Bool(j, "D_has_hdim", &c.d_has_hdim, false));
  return ReadTimeStepLimit(
      j,
      j.contains("dt_limit") || !j.contains("time_step_limit")
          ? "dt_limit"
          : "time_step_limit",
      c);
}

absl::Status Mamba2Def::LoadMixer(TensorReader& r, const ModelConfig& c,
                                  const std::string& layer, WeightType weights,
                                  Model::Layer& L) const {
  const std::string p = layer + MixerModule();
  const int64_t H = c.hidden_size;
  const MixerColumns cols = Columns(c);
  const int64_t C = c.conv_channels(), W = c.conv_size;
  {
    LINATTN_ASSIGN_OR_RETURN(AlignedBuffer w,
                             r.Matrix(p + "in_proj.weight", cols.width, H));
    LINATTN_ASSIGN_OR_RETURN(
        L.in_proj,
        PackedLinear::Create(w.data(), cols.width, H, false, weights));
  }
  // Shapes first: the window's size comes from config.json alone.
  LINATTN_RETURN_IF_ERROR(r.Check(p + "conv1d.weight", {C, 1, W}));
  L.conv = AlignedBuffer(W * C);
  LINATTN_RETURN_IF_ERROR(ReadConv(r, p + "conv1d.weight", C, W, 0, C, L.conv));
  if (c.use_conv_bias) {
    LINATTN_ASSIGN_OR_RETURN(L.conv_bias, r.Vector(p + "conv1d.bias", C));
  }
  LINATTN_RETURN_IF_ERROR(LoadDecay(r, c, p, L));
  if (c.use_bias) {
    LINATTN_ASSIGN_OR_RETURN(L.in_bias,
                             r.Vector(p + "in_proj.bias", cols.width));
    LINATTN_ASSIGN_OR_RETURN(L.out_bias, r.Vector(p + "out_proj.bias", H));
  }
  LINATTN_ASSIGN_OR_RETURN(
      L.d_skip,
      r.Vector(p + "D", c.d_has_hdim ? c.mamba_inner : c.state_heads));
  if (c.rmsnorm) {
    LINATTN_ASSIGN_OR_RETURN(L.head_norm,
                             r.Vector(p + "norm.weight", c.mamba_inner));
  }
  LINATTN_ASSIGN_OR_RETURN(AlignedBuffer w, r.Matrix(p + "out_proj.weight", H,
                                                     int64_t{c.value_dim()}));
  // A residual multiplier scales the branch (its bias too).
  ScaleResidualBranch(c, w, L.out_bias);
  LINATTN_ASSIGN_OR_RETURN(
      L.o, PackedLinear::Create(w.data(), H, c.value_dim(), true, weights));
  return absl::OkStatus();
}

absl::Status Mamba2Def::Inputs(ForwardRunner& runner, const LayerPass& pass,
                               const Model::Layer& L) const {
  const PassRows at = RowsOf(runner, pass);
  const ModelConfig& c = at.c;
  ForwardWorkspace& ws = at.ws;
  const uint32_t rows = at.rows;
  const MixerColumns& cols = at.cols;
  const RowView<const float>& proj = at.proj;
  const uint32_t HS = c.state_heads, dv = c.head_v;
  const BlockView<float> q(ws.fq.data(), rows, HS, c.head_k);
  const BlockView<float> k(ws.fk.data(), rows, HS, c.head_k);
  const BlockView<float> v(ws.v.data(), rows, HS, dv);
  const BlockView<float> g(ws.g.data(), rows, HS, 1);
  // Head h reads B and C of group h / (H / G), as mamba_ssm's kernels and
  // fla's decode path do (fla's CPU prefill tiles h % G instead).
  const uint32_t N = c.state_size, per_group = HS / c.n_groups;
  const float dt_min = static_cast<float>(c.dt_min);
  const float dt_max = std::isinf(c.dt_max)
                           ? std::numeric_limits<float>::infinity()
                           : static_cast<float>(c.dt_max);
  ParallelFor(rows, uint64_t{rows} * HS * dv >= kParallelFloats,
              [&](uint64_t r) {
                const float* in = proj.row(r);
                for (uint32_t h = 0; h < HS; ++h) {
                  const uint32_t grp = h / per_group;
                  std::memcpy(q.row(r, h), in + cols.q + uint64_t{grp} * N,
                              N * sizeof(float));
                  std::memcpy(k.row(r, h), in + cols.k + uint64_t{grp} * N,
                              N * sizeof(float));
                  float dt = Softplus(in[cols.a + h] + L.dt_bias[h]);
                  dt = std::min(std::max(dt, dt_min), dt_max);
                  const float* x = in + cols.v + uint64_t{h} * dv;
                  float* vh = v.row(r, h);
                  for (uint32_t i = 0; i < dv; ++i) vh[i] = dt * x[i];
                  g.row(r, h)[0] = dt * L.neg_exp_a[h];
                }
              });
  return absl::OkStatus();
}

void Mamba2Def::Outputs(ForwardRunner& runner, const LayerPass& pass,
                        const Model::Layer& L) const {
  const PassRows at = RowsOf(runner, pass);
  const ModelConfig& c = at.c;
  ForwardWorkspace& ws = at.ws;
  const uint32_t rows = at.rows;
  const MixerColumns& cols = at.cols;
  const RowView<const float>& proj = at.proj;
  const uint32_t dv = c.head_v;
  const RowView<float> o(ws.o.data(), rows, uint64_t{c.state_heads} * dv);
  const float eps = c.norm_eps;
  const float* w = L.head_norm.empty() ? nullptr : L.head_norm.data();
  const VectorKernels& kernels = ActiveKernels();
  // y + D·x, then the gated RMSNorm over its groups (fla's over I / G
  // channels, granitemoehybrid's over I): norm(y·SiLU(z))·w, or
  // norm(y)·w·SiLU(z) with norm_before_gate.
  const uint32_t I = c.mamba_inner, groups = c.gated_norm_groups,
                 group = I / groups;
  ParallelFor(rows, uint64_t{rows} * I >= kParallelFloats, [&](uint64_t r) {
    float* y = o.row(r);
    const float* x = proj.row(r) + cols.v;
    const float* z = proj.row(r) + cols.gate;
    for (uint32_t i = 0; i < I; ++i) {
      y[i] += (c.d_has_hdim ? L.d_skip[i] : L.d_skip[i / dv]) * x[i];
    }
    if (!c.rmsnorm || !c.norm_before_gate) kernels.silu_mul(I, z, y, y);
    if (c.rmsnorm) {
      RmsNormRows(y, groups, group, nullptr, eps, y);
      for (uint32_t i = 0; i < I; ++i) y[i] *= w[i];
      if (c.norm_before_gate) kernels.silu_mul(I, z, y, y);
    }
  });
}

const ModelTypeDef& Mamba2Type() {
  static const Mamba2Def kDef;
  return kDef;
}

}  // namespace linattn
