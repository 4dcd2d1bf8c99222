// The mixer block of the gated and delta-rule model types (forward.h):
// fla's MultiScaleRetention (retnet), GatedLinearAttention (gla), DeltaNet
// (delta_net), GatedDeltaNet (gated_deltanet) and Mamba2 (mamba2), as
// docs/design.md ("Model types") writes them out. Each computes q, k, v and
// its gates from one in_proj GEMM (and a short convolution), runs the
// state's rule through the shared recurrent and chunkwise paths, and turns
// the heads' outputs into the o_proj input.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/attention/kernels.h"
#include "core/model/forward.h"
#include "core/model/row_ops.h"
#include "core/onednn/gemm.h"
#include "core/util/parallel_for.h"
#include "core/util/row_view.h"
#include "core/util/status_macros.h"

namespace linattn {
namespace {

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float Silu(float x) { return x / (1.0f + std::exp(-x)); }
// torch's softplus (β = 1, threshold 20), as fla and mamba_ssm use it.
float Softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }
// log σ(x) without overflow on either side.
float LogSigmoid(float x) {
  return x < 0 ? x - std::log1p(std::exp(x)) : -std::log1p(std::exp(-x));
}

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
      for (uint32_t i = 0; i < d; ++i)
        out[i] = Activate(c.qk_activation, out[i]);
      break;
  }
  if (c.qk_sum_norm) {  // fla: x / x.sum(-1), no ε
    float sum = 0;
    for (uint32_t i = 0; i < d; ++i) sum += out[i];
    for (uint32_t i = 0; i < d; ++i) out[i] /= sum;
  }
}

// GPT-NeoX rotary embedding of one head at `position`, fla's RetNet way:
// the halves x[0, d/2) and x[d/2, d) rotate by position·inv_freq[i], the
// angle and its cosine and sine in fp32.
void Rotate(const std::vector<float>& inv_freq, uint64_t position, float* x) {
  const size_t half = inv_freq.size();
  const float t = static_cast<float>(position);
  for (size_t i = 0; i < half; ++i) {
    const float theta = t * inv_freq[i];
    const float cs = std::cos(theta), sn = std::sin(theta);
    const float x1 = x[i], x2 = x[half + i];
    x[i] = x1 * cs - x2 * sn;
    x[half + i] = x1 * sn + x2 * cs;
  }
}

}  // namespace

void ForwardRunner::ShortConvolution(std::span<const ForwardItem> items,
                                     std::span<const Piece> pieces, size_t l) {
  const ModelConfig& c = model_->config();
  const Model::Layer& L = model_->layers()[l];
  const MixerColumns cols = MixerColumnsOf(c);
  const uint32_t C = c.conv_channels(), W = c.conv_size;
  const uint64_t keep = uint64_t{W - 1} * C;  // the window's floats
  const bool mamba = c.type == ModelType::kMamba2;
  const VectorKernels& kernels = ActiveKernels();
  const RowView<float> proj(proj_.data(), capacity_, cols.width);
  // y = Σ_j w_j·x_{t+j} over the window's rows and then the input (in that
  // order in both paths below, so a token gives the same bits in a decode
  // step and in a prompt), + bias, and Mamba2's SiLU.
  auto finish = [&](float* y) {
    if (!L.conv_bias.empty()) {
      for (uint32_t ch = 0; ch < C; ++ch) y[ch] += L.conv_bias[ch];
    }
    if (mamba) kernels.silu(C, y, y);  // Mamba2's convolution ends in SiLU
  };
  // Decode pieces (one row) read their session's window in place and then
  // move it up by one row; they are separate sessions, so they spread over
  // threads.
  uint64_t singles = 0;
  for (const Piece& p : pieces) singles += p.rows == 1;
  ParallelFor(
      pieces.size(), singles * C * W >= kParallelFloats, [&](uint64_t i) {
        const Piece& p = pieces[i];
        if (p.rows != 1) return;
        thread_local std::vector<float> x;
        float* y = proj.row(p.row0) + cols.conv;
        x.assign(y, y + C);
        std::fill(y, y + C, 0.0f);
        const ForwardItem& item = items[p.item];
        float* window = W > 1 ? item.state->conv()[l].data() : nullptr;
        for (uint32_t j = 0; j + 1 < W; ++j) {
          const float* w = L.conv.data() + uint64_t{j} * C;
          const float* h = window + uint64_t{j} * C;
          for (uint32_t ch = 0; ch < C; ++ch) y[ch] += w[ch] * h[ch];
        }
        const float* w = L.conv.data() + uint64_t{W - 1} * C;
        for (uint32_t ch = 0; ch < C; ++ch) y[ch] += w[ch] * x[ch];
        if (window != nullptr) {
          // The window moves up one row (into `into`'s, when the item has
          // one, leaving the state's as it was).
          float* to =
              item.into != nullptr ? item.into->conv()[l].data() : window;
          std::memmove(to, window + C, (keep - C) * sizeof(float));
          std::memcpy(to + keep - C, x.data(), C * sizeof(float));
        }
        finish(y);
      });
  for (const Piece& p : pieces) {
    if (p.rows == 1) continue;
    // ext: the window's W − 1 rows, then the piece's inputs.
    const RowView<float> ext(conv_ext_.data(), uint64_t{p.rows} + W - 1, C);
    std::vector<float>* window =
        W > 1 ? &items[p.item].state->conv()[l] : nullptr;
    if (window != nullptr) {
      std::memcpy(ext.data(), window->data(), keep * sizeof(float));
    }
    for (uint32_t t = 0; t < p.rows; ++t) {
      std::memcpy(ext.row(W - 1 + t), proj.row(p.row0 + t) + cols.conv,
                  C * sizeof(float));
    }
    ParallelFor(p.rows, uint64_t{p.rows} * C * W >= kParallelFloats,
                [&](uint64_t t) {
                  float* y = proj.row(p.row0 + t) + cols.conv;
                  std::fill(y, y + C, 0.0f);
                  for (uint32_t j = 0; j < W; ++j) {
                    const float* w = L.conv.data() + uint64_t{j} * C;
                    const float* x = ext.row(t + j);
                    for (uint32_t ch = 0; ch < C; ++ch) y[ch] += w[ch] * x[ch];
                  }
                  finish(y);
                });
    if (window != nullptr) {
      std::memcpy(window->data(), ext.row(p.rows), keep * sizeof(float));
    }
  }
}

absl::Status ForwardRunner::MixerInputs(std::span<const Piece> pieces,
                                        uint32_t rows, const Model::Layer& L) {
  const ModelConfig& c = model_->config();
  const MixerColumns cols = MixerColumnsOf(c);
  const uint32_t HS = c.state_heads, dk = c.head_k, dv = c.head_v;
  const uint32_t gate_width = c.type == ModelType::kGla ? dk : 1;
  const RowView<const float> proj(proj_.data(), rows, cols.width);
  const BlockView<float> q(fq_.data(), rows, HS, dk);
  const BlockView<float> k(fk_.data(), rows, HS, dk);
  const BlockView<float> v(v_.data(), rows, HS, dv);
  const BlockView<float> g(g_.data(), rows, HS, gate_width);
  const RowView<float> beta(beta_.data(), rows, HS);
  std::vector<uint64_t> position(rows);
  for (const Piece& p : pieces) {
    for (uint32_t j = 0; j < p.rows; ++j) position[p.row0 + j] = p.position + j;
  }

  if (c.type == ModelType::kMamba2) {
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

  if (c.type == ModelType::kGla) {
    // gk = gk_proj.1(gk_proj.0(x)) + b from the normed input (not the
    // convolution's output): the rank-16 columns through one GEMM.
    const RowView<float> low(low_rank_.data(), rows, kGlaGateRank);
    for (uint32_t r = 0; r < rows; ++r) {
      std::memcpy(low.row(r), proj.row(r) + cols.gk,
                  kGlaGateRank * sizeof(float));
    }
    LINATTN_RETURN_IF_ERROR(L.gk_up->Apply(low.data(), rows, gk_.data()));
  }
  // State head h reads q head h / (HS / num_heads), k head
  // h / (HS / num_kv_heads) and v head h / (HS / v heads): GQA repeats k
  // and v over groups of q heads, GVA q and k over groups of v heads.
  const uint32_t qg = HS / c.num_heads, kg = HS / c.num_kv_heads,
                 vg = HS / (c.v_width() / dv);
  const float clamp_min = c.clamp_min.value_or(-INFINITY);
  const RowView<const float> gk(gk_.data(), rows, c.k_width());
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
          switch (c.type) {
            case ModelType::kRetNet:
              Rotate(inv_freq_, position[r], q.row(r, h));
              Rotate(inv_freq_, position[r], k.row(r, h));
              g.row(r, h)[0] = L.log_decay[h];
              break;
            case ModelType::kGla: {
              // fla: logsigmoid(gk) / gate_logit_normalizer (16), then clamp.
              const float* raw = gk.row(r) + uint64_t{h / kg} * dk;
              float* gh = g.row(r, h);
              for (uint32_t i = 0; i < dk; ++i) {
                gh[i] = std::max(
                    LogSigmoid(raw[i] + L.gk_bias[h / kg * dk + i]) / 16.0f,
                    clamp_min);
              }
              break;
            }
            case ModelType::kGatedDeltaNet:
              // g = −exp(A_log)·softplus(a + dt_bias), per value head.
              g.row(r, h)[0] =
                  L.neg_exp_a[h] * Softplus(in[cols.a + h] + L.dt_bias[h]);
              [[fallthrough]];
            case ModelType::kDeltaNet: {
              float b = c.use_beta ? Sigmoid(in[cols.beta + h]) : 1.0f;
              if (c.allow_neg_eigval) b *= 2.0f;
              beta.row(r)[h] = b;
              break;
            }
            default:
              break;
          }
        }
      });
  return absl::OkStatus();
}

void ForwardRunner::MixerOutputs(uint32_t rows, const Model::Layer& L) {
  const ModelConfig& c = model_->config();
  const MixerColumns cols = MixerColumnsOf(c);
  const uint32_t HS = c.state_heads, dv = c.head_v;
  const RowView<const float> proj(proj_.data(), rows, cols.width);
  const RowView<float> o(o_.data(), rows, uint64_t{HS} * dv);
  const float eps = c.norm_eps;
  const float* w = L.head_norm.empty() ? nullptr : L.head_norm.data();
  const VectorKernels& kernels = ActiveKernels();
  if (c.type == ModelType::kMamba2) {
    // y + D·x, then fla's RMSNormGated over groups of I / G channels:
    // norm(y·SiLU(z))·w, or norm(y)·w·SiLU(z) with norm_before_gate.
    const uint32_t I = c.intermediate_size, group = I / c.n_groups;
    ParallelFor(rows, uint64_t{rows} * I >= kParallelFloats, [&](uint64_t r) {
      float* y = o.row(r);
      const float* x = proj.row(r) + cols.v;
      const float* z = proj.row(r) + cols.gate;
      for (uint32_t i = 0; i < I; ++i) {
        y[i] += (c.d_has_hdim ? L.d_skip[i] : L.d_skip[i / dv]) * x[i];
      }
      if (!c.rmsnorm || !c.norm_before_gate) kernels.silu_mul(I, z, y, y);
      if (c.rmsnorm) {
        RmsNormRows(y, c.n_groups, group, nullptr, eps, y);
        for (uint32_t i = 0; i < I; ++i) y[i] *= w[i];
        if (c.norm_before_gate) kernels.silu_mul(I, z, y, y);
      }
    });
    return;
  }
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

absl::Status ForwardRunner::MixerBlock(std::span<const ForwardItem> items,
                                       std::span<const Piece> pieces,
                                       uint32_t rows, size_t l) {
  const ModelConfig& c = model_->config();
  const Model::Layer& L = model_->layers()[l];
  const MixerColumns cols = MixerColumnsOf(c);
  RmsNorm(x_.data(), rows, c.hidden_size, L.attn_norm.data(), c.norm_eps,
          xn_.data());
  LINATTN_RETURN_IF_ERROR(L.in_proj->Apply(xn_.data(), rows, proj_.data()));
  if (!L.in_bias.empty()) {
    const RowView<float> proj(proj_.data(), rows, cols.width);
    for (uint32_t r = 0; r < rows; ++r) {
      for (uint32_t i = 0; i < cols.width; ++i) proj.row(r)[i] += L.in_bias[i];
    }
  }
  if (c.conv_channels() > 0) ShortConvolution(items, pieces, l);
  LINATTN_RETURN_IF_ERROR(MixerInputs(pieces, rows, L));
  const UpdateRule rule = model_->attention().spec().rule;
  LINATTN_RETURN_IF_ERROR(RunAttention(items, pieces, rows, l,
                                       HasGates(rule) ? g_.data() : nullptr,
                                       HasBeta(rule) ? beta_.data() : nullptr));
  MixerOutputs(rows, L);
  LINATTN_RETURN_IF_ERROR(L.o->Apply(o_.data(), rows, x_.data()));
  if (!L.out_bias.empty()) {
    const RowView<float> x(x_.data(), rows, c.hidden_size);
    for (uint32_t r = 0; r < rows; ++r) {
      for (uint32_t i = 0; i < c.hidden_size; ++i) x.row(r)[i] += L.out_bias[i];
    }
  }
  return absl::OkStatus();
}

}  // namespace linattn
