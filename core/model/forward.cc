#include "core/model/forward.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <set>

#include "absl/strings/str_cat.h"
#include "core/attention/kernels.h"
#include "core/attention/recurrent.h"
#include "core/model/model_types.h"
#include "core/model/moe.h"
#include "core/model/row_ops.h"
#include "core/onednn/gemm.h"
#include "core/util/parallel_for.h"
#include "core/util/row_view.h"
#include "core/util/status_macros.h"

namespace linattn {

ForwardRunner::ForwardRunner(std::shared_ptr<const Model> model,
                             ForwardOptions options)
    : model_(std::move(model)),
      options_(options),
      chunkwise_(options.chunkwise) {
  options_.max_rows = std::clamp<uint32_t>(
      options_.max_rows, 1, static_cast<uint32_t>(PackedLinear::kMaxRows));
}

void ForwardRunner::EnsureWorkspace(uint32_t needed) {
  // The GEMMs touch whole row buckets (PackedLinear::Bucket).
  const uint64_t rows = PackedLinear::Bucket(needed);
  if (rows <= ws_.capacity) return;
  const ModelConfig& c = model_->config();
  const uint64_t H = c.hidden_size,
                 nh = c.is_linear_attn() ? c.num_heads : c.state_heads;
  const uint64_t qkv = c.key_dim() + uint64_t{c.num_kv_heads} *
                                         (c.head_k_dim() + c.head_v_dim());
  ws_.x = AlignedBuffer(rows * H);
  ws_.xn = AlignedBuffer(rows * H);
  if (c.is_linear_attn()) {
    ws_.qkv = AlignedBuffer(rows * qkv);
    ws_.heads = AlignedBuffer(rows * nh * c.head_k_dim());
    ws_.mapped = AlignedBuffer(rows * nh * 2 * c.head_k_dim());
  }
  ws_.fq = AlignedBuffer(rows * nh * c.feature_dim());
  ws_.fk = AlignedBuffer(rows * nh * c.feature_dim());
  ws_.v = AlignedBuffer(rows * nh * c.head_v_dim());
  ws_.o = AlignedBuffer(rows * nh * c.head_v_dim());
  ws_.den = AlignedBuffer(rows * nh);
  ws_.available.assign(rows * nh, 0);
  if (c.has_mlp()) {
    ws_.gu = AlignedBuffer(rows * 2 * uint64_t{c.widest_mlp()});
    ws_.act = AlignedBuffer(rows * uint64_t{c.widest_mlp()});
  }
  if (c.num_experts > 0) {
    const uint64_t I = c.expert_size;
    ws_.moe_logits = AlignedBuffer(rows * c.num_experts);
    ws_.moe_in = AlignedBuffer(rows * H);
    ws_.moe_gu = AlignedBuffer(rows * 2 * I);
    ws_.moe_act = AlignedBuffer(rows * I);
    ws_.moe_out = AlignedBuffer(rows * H);
  }
  ws_.logits_rows = AlignedBuffer(rows * H);
  ws_.logits_out = AlignedBuffer(rows * uint64_t{c.vocab_size});
  if (!c.is_linear_attn()) {
    const uint64_t heads = c.state_heads;
    ws_.proj = AlignedBuffer(rows * MixerColumnsOf(c).width);
    ws_.g = AlignedBuffer(
        rows * heads *
        std::max<uint32_t>(1, GatesPerHead(model_->attention().spec())));
    ws_.beta = AlignedBuffer(rows * heads);
    if (c.conv_channels() > 0) {
      ws_.conv_ext =
          AlignedBuffer((rows + c.conv_size - 1) * c.conv_channels());
    }
  }
  if (c.is_hybrid()) {
    uint64_t widest = 0, out = 0;
    for (const ModelConfig::SoftmaxAttention& a : c.attn) {
      const uint64_t qw = a.q_width();
      widest = std::max<uint64_t>(
          widest, qw * (a.output_gate ? 2 : 1) +
                      2 * uint64_t{a.num_kv_heads} * a.head_dim);
      out = std::max(out, qw);
    }
    ws_.attn_qkv = AlignedBuffer(rows * widest);
    ws_.attn_o = AlignedBuffer(rows * out);
  }
  ws_.capacity = static_cast<uint32_t>(rows);
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
  last_session_groups_ = std::max<uint32_t>(1, SessionGroups(items));
  if (last_session_groups_ > 1) return RunGroups(items, last_session_groups_);
  return RunPasses(items);
}

uint32_t ForwardRunner::SessionGroups(
    std::span<const ForwardItem> items) const {
  if (options_.session_groups == 1 || omp_in_parallel()) return 1;
  for (const ForwardItem& item : items) {
    if (item.tokens.size() != 1) return 1;
  }
  const uint64_t most = items.size() / kMinGroupSessions;
  if (options_.session_groups > 1) {
    return static_cast<uint32_t>(
        std::min<uint64_t>(options_.session_groups, most));
  }
  // Automatic: a group per thread, each a whole group, or one team.
  const uint64_t threads = static_cast<uint64_t>(omp_get_max_threads());
  if (model_->projection_bytes() > kMaxGroupWeightBytes || threads < 2 ||
      most < threads) {
    return 1;
  }
  return static_cast<uint32_t>(threads);
}

absl::Status ForwardRunner::RunGroups(std::span<const ForwardItem> items,
                                      uint32_t groups) {
  ForwardOptions one = options_;
  one.session_groups = 1;
  while (groups_.size() < groups) {
    groups_.push_back(std::make_unique<ForwardRunner>(model_, one));
  }
  // Contiguous ranges of sessions, one per thread; inside the region the
  // products, rules and elementwise passes run on their group's thread.
  // Nothing may leave the region by an exception (std::terminate).
  std::vector<absl::Status> status(groups);
  const uint64_t n = items.size();
#pragma omp parallel for num_threads(groups) schedule(static, 1)
  for (uint32_t g = 0; g < groups; ++g) {
    const uint64_t begin = n * g / groups, end = n * (g + 1) / groups;
    try {
      status[g] = groups_[g]->RunPasses(items.subspan(begin, end - begin));
    } catch (const std::bad_alloc&) {
      status[g] = absl::ResourceExhaustedError(
          "memory: the model forward's buffers could not be allocated");
    }
    if (!status[g].ok() && begin > 0) {
      // The group numbers its items from 0.
      status[g] = absl::Status(
          status[g].code(),
          absl::StrCat(status[g].message(), " (items numbered from ", begin,
                       ": the step's group of items [", begin, ", ", end,
                       "))"));
    }
  }
  for (const absl::Status& s : status) LINATTN_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

absl::Status ForwardRunner::RunPasses(std::span<const ForwardItem> items) {
  std::vector<uint64_t> done(items.size(), 0);
  std::vector<ForwardPiece> pieces;
  for (;;) {
    pieces.clear();
    uint32_t rows = 0;
    for (uint32_t i = 0; i < items.size() && rows < options_.max_rows; ++i) {
      const uint64_t left = items[i].tokens.size() - done[i];
      if (left == 0) continue;
      const uint32_t take = static_cast<uint32_t>(
          std::min<uint64_t>(left, options_.max_rows - rows));
      pieces.push_back(
          ForwardPiece{i, done[i], take, rows, items[i].state->position()});
      rows += take;
      done[i] += take;
    }
    if (pieces.empty()) break;
    LINATTN_RETURN_IF_ERROR(Pass(items, pieces, rows));
  }
  return absl::OkStatus();
}

absl::Status ForwardRunner::Pass(std::span<const ForwardItem> items,
                                 std::span<const ForwardPiece> pieces,
                                 uint32_t rows) {
  EnsureWorkspace(rows);
  Embed(items, pieces);
  const ModelConfig& c = model_->config();
  const ModelTypeDef& type = ModelTypeOf(c.type);
  for (size_t l = 0; l < model_->layers().size(); ++l) {
    const LayerPass pass{items, pieces, rows, l};
    LINATTN_RETURN_IF_ERROR(c.attention_layer(l) != nullptr
                                ? type.RunAttentionBlock(*this, pass)
                                : type.RunMixer(*this, pass));
    if (c.has_mlp()) {
      const Model::Layer& L = model_->layers()[l];
      LINATTN_RETURN_IF_ERROR(MlpBlock(l, rows));
      // The experts read the MLP's normed input, still in xn.
      if (L.experts != nullptr) {
        LINATTN_RETURN_IF_ERROR(RunExperts(*this, *L.experts, l, rows));
      }
    }
  }
  return Logits(items, pieces);
}

// The residual stream starts as each row's token embedding.
void ForwardRunner::Embed(std::span<const ForwardItem> items,
                          std::span<const ForwardPiece> pieces) {
  const uint32_t H = model_->config().hidden_size;
  const RowView<const float> table(model_->embeddings().data(),
                                   model_->config().vocab_size, H);
  const RowView<float> x(ws_.x.data(), ws_.capacity, H);
  // granitemoehybrid's embedding_multiplier (1 elsewhere).
  const float m = static_cast<float>(model_->config().embedding_multiplier);
  for (const ForwardPiece& p : pieces) {
    for (uint32_t j = 0; j < p.rows; ++j) {
      const int32_t t = items[p.item].tokens[p.first + j];
      float* row = x.row(p.row0 + j);
      std::memcpy(row, table.row(static_cast<uint64_t>(t)), H * sizeof(float));
      if (m != 1.0f) {
        for (uint32_t i = 0; i < H; ++i) row[i] *= m;
      }
    }
  }
}

absl::Status ForwardRunner::RunAttention(const LayerPass& pass, const float* g,
                                         const float* beta, const float* a,
                                         const float* b) {
  const std::span<const ForwardItem> items = pass.items;
  const uint32_t rows = pass.rows;
  const size_t l = pass.layer;
  const Model& m = *model_;
  const AttentionSpec& spec = m.attention().spec();
  const uint32_t nh = spec.num_heads, dk = spec.key_dim, dv = spec.value_dim;
  const uint32_t gate_width = GatesPerHead(spec);
  const BlockView<const float> q(ws_.fq.data(), rows, nh, dk);
  const BlockView<const float> k(ws_.fk.data(), rows, nh, dk);
  const BlockView<const float> v(ws_.v.data(), rows, nh, dv);
  const BlockView<float> o(ws_.o.data(), rows, nh, dv);
  const RowView<float> den(ws_.den.data(), rows, nh);
  const RowView<uint8_t> available(ws_.available.data(), rows, nh);
  std::vector<StepItem> steps;
  std::vector<PrefillItem> prefills;
  for (const ForwardPiece& p : pass.pieces) {
    SequenceInput in{
        .q = q.row(p.row0, 0),
        .k = k.row(p.row0, 0),
        .v = v.row(p.row0, 0),
        .tokens = p.rows,
        .g = g == nullptr ? nullptr : g + uint64_t{p.row0} * nh * gate_width,
        .beta = beta == nullptr ? nullptr : beta + uint64_t{p.row0} * nh,
        .a = a == nullptr ? nullptr : a + uint64_t{p.row0} * nh * dk,
        .b = b == nullptr ? nullptr : b + uint64_t{p.row0} * nh * dk};
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

// x += down(SiLU(gate)·up) with (gate|up) from xn = rmsnorm(x) (kept in xn
// for the experts), the output times σ(w·xn) with qwen3_next's
// shared_expert_gate (applied to SiLU(gate)·up, before the linear down).
absl::Status ForwardRunner::MlpBlock(size_t layer, uint32_t rows) {
  const ModelConfig& c = model_->config();
  const Model::Layer& L = model_->layers()[layer];
  const uint32_t H = c.hidden_size, I = c.mlp_width(layer);
  RmsNorm(ws_.x.data(), rows, H, L.mlp_norm.data(), c.norm_eps, ws_.xn.data());
  if (L.gate_up == nullptr) return absl::OkStatus();  // width 0: adds nothing
  LINATTN_RETURN_IF_ERROR(L.gate_up->Apply(ws_.xn.data(), rows, ws_.gu.data()));
  const RowView<const float> gate_up(ws_.gu.data(), rows, 2 * uint64_t{I});
  const RowView<const float> xn(ws_.xn.data(), rows, H);
  const RowView<float> act(ws_.act.data(), rows, I);
  const VectorKernels& kernels = ActiveKernels();
  ParallelFor(rows, uint64_t{rows} * I >= kParallelFloats, [&](uint64_t r) {
    const float* gate = gate_up.row(r);
    kernels.silu_mul(I, gate, gate + I, act.row(r));
    if (!L.mlp_out_gate.empty()) {
      const float g = kernels.dot(H, L.mlp_out_gate.data(), xn.row(r));
      kernels.scale(I, 1.0f / (1.0f + std::exp(-g)), act.row(r));
    }
  });
  return L.down->Apply(ws_.act.data(), rows, ws_.x.data());
}

// lm_head(rmsnorm(x)) for the rows whose logits are wanted: an item's last
// row, or every row with all_logits.
absl::Status ForwardRunner::Logits(std::span<const ForwardItem> items,
                                   std::span<const ForwardPiece> pieces) {
  const Model& m = *model_;
  const ModelConfig& c = m.config();
  const uint32_t H = c.hidden_size, V = c.vocab_size;
  std::vector<std::pair<uint32_t, float*>> wanted;  // (row, destination)
  for (const ForwardPiece& p : pieces) {
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
  const RowView<const float> x(ws_.x.data(), ws_.capacity, H);
  const RowView<float> gathered(ws_.xn.data(), wanted.size(), H);
  const RowView<const float> logits(ws_.logits_out.data(), wanted.size(), V);
  for (size_t i = 0; i < wanted.size(); ++i) {
    std::memcpy(gathered.row(i), x.row(wanted[i].first), H * sizeof(float));
  }
  if (c.layer_norms()) {
    LayerNorm(
        gathered.data(), wanted.size(), H, m.final_norm().data(),
        m.final_norm_bias().empty() ? nullptr : m.final_norm_bias().data(),
        c.norm_eps, ws_.logits_rows.data());
  } else {
    RmsNorm(gathered.data(), wanted.size(), H, m.final_norm().data(),
            c.norm_eps, ws_.logits_rows.data());
  }
  LINATTN_RETURN_IF_ERROR(m.lm_head().Apply(ws_.logits_rows.data(),
                                            static_cast<int64_t>(wanted.size()),
                                            ws_.logits_out.data()));
  for (size_t i = 0; i < wanted.size(); ++i) {
    std::memcpy(wanted[i].second, logits.row(i), V * sizeof(float));
  }
  for (const ForwardPiece& p : pieces) {
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

void ForwardRunner::ShortConvolution(const LayerPass& pass) {
  const std::span<const ForwardItem> items = pass.items;
  const std::span<const ForwardPiece> pieces = pass.pieces;
  const size_t l = pass.layer;
  const ModelConfig& c = model_->config();
  const Model::Layer& L = model_->layers()[l];
  const MixerColumns cols = MixerColumnsOf(c);
  const uint32_t C = c.conv_channels(), W = c.conv_size;
  const uint64_t keep = uint64_t{W - 1} * C;  // the window's floats
  const bool mamba = c.is_mamba2();
  const VectorKernels& kernels = ActiveKernels();
  const RowView<float> proj(ws_.proj.data(), ws_.capacity, cols.width);
  // y = Σ_j w_j·ws_.x{t+j} over the window's rows and then the input (in that
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
  for (const ForwardPiece& p : pieces) singles += p.rows == 1;
  ParallelFor(
      pieces.size(), singles * C * W >= kParallelFloats, [&](uint64_t i) {
        const ForwardPiece& p = pieces[i];
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
  for (const ForwardPiece& p : pieces) {
    if (p.rows == 1) continue;
    // ext: the window's W − 1 rows, then the piece's inputs.
    const RowView<float> ext(ws_.conv_ext.data(), uint64_t{p.rows} + W - 1, C);
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

}  // namespace linattn
