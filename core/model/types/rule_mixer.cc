#include "core/model/types/rule_mixer.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/attention/spec.h"
#include "core/model/row_ops.h"
#include "core/util/parallel_for.h"
#include "core/util/row_view.h"
#include "core/util/status_macros.h"

namespace linattn {
namespace {

float Activate(QkActivation a, float x) {
  switch (a) {
    case QkActivation::kNone:
      return x;
    case QkActivation::kRelu:
      return std::max(x, 0.0f);
    case QkActivation::kSigmoid:
      return Sigmoid(x);
    case QkActivation::kLogSigmoid:
      return LogSigmoid(x);
    case QkActivation::kSilu:
      return Silu(x);
    case QkActivation::kGelu:  // the exact (erf) GELU
      return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f));
    case QkActivation::kSqRelu: {
      const float r = std::max(x, 0.0f);
      return r * r;
    }
    case QkActivation::kElu1:
      return x > 0 ? x + 1.0f : std::exp(x);
  }
  return x;
}

// One head's q or k as the type's layer shapes it before the rule: SiLU
// (the convolution's activation), the feature map or qk_activation, and
// DeltaNet's sum normalisation. SiLU and σ run vectorised.
void ShapeQueryKey(const VectorKernels& kernels, const ModelConfig& c,
                   const float* src, uint32_t d, float* out) {
  if (c.silu_qk) {
    kernels.silu(d, src, out);
  } else {
    std::memcpy(out, src, d * sizeof(float));
  }
  switch (c.qk_activation) {
    case QkActivation::kNone:
      break;
    case QkActivation::kSilu:
      kernels.silu(d, out, out);
      break;
    case QkActivation::kSigmoid:
      kernels.sigmoid(d, out, out);
      break;
    default:
      for (uint32_t i = 0; i < d; ++i) {
        out[i] = Activate(c.qk_activation, out[i]);
      }
      break;
  }
  if (c.qk_sum_norm) {  // fla: x / x.sum(-1), no ε
    float sum = 0;
    for (uint32_t i = 0; i < d; ++i) sum += out[i];
    for (uint32_t i = 0; i < d; ++i) out[i] /= sum;
  }
}

// fla's ACT2FN names for a feature_map (null: none).
absl::StatusOr<QkActivation> ParseQkMap(const json& j, absl::string_view type,
                                        const QkMapNames& maps) {
  auto name = Optional<std::string>(j, "feature_map");
  if (!name.ok()) return name.status();
  if (!name->has_value()) return QkActivation::kNone;
  const std::string& n = **name;
  if (n == "relu") return QkActivation::kRelu;
  if (n == "sigmoid") return QkActivation::kSigmoid;
  if (n == "silu" || n == "swish") return QkActivation::kSilu;
  for (const auto& [extra, activation] : maps.extra) {
    if (n == extra) return activation;
  }
  return ConfigFieldError(
      "feature_map", absl::StrCat("'", n, "' is not supported for ", type, " (",
                                  maps.listed, ")"));
}

}  // namespace

absl::Status ReadGroupedHeads(const json& j, ModelConfig& c, uint32_t heads,
                              double expand_k, double expand_v,
                              const QkMapNames& maps) {
  if (auto s = Dim(j, "num_heads", &c.num_heads, heads); !s.ok()) return s;
  if (auto s = Dim(j, "num_kv_heads", &c.num_kv_heads, c.num_heads); !s.ok())
    return s;
  LINATTN_RETURN_IF_ERROR(
      Divides("num_kv_heads", c.num_heads, c.num_kv_heads, "num_heads"));
  LINATTN_RETURN_IF_ERROR(ReadHeadWidths(j, c, expand_k, expand_v));
  LINATTN_ASSIGN_OR_RETURN(c.qk_activation, ParseQkMap(j, c.model_type, maps));
  LINATTN_RETURN_IF_ERROR(Bool(j, "use_output_gate", &c.output_gate, true));
  LINATTN_RETURN_IF_ERROR(Affine(j, &c.elementwise_affine));
  bool fuse_norm = true;
  LINATTN_RETURN_IF_ERROR(Bool(j, "fuse_norm", &fuse_norm, true));
  auto act = Optional<std::string>(j, "hidden_act");
  if (!act.ok()) return act.status();
  // fla builds FusedRMSNormGated (g_norm_swish_gate) only for a fused norm
  // in front of an output gate named "swish"; otherwise an RMSNorm named
  // g_norm and the gate function (silu is the same function).
  c.fused_gate_norm =
      c.output_gate && fuse_norm && act->value_or("swish") == "swish";
  return absl::OkStatus();
}

absl::Status ReadDeltaCommon(const json& j, ModelConfig& c, bool gate) {
  LINATTN_RETURN_IF_ERROR(Bool(j, "use_gate", &c.output_gate, gate));
  LINATTN_RETURN_IF_ERROR(Bool(j, "use_short_conv", &c.use_short_conv, true));
  if (auto s = Dim(j, "conv_size", &c.conv_size, 4); !s.ok()) return s;
  LINATTN_RETURN_IF_ERROR(
      Bool(j, "allow_neg_eigval", &c.allow_neg_eigval, false));
  c.elementwise_affine = true;
  c.num_kv_heads = c.num_heads;
  return absl::OkStatus();
}

absl::Status ReadHeadWidths(const json& j, ModelConfig& c, double expand_k,
                            double expand_v) {
  uint32_t key_dim = 0, value_dim = 0;
  LINATTN_RETURN_IF_ERROR(
      Expand(j, "expand_k", expand_k, c.hidden_size, &key_dim));
  LINATTN_RETURN_IF_ERROR(
      Expand(j, "expand_v", expand_v, c.hidden_size, &value_dim));
  LINATTN_RETURN_IF_ERROR(
      Divides("expand_k", key_dim, c.num_heads, "the key dim"));
  LINATTN_RETURN_IF_ERROR(
      Divides("expand_v", value_dim, c.num_heads, "the value dim"));
  c.head_k = key_dim / c.num_heads;
  c.head_v = value_dim / c.num_heads;
  c.state_heads = c.num_heads;
  return absl::OkStatus();
}

RuleMixer::PassRows RuleMixer::RowsOf(ForwardRunner& runner,
                                      const LayerPass& pass) const {
  const ModelConfig& c = runner.model().config();
  ForwardWorkspace& ws = runner.workspace();
  const MixerColumns cols = Columns(c);
  return PassRows{c, ws, pass.rows, cols,
                  RowView<const float>(ws.proj.data(), pass.rows, cols.width)};
}

AttentionSpec RuleMixer::Spec(const ModelConfig& c) const {
  AttentionSpec spec;
  spec.rule = rule();
  spec.gate = gate();
  spec.num_heads = c.state_heads;
  spec.key_dim = c.head_k;
  spec.value_dim = c.head_v;
  spec.feature_map = FeatureMapKind::kIdentity;
  spec.unnormalized = true;
  spec.qk_l2norm = c.qk_l2norm;
  if (scaled()) {
    spec.scale =
        static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_k)));
  }
  return spec;
}

MixerColumns RuleMixer::Columns(const ModelConfig& c) const {
  MixerColumns m;
  m.q = 0;
  m.k = c.q_width();
  m.v = m.k + c.k_width();
  uint32_t at = m.v + c.v_width();
  ExtraColumns(c, m, at);
  if (c.output_gate) {
    m.gate = at;
    at += c.value_dim();
  }
  m.width = at;
  return m;
}

absl::Status RuleMixer::CheckSizes(const ModelConfig& c) const {
  // Every width a layer's buffers are cut into, in 64 bits: each a model
  // dimension at most (so no product of them wraps around).
  const uint64_t heads = c.num_heads, kv = c.num_kv_heads,
                 state = c.state_heads, dk = c.head_k, dv = c.head_v;
  for (uint64_t w : {heads * dk, kv * dk, state * dv, ExtraWidth(c)}) {
    if (w > kMaxModelDim) {
      return ConfigFieldError(
          size_field(),
          absl::StrCat("gives a projection of ", w,
                       " columns, beyond linattn's limit ", kMaxModelDim));
    }
  }
  // The state's widths are the attention spec's (at most kMaxDim each).
  if (c.head_k > kMaxDim || c.head_v > kMaxDim || c.state_heads > kMaxDim) {
    return ConfigFieldError(
        head_field(),
        absl::StrCat("a state head of ", c.head_k, " × ", c.head_v, " (",
                     c.state_heads, " heads) is beyond linattn's limit ",
                     kMaxDim));
  }
  return absl::OkStatus();
}

std::string RuleMixer::HeadNormName(const TensorReader& r, const ModelConfig&,
                                    const std::string& p) const {
  // DeltaNet: o_norm (norm in its first release); Gated DeltaNet: o_norm.
  return Either(r, {p + "o_norm.weight", p + "norm.weight"});
}

absl::Status RuleMixer::LoadDecay(TensorReader& r, const ModelConfig& c,
                                  const std::string& p, Model::Layer& L) {
  LINATTN_ASSIGN_OR_RETURN(std::vector<float> a_log,
                           r.Vector(p + "A_log", c.state_heads));
  for (float a : a_log) L.neg_exp_a.push_back(-std::exp(a));
  LINATTN_ASSIGN_OR_RETURN(L.dt_bias, r.Vector(p + "dt_bias", c.state_heads));
  return absl::OkStatus();
}

absl::Status RuleMixer::LoadMixer(TensorReader& r, const ModelConfig& c,
                                  const std::string& layer, WeightType weights,
                                  Model::Layer& L) const {
  const std::string p = layer + "attn.";
  const int64_t H = c.hidden_size, dv = c.head_v_dim();
  const MixerColumns cols = Columns(c);
  const int64_t C = c.conv_channels(), W = c.conv_size;
  std::vector<std::pair<std::string, int64_t>> parts = {
      {p + "q_proj.weight", c.q_width()},
      {p + "k_proj.weight", c.k_width()},
      {p + "v_proj.weight", c.v_width()}};
  ExtraProjections(r, c, p, parts);
  if (c.output_gate) parts.push_back({p + "g_proj.weight", c.value_dim()});
  {
    LINATTN_ASSIGN_OR_RETURN(AlignedBuffer w, r.Stacked(parts, H));
    LINATTN_ASSIGN_OR_RETURN(
        L.in_proj,
        PackedLinear::Create(w.data(), cols.width, H, false, weights));
  }
  if (C > 0) {
    // Shapes first: the window's size comes from config.json alone.
    const std::pair<std::string, int64_t> convs[] = {
        {p + "q_conv1d.weight", c.q_width()},
        {p + "k_conv1d.weight", c.k_width()},
        {p + "v_conv1d.weight", c.v_width()}};
    for (const auto& [name, width] : convs) {
      LINATTN_RETURN_IF_ERROR(r.Check(name, {width, 1, W}));
    }
    L.conv = AlignedBuffer(W * C);
    const uint32_t firsts[] = {cols.q, cols.k, cols.v};
    for (size_t i = 0; i < 3; ++i) {
      LINATTN_RETURN_IF_ERROR(ReadConv(r, convs[i].first, convs[i].second, W,
                                       firsts[i], C, L.conv));
    }
  }
  LINATTN_RETURN_IF_ERROR(LoadExtras(r, c, p, L));
  if (c.elementwise_affine) {
    LINATTN_ASSIGN_OR_RETURN(L.head_norm, r.Vector(HeadNormName(r, c, p), dv));
  }
  LINATTN_ASSIGN_OR_RETURN(AlignedBuffer w, r.Matrix(p + "o_proj.weight", H,
                                                     int64_t{c.value_dim()}));
  LINATTN_ASSIGN_OR_RETURN(
      L.o, PackedLinear::Create(w.data(), H, c.value_dim(), true, weights));
  return absl::OkStatus();
}

absl::Status RuleMixer::RunMixer(ForwardRunner& runner,
                                 const LayerPass& pass) const {
  const PassRows at = RowsOf(runner, pass);
  const ModelConfig& c = at.c;
  ForwardWorkspace& ws = at.ws;
  const uint32_t rows = at.rows;
  const MixerColumns& cols = at.cols;
  const Model::Layer& L = runner.model().layers()[pass.layer];
  RmsNorm(ws.x.data(), rows, c.hidden_size, L.attn_norm.data(), c.norm_eps,
          ws.xn.data());
  LINATTN_RETURN_IF_ERROR(L.in_proj->Apply(ws.xn.data(), rows, ws.proj.data()));
  if (!L.in_bias.empty()) {
    const RowView<float> proj(ws.proj.data(), rows, cols.width);
    for (uint32_t r = 0; r < rows; ++r) {
      for (uint32_t i = 0; i < cols.width; ++i) proj.row(r)[i] += L.in_bias[i];
    }
  }
  if (c.conv_channels() > 0) runner.ShortConvolution(pass);
  LINATTN_RETURN_IF_ERROR(Inputs(runner, pass, L));
  const UpdateRule update = rule();
  LINATTN_RETURN_IF_ERROR(
      runner.RunAttention(pass, HasGates(update) ? ws.g.data() : nullptr,
                          HasBeta(update) ? ws.beta.data() : nullptr));
  Outputs(runner, pass, L);
  LINATTN_RETURN_IF_ERROR(L.o->Apply(ws.o.data(), rows, ws.x.data()));
  if (!L.out_bias.empty()) {
    const RowView<float> x(ws.x.data(), rows, c.hidden_size);
    for (uint32_t r = 0; r < rows; ++r) {
      for (uint32_t i = 0; i < c.hidden_size; ++i) x.row(r)[i] += L.out_bias[i];
    }
  }
  return absl::OkStatus();
}

absl::Status RuleMixer::Inputs(ForwardRunner& runner, const LayerPass& pass,
                               const Model::Layer& L) const {
  const PassRows at = RowsOf(runner, pass);
  const ModelConfig& c = at.c;
  ForwardWorkspace& ws = at.ws;
  const uint32_t rows = at.rows;
  const MixerColumns& cols = at.cols;
  const RowView<const float>& proj = at.proj;
  const uint32_t HS = c.state_heads, dk = c.head_k, dv = c.head_v;
  const uint32_t gate_width = gate() == GateShape::kKey ? dk : 1;
  const BlockView<float> q(ws.fq.data(), rows, HS, dk);
  const BlockView<float> k(ws.fk.data(), rows, HS, dk);
  const BlockView<float> v(ws.v.data(), rows, HS, dv);
  const BlockView<float> g(ws.g.data(), rows, HS, gate_width);
  const RowView<float> beta(ws.beta.data(), rows, HS);
  std::vector<uint64_t> position(rows);
  for (const ForwardPiece& p : pass.pieces) {
    for (uint32_t j = 0; j < p.rows; ++j) position[p.row0 + j] = p.position + j;
  }
  LINATTN_RETURN_IF_ERROR(PrepareInputs(runner, pass, L));
  // State head h reads q head h / (HS / num_heads), k head
  // h / (HS / num_kv_heads) and v head h / (HS / v heads): GQA repeats k
  // and v over groups of q heads, GVA q and k over groups of v heads.
  const uint32_t qg = HS / c.num_heads, kg = HS / c.num_kv_heads,
                 vg = HS / (c.v_width() / dv);
  const VectorKernels& kernels = ActiveKernels();
  ParallelFor(
      rows, uint64_t{rows} * HS * (dk + dv) >= kParallelFloats,
      [&](uint64_t r) {
        const float* in = proj.row(r);
        for (uint32_t h = 0; h < HS; ++h) {
          ShapeQueryKey(kernels, c, in + cols.q + uint64_t{h / qg} * dk, dk,
                        q.row(r, h));
          ShapeQueryKey(kernels, c, in + cols.k + uint64_t{h / kg} * dk, dk,
                        k.row(r, h));
          const float* vs = in + cols.v + uint64_t{h / vg} * dv;
          float* vh = v.row(r, h);
          if (c.silu_v) {
            kernels.silu(dv, vs, vh);
          } else {
            std::memcpy(vh, vs, dv * sizeof(float));
          }
          HeadInputs(Head{c, L, cols, ws, in, r, h, position[r], q.row(r, h),
                          k.row(r, h), g.row(r, h), beta.row(r)});
        }
      });
  return absl::OkStatus();
}

void RuleMixer::Outputs(ForwardRunner& runner, const LayerPass& pass,
                        const Model::Layer& L) const {
  const PassRows at = RowsOf(runner, pass);
  const ModelConfig& c = at.c;
  ForwardWorkspace& ws = at.ws;
  const uint32_t rows = at.rows;
  const MixerColumns& cols = at.cols;
  const RowView<const float>& proj = at.proj;
  const uint32_t HS = c.state_heads, dv = c.head_v;
  const RowView<float> o(ws.o.data(), rows, uint64_t{HS} * dv);
  const float eps = c.norm_eps;
  const float* w = L.head_norm.empty() ? nullptr : L.head_norm.data();
  const VectorKernels& kernels = ActiveKernels();
  // Per head: RMSNorm over d_v with the heads' shared weight, times
  // SiLU(g_proj(x)) with an output gate (fla's FusedRMSNormGated, or
  // RMSNorm then gate_fn = swish).
  ParallelFor(rows, uint64_t{rows} * HS * dv >= kParallelFloats,
              [&](uint64_t r) {
                RmsNormRows(o.row(r), HS, dv, w, eps, o.row(r));
                if (c.output_gate) {
                  kernels.silu_mul(HS * dv, proj.row(r) + cols.gate, o.row(r),
                                   o.row(r));
                }
              });
}

}  // namespace linattn
