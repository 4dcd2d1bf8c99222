#include "core/model/forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "core/attention/kernels.h"
#include "core/attention/recurrent.h"
#include "core/model/row_ops.h"
#include "core/onednn/gemm.h"
#include "core/util/parallel_for.h"
#include "core/util/row_view.h"
#include "core/util/status_macros.h"

namespace linattn {
namespace {

// φ of one head's raw vector x (d_k) into out (d_φ); `lin` is the learned
// linear output for the maps that have one.
void ApplyFeatureMap(ModelFeatureMap map, const float* x, const float* lin,
                     uint32_t dk, float* out) {
  switch (map) {
    case ModelFeatureMap::kElu:  // F.elu(x) + 1, vectorised
      ActiveKernels().elu1(dk, x, out);
      break;
    case ModelFeatureMap::kRelu:
      for (uint32_t i = 0; i < dk; ++i) out[i] = std::max(x[i], 0.0f);
      break;
    case ModelFeatureMap::kIdentity:
      std::memcpy(out, x, dk * sizeof(float));
      break;
    case ModelFeatureMap::kT2R:
      for (uint32_t i = 0; i < dk; ++i) out[i] = std::max(lin[i], 0.0f);
      break;
    case ModelFeatureMap::kHedgehog: {
      // softmax over [2y, −2y]
      float m = 0;
      for (uint32_t i = 0; i < dk; ++i) m = std::max(m, std::fabs(2 * lin[i]));
      float sum = 0;
      for (uint32_t i = 0; i < dk; ++i) {
        out[i] = std::exp(2 * lin[i] - m);
        out[dk + i] = std::exp(-2 * lin[i] - m);
        sum += out[i] + out[dk + i];
      }
      const float inv = 1.0f / sum;
      for (uint32_t i = 0; i < 2 * dk; ++i) out[i] *= inv;
      break;
    }
    case ModelFeatureMap::kDpfp: {
      // fla's DPFPFeatureMap (fla/modules/feature_map.py): x2 = [r, −r] with
      // r = relu(x) — the negative of relu(x), not relu(−x) as in the DPFP
      // paper; fla's checkpoints are trained with fla's. torch.roll by j
      // gives x2[(i − j) mod n]; block b (j = b + 1) is x2 ⊙ roll(x2, j).
      const uint32_t n = 2 * dk;
      thread_local std::vector<float> x2;
      x2.resize(n);
      for (uint32_t i = 0; i < dk; ++i) {
        x2[i] = std::max(x[i], 0.0f);
        x2[dk + i] = -x2[i];
      }
      for (uint32_t b = 0; b < 4; ++b) {
        const uint32_t shift = (b + 1) % n;
        for (uint32_t i = 0; i < n; ++i) {
          out[b * n + i] = x2[i] * x2[(i + n - shift) % n];
        }
      }
      break;
    }
    case ModelFeatureMap::kElementwiseProduct:
      for (uint32_t i = 0; i < dk; ++i) out[i] = lin[i] * lin[dk + i];
      break;
  }
}

}  // namespace

ForwardRunner::ForwardRunner(std::shared_ptr<const Model> model,
                             ForwardOptions options)
    : model_(std::move(model)),
      options_(options),
      chunkwise_(options.chunkwise) {
  options_.max_rows = std::clamp<uint32_t>(
      options_.max_rows, 1, static_cast<uint32_t>(PackedLinear::kMaxRows));
  const ModelConfig& c = model_->config();
  if (c.type == ModelType::kRetNet) {
    // fla's RotaryEmbedding: inv_freq = 1 / base^(2i/d), base 10000, in
    // fp32 as torch computes it.
    for (uint32_t i = 0; i < c.head_k / 2; ++i) {
      const float e = static_cast<float>(2 * i) / static_cast<float>(c.head_k);
      inv_freq_.push_back(1.0f / std::pow(10000.0f, e));
    }
  }
}

void ForwardRunner::EnsureWorkspace(uint32_t needed) {
  // The GEMMs touch whole row buckets (PackedLinear::Bucket).
  const uint64_t rows = PackedLinear::Bucket(needed);
  if (rows <= capacity_) return;
  const ModelConfig& c = model_->config();
  const uint64_t H = c.hidden_size,
                 nh = c.is_linear_attn() ? c.num_heads : c.state_heads;
  const uint64_t qkv = c.key_dim() + uint64_t{c.num_kv_heads} *
                                         (c.head_k_dim() + c.head_v_dim());
  x_ = AlignedBuffer(rows * H);
  xn_ = AlignedBuffer(rows * H);
  if (c.is_linear_attn()) {
    qkv_ = AlignedBuffer(rows * qkv);
    heads_ = AlignedBuffer(rows * nh * c.head_k_dim());
    mapped_ = AlignedBuffer(rows * nh * 2 * c.head_k_dim());
  }
  fq_ = AlignedBuffer(rows * nh * c.feature_dim());
  fk_ = AlignedBuffer(rows * nh * c.feature_dim());
  v_ = AlignedBuffer(rows * nh * c.head_v_dim());
  o_ = AlignedBuffer(rows * nh * c.head_v_dim());
  den_ = AlignedBuffer(rows * nh);
  available_.assign(rows * nh, 0);
  if (c.has_mlp()) {
    gu_ = AlignedBuffer(rows * 2 * uint64_t{c.intermediate_size});
    act_ = AlignedBuffer(rows * uint64_t{c.intermediate_size});
  }
  logits_rows_ = AlignedBuffer(rows * H);
  logits_out_ = AlignedBuffer(rows * uint64_t{c.vocab_size});
  if (!c.is_linear_attn()) {
    const uint64_t heads = c.state_heads;
    proj_ = AlignedBuffer(rows * MixerColumnsOf(c).width);
    g_ = AlignedBuffer(rows * heads *
                       (c.type == ModelType::kGla ? c.head_k : 1));
    beta_ = AlignedBuffer(rows * heads);
    if (c.type == ModelType::kGla) {
      low_rank_ = AlignedBuffer(rows * kGlaGateRank);
      gk_ = AlignedBuffer(rows * c.k_width());
    }
    if (c.conv_channels() > 0) {
      conv_ext_ = AlignedBuffer((rows + c.conv_size - 1) * c.conv_channels());
    }
  }
  capacity_ = static_cast<uint32_t>(rows);
}

absl::Status ForwardRunner::Run(ModelState& state,
                                std::span<const int32_t> tokens,
                                float* logits) {
  ForwardItem item{.state = &state, .tokens = tokens, .logits = logits};
  return Run(std::span<const ForwardItem>(&item, 1));
}

absl::Status ForwardRunner::Run(std::span<const ForwardItem> items) {
  const ModelConfig& c = model_->config();
  std::set<const ModelState*> seen;
  for (size_t i = 0; i < items.size(); ++i) {
    const ForwardItem& item = items[i];
    if (item.state == nullptr || !model_->Matches(*item.state)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "items[", i, "].state: not a state of model '", model_->name(), "'"));
    }
    if (!seen.insert(item.state).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("items[", i, "].state: appears twice in one batch"));
    }
    if (item.into != nullptr &&
        (item.tokens.size() != 1 || !model_->Matches(*item.into) ||
         !seen.insert(item.into).second)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "items[", i,
          "].into: not a separate state of this model for a one-token item"));
    }
    if (item.tokens.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("items[", i, "].tokens: empty"));
    }
    for (size_t j = 0; j < item.tokens.size(); ++j) {
      int32_t t = item.tokens[j];
      if (t < 0 || static_cast<uint32_t>(t) >= c.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("items[", i, "].tokens[", j, "]: id ", t,
                         " is outside the vocabulary [0, ", c.vocab_size, ")"));
      }
    }
  }
  std::vector<uint64_t> done(items.size(), 0);
  std::vector<Piece> pieces;
  for (;;) {
    pieces.clear();
    uint32_t rows = 0;
    for (uint32_t i = 0; i < items.size() && rows < options_.max_rows; ++i) {
      const uint64_t left = items[i].tokens.size() - done[i];
      if (left == 0) continue;
      const uint32_t take = static_cast<uint32_t>(
          std::min<uint64_t>(left, options_.max_rows - rows));
      pieces.push_back(
          Piece{i, done[i], take, rows, items[i].state->position()});
      rows += take;
      done[i] += take;
    }
    if (pieces.empty()) break;
    LINATTN_RETURN_IF_ERROR(Pass(items, pieces, rows));
  }
  return absl::OkStatus();
}

absl::Status ForwardRunner::FeatureMaps(const Model::Layer& layer,
                                        uint32_t rows) {
  const ModelConfig& c = model_->config();
  const uint32_t nh = c.num_heads, nkv = c.num_kv_heads, g = c.kv_groups();
  const uint32_t dk = c.head_k_dim(), dv = c.head_v_dim(),
                 dphi = c.feature_dim();
  const float scale = 1.0f / std::sqrt(static_cast<float>(dphi));
  const bool learned = c.feature_map_has_weights();
  const uint32_t lin_dim =
      c.feature_map == ModelFeatureMap::kElementwiseProduct ? 2 * dk : dk;
  // A row of qkv_ is [q heads | k heads | v heads], each head d_k (d_v)
  // wide; each part is viewed as rows of its heads, `stride` apart.
  const uint64_t stride = c.key_dim() + uint64_t{nkv} * (dk + dv);
  const uint64_t k_col = c.key_dim(), v_col = k_col + uint64_t{nkv} * dk;

  // which = 0: q (nh heads at column 0), 1: k (nkv heads after q).
  for (int which = 0; which < 2; ++which) {
    const uint32_t src_heads = which == 0 ? nh : nkv;
    const uint32_t expand = which == 0 ? 1 : g;
    const uint64_t col = which == 0 ? 0 : k_col;
    const bool normalize = which == 0 ? c.norm_q : c.norm_k;
    // Source heads: row r's head h at qkv_ row r, column col + h·d_k.
    const RowView<const float> src(qkv_.data() + col, rows,
                                   uint64_t{src_heads} * dk, stride);
    const RowView<float> dst(which == 0 ? fq_.data() : fk_.data(),
                             uint64_t{rows} * nh, dphi);  // (row, head)
    const RowView<float> heads(heads_.data(), uint64_t{rows} * src_heads, dk);
    const RowView<float> mapped(mapped_.data(), uint64_t{rows} * src_heads,
                                lin_dim);
    if (learned) {
      // (rows·heads × d_k) · Wᵀ as one GEMM, then bias.
      for (uint32_t r = 0; r < rows; ++r) {
        std::memcpy(heads.row(uint64_t{r} * src_heads), src.row(r),
                    uint64_t{src_heads} * dk * sizeof(float));
      }
      const AlignedBuffer& w = which == 0 ? layer.fq_w : layer.fk_w;
      const std::vector<float>& b = which == 0 ? layer.fq_b : layer.fk_b;
      LINATTN_RETURN_IF_ERROR(
          LinearGemm(heads.data(), int64_t{rows} * src_heads, dk, w.data(),
                     lin_dim, mapped.data(), false));
      if (!b.empty()) {
        for (uint64_t i = 0; i < mapped.rows(); ++i) {
          float* y = mapped.row(i);
          for (uint32_t j = 0; j < lin_dim; ++j) y[j] += b[j];
        }
      }
    }
    ParallelFor(
        rows, uint64_t{rows} * nh * dphi >= kParallelFloats, [&](uint64_t r) {
          for (uint32_t sh = 0; sh < src_heads; ++sh) {
            const float* x = src.row(r) + uint64_t{sh} * dk;
            const float* lin = mapped.row(uint64_t{r} * src_heads + sh);
            float* out = dst.row(uint64_t{r} * nh + uint64_t{sh} * expand);
            ApplyFeatureMap(c.feature_map, x, lin, dk, out);
            if (normalize) {
              float sum = 0;
              for (uint32_t i = 0; i < dphi; ++i) sum += out[i];
              const float inv = 1.0f / (sum + 1e-4f);
              for (uint32_t i = 0; i < dphi; ++i) out[i] *= inv;
            }
            if (which == 0) {
              for (uint32_t i = 0; i < dphi; ++i) out[i] *= scale;
            }
            for (uint32_t e = 1; e < expand; ++e) {
              std::memcpy(dst.row(uint64_t{r} * nh + uint64_t{sh} * expand + e),
                          out, dphi * sizeof(float));
            }
          }
        });
  }
  // v: query head h reads key/value head h / g.
  const RowView<const float> v_src(qkv_.data() + v_col, rows,
                                   uint64_t{nkv} * dv, stride);
  const BlockView<float> v(v_.data(), rows, nh, dv);
  for (uint32_t r = 0; r < rows; ++r) {
    for (uint32_t h = 0; h < nh; ++h) {
      std::memcpy(v.row(r, h), v_src.row(r) + uint64_t{h / g} * dv,
                  dv * sizeof(float));
    }
  }
  return absl::OkStatus();
}

absl::Status ForwardRunner::Pass(std::span<const ForwardItem> items,
                                 std::span<const Piece> pieces, uint32_t rows) {
  EnsureWorkspace(rows);
  Embed(items, pieces);
  const ModelConfig& c = model_->config();
  for (size_t l = 0; l < model_->layers().size(); ++l) {
    if (c.is_linear_attn()) {
      LINATTN_RETURN_IF_ERROR(AttentionBlock(items, pieces, rows, l));
    } else {
      LINATTN_RETURN_IF_ERROR(MixerBlock(items, pieces, rows, l));
    }
    if (c.has_mlp()) {
      LINATTN_RETURN_IF_ERROR(MlpBlock(model_->layers()[l], rows));
    }
  }
  return Logits(items, pieces);
}

// The residual stream starts as each row's token embedding.
void ForwardRunner::Embed(std::span<const ForwardItem> items,
                          std::span<const Piece> pieces) {
  const uint32_t H = model_->config().hidden_size;
  const RowView<const float> table(model_->embeddings().data(),
                                   model_->config().vocab_size, H);
  const RowView<float> x(x_.data(), capacity_, H);
  for (const Piece& p : pieces) {
    for (uint32_t j = 0; j < p.rows; ++j) {
      const int32_t t = items[p.item].tokens[p.first + j];
      std::memcpy(x.row(p.row0 + j), table.row(static_cast<uint64_t>(t)),
                  H * sizeof(float));
    }
  }
}

// x += o_proj(headnorm(attention(φ(q), φ(k), v))) with (q|k|v) from
// rmsnorm(x): one-token rows through one StepBatch, longer pieces through
// one chunkwise prefill, each on its session's layer-l state.
absl::Status ForwardRunner::AttentionBlock(std::span<const ForwardItem> items,
                                           std::span<const Piece> pieces,
                                           uint32_t rows, size_t l) {
  const Model& m = *model_;
  const ModelConfig& c = m.config();
  const Model::Layer& L = m.layers()[l];
  const uint32_t H = c.hidden_size, nh = c.num_heads, dv = c.head_v_dim();
  RmsNorm(x_.data(), rows, H, L.attn_norm.data(), c.norm_eps, xn_.data());
  LINATTN_RETURN_IF_ERROR(L.qkv->Apply(xn_.data(), rows, qkv_.data()));
  LINATTN_RETURN_IF_ERROR(FeatureMaps(L, rows));
  LINATTN_RETURN_IF_ERROR(
      RunAttention(items, pieces, rows, l, nullptr, nullptr));
  RmsNorm(o_.data(), uint64_t{rows} * nh, dv,
          L.head_norm.empty() ? nullptr : L.head_norm.data(), c.norm_eps,
          o_.data());
  return L.o->Apply(o_.data(), rows, x_.data());
}

// The layer's attention over every piece: φ(q)/q, φ(k)/k and v from fq_,
// fk_ and v_ (rows × heads × the spec's widths), g and β (the gated and
// delta rules) rows × heads (× d_k per key), into o_.
absl::Status ForwardRunner::RunAttention(std::span<const ForwardItem> items,
                                         std::span<const Piece> pieces,
                                         uint32_t rows, size_t l,
                                         const float* g, const float* beta) {
  const Model& m = *model_;
  const AttentionSpec& spec = m.attention().spec();
  const uint32_t nh = spec.num_heads, dk = spec.key_dim, dv = spec.value_dim;
  const uint32_t gate_width = GatesPerHead(spec);
  const BlockView<const float> q(fq_.data(), rows, nh, dk);
  const BlockView<const float> k(fk_.data(), rows, nh, dk);
  const BlockView<const float> v(v_.data(), rows, nh, dv);
  const BlockView<float> o(o_.data(), rows, nh, dv);
  const RowView<float> den(den_.data(), rows, nh);
  const RowView<uint8_t> available(available_.data(), rows, nh);
  std::vector<StepItem> steps;
  std::vector<PrefillItem> prefills;
  for (const Piece& p : pieces) {
    SequenceInput in{
        .q = q.row(p.row0, 0),
        .k = k.row(p.row0, 0),
        .v = v.row(p.row0, 0),
        .tokens = p.rows,
        .g = g == nullptr ? nullptr : g + uint64_t{p.row0} * nh * gate_width,
        .beta = beta == nullptr ? nullptr : beta + uint64_t{p.row0} * nh};
    SequenceOutput out{.output = o.row(p.row0, 0),
                       .denominator = den.row(p.row0),
                       .available = available.row(p.row0)};
    AttentionState* state = &items[p.item].state->layers()[l];
    if (p.rows == 1) {
      ModelState* into = items[p.item].into;
      steps.push_back(StepItem{&m.attention(), state, in, out,
                               into != nullptr ? &into->layers()[l] : nullptr});
    } else {
      prefills.push_back(PrefillItem{&m.attention(), state, in, out});
    }
  }
  auto not_finite = [l](const absl::Status& s) {
    return absl::InternalError(
        absl::StrCat("layer ", l, ": the model's activations are not finite (",
                     s.message(), ")"));
  };
  if (!steps.empty()) {
    if (absl::Status s = StepBatch(steps); !s.ok()) return not_finite(s);
  }
  if (!prefills.empty()) {
    // In place: the caller's backup is the one rollback (file comment).
    if (absl::Status s = chunkwise_.Run(prefills, PrefillCommit::kInPlace);
        !s.ok()) {
      return s.code() == absl::StatusCode::kInvalidArgument ? not_finite(s) : s;
    }
  }
  return absl::OkStatus();
}

// x += down(SiLU(gate)·up) with (gate|up) from rmsnorm(x).
absl::Status ForwardRunner::MlpBlock(const Model::Layer& L, uint32_t rows) {
  const ModelConfig& c = model_->config();
  const uint32_t H = c.hidden_size, I = c.intermediate_size;
  RmsNorm(x_.data(), rows, H, L.mlp_norm.data(), c.norm_eps, xn_.data());
  LINATTN_RETURN_IF_ERROR(L.gate_up->Apply(xn_.data(), rows, gu_.data()));
  const RowView<const float> gate_up(gu_.data(), rows, 2 * uint64_t{I});
  const RowView<float> act(act_.data(), rows, I);
  const VectorKernels& kernels = ActiveKernels();
  ParallelFor(rows, uint64_t{rows} * I >= kParallelFloats, [&](uint64_t r) {
    const float* gate = gate_up.row(r);
    kernels.silu_mul(I, gate, gate + I, act.row(r));
  });
  return L.down->Apply(act_.data(), rows, x_.data());
}

// lm_head(rmsnorm(x)) for the rows whose logits are wanted: an item's last
// row, or every row with all_logits.
absl::Status ForwardRunner::Logits(std::span<const ForwardItem> items,
                                   std::span<const Piece> pieces) {
  const Model& m = *model_;
  const ModelConfig& c = m.config();
  const uint32_t H = c.hidden_size, V = c.vocab_size;
  std::vector<std::pair<uint32_t, float*>> wanted;  // (row, destination)
  for (const Piece& p : pieces) {
    const ForwardItem& item = items[p.item];
    if (item.all_logits != nullptr) {
      const RowView<float> all(item.all_logits, item.tokens.size(), V);
      for (uint32_t j = 0; j < p.rows; ++j) {
        wanted.emplace_back(p.row0 + j, all.row(p.first + j));
      }
    }
    if (item.logits != nullptr && item.all_logits == nullptr &&
        p.first + p.rows == item.tokens.size()) {
      wanted.emplace_back(p.row0 + p.rows - 1, item.logits);
    }
  }
  if (wanted.empty()) return absl::OkStatus();
  const RowView<const float> x(x_.data(), capacity_, H);
  const RowView<float> gathered(xn_.data(), wanted.size(), H);
  const RowView<const float> logits(logits_out_.data(), wanted.size(), V);
  for (size_t i = 0; i < wanted.size(); ++i) {
    std::memcpy(gathered.row(i), x.row(wanted[i].first), H * sizeof(float));
  }
  RmsNorm(gathered.data(), wanted.size(), H, m.final_norm().data(), c.norm_eps,
          logits_rows_.data());
  LINATTN_RETURN_IF_ERROR(m.lm_head().Apply(logits_rows_.data(),
                                            static_cast<int64_t>(wanted.size()),
                                            logits_out_.data()));
  for (size_t i = 0; i < wanted.size(); ++i) {
    std::memcpy(wanted[i].second, logits.row(i), V * sizeof(float));
  }
  for (const Piece& p : pieces) {
    const ForwardItem& item = items[p.item];
    if (item.logits != nullptr && item.all_logits != nullptr &&
        p.first + p.rows == item.tokens.size()) {
      const RowView<const float> all(item.all_logits, item.tokens.size(), V);
      std::memcpy(item.logits, all.row(item.tokens.size() - 1),
                  V * sizeof(float));
    }
  }
  return absl::OkStatus();
}

}  // namespace linattn
