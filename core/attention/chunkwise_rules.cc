// The chunkwise order of the gated, delta and rwkv6 rules (docs/design.md §1,
// "Chunkwise forms"). Per head, a chunk of L ≤ C rows after a state S, with
// b_i the cumulative log-gate of row i inside the chunk (summed in double;
// 0 without gates), Γ_ij = exp(b_i − b_j) for j ≤ i (0 above), and b_L the
// chunk's last:
//
//   gated:        O = (Q ⊙ e^{b}) S + (Q Kᵀ ⊙ Γ) V
//                 S ← diag(e^{b_L}) S + (K ⊙ e^{b_L − b})ᵀ V
//   rwkv6, read out before each token: the gated form with b_{i−1} in place
//   of b_i on the query side (b_{−1} = 0), Γ strictly lower, and row i's
//   diagonal entry its own term q_iᵀ(u ⊙ k_i):
//                 O = (Q ⊙ e^{b_{i−1}}) S + (Q Kᵀ ⊙ Γ' + diag(q_iᵀ(u ⊙ k_i))) V
//   (gated) delta, fla's WY / UT-transform form:
//                 T = (I + strict_lower(diag(β) K Kᵀ ⊙ Γ))⁻¹
//                 U = T (β ⊙ V),  W = T (β ⊙ e^{b} ⊙ K)
//                 U ← U − W S
//                 O = (Q ⊙ e^{b}) S + (Q Kᵀ ⊙ Γ) U
//                 S ← e^{b_L} S + (K ⊙ e^{b_L − b})ᵀ U
//
// Every exponent is ≤ 0, so no factor can overflow whatever the gates. With
// a gate per key channel Γ is not a matrix scaling of Q Kᵀ: the intra-chunk
// scores are computed in row blocks. Block I starting at row r is one
// product (Q_I ⊙ e^{b − b_{r−1}})(K_{≤I} ⊙ e^{b_{r−1} − b})ᵀ over all of
// the round's jobs (b_{−1} = 0): the columns before r have both exponents
// ≤ 0, and the block's own columns exponents in [0, kGateSubChunkSpan] when
// the gates' span inside the block allows. A round takes the largest block
// (the whole chunk, halved down to kGateSubChunk rows) within which every
// job's gates span at most that; a job's block that still spans more (one
// of kGateSubChunk rows, or a larger one whose halving does not nest) leaves
// its own columns out of the product and is done term by term with
// e^{b_ic − b_jc}. A whole-chunk block takes its keys as K̃ ⊙ e^{−b_L}
// (K̃ = K ⊙ e^{b_L − b}, e^{−b_L} ≤ e^τ). Keys are thus scaled by up to e^τ:
// a finite key above FLT_MAX/e^τ (~1e35) turns its scores infinite, and
// those outputs come back unavailable. Because the block is the round's,
// per-key results depend (within the error bound) on the other sessions
// of the round.
//
// The products run as batched oneDNN matmuls over every (session, head,
// chunk) of a round at once; the gated rule's states between chunks are an
// elementwise scan, as the linear rule's. The delta rules' U needs the state
// before its chunk, so their two state-carrying products (U ← U − W S and
// S ← e^{b_L} S + K̃ᵀU) run over every (session, head) at each chunk index in
// turn; each chunk's state before it is kept, and the read-out products run
// over every job at once afterwards.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/attention/chunkwise.h"
#include "core/attention/chunkwise_workspaces.h"
#include "core/attention/kernels.h"
#include "core/util/status_macros.h"

namespace linattn {

namespace {

// Jobs per round at most (a round holds at least one chunk of every stream).
constexpr uint64_t kRuleJobsPerRound = 256;

// rwkv6's own term of a row: Σ_c q_c·u_c·k_c, in the step kernel's order.
float BonusScore(const float* q, const float* k, const float* u, uint32_t K) {
  float own = 0.0f;
  for (uint32_t c = 0; c < K; ++c) own += q[c] * u[c] * k[c];
  return own;
}

}  // namespace

// Here, where the rules' workspaces are complete.
ChunkwiseRunner::ChunkwiseRunner(ChunkwiseOptions options)
    : options_(options) {}
ChunkwiseRunner::~ChunkwiseRunner() = default;
ChunkwiseRunner::ChunkwiseRunner(ChunkwiseRunner&&) noexcept = default;
ChunkwiseRunner& ChunkwiseRunner::operator=(ChunkwiseRunner&&) noexcept =
    default;

uint64_t ChunkwiseRunner::RuleWorkspaceBytesPerJob(uint32_t d_k,
                                                   uint32_t d_v) const {
  const uint64_t C = options_.chunk_size;
  return sizeof(float) * (C * (5 * uint64_t{d_k} + 3 * uint64_t{d_v} + 2 * C +
                               2 * uint64_t{d_k}) +
                          uint64_t{d_k} * (2 * uint64_t{d_v} + 1) +
                          C * (2 * uint64_t{d_k} + C)) +
         sizeof(uint64_t) + 2;  // block, slow and bad
}

absl::Status ChunkwiseRunner::RunRuleGroup(
    std::span<const PrefillItem> items, std::span<AttentionState* const> work,
    const std::vector<uint32_t>& members, std::span<uint8_t> non_finite,
    bool stop_at_non_finite) {
  if (rules_ == nullptr) rules_ = std::make_unique<RuleWorkspace>();
  RuleWorkspace& ws = *rules_;
  // Run groups members by rule, gate shape, widths, head count and the
  // preparation of q and k: one spec stands for all.
  const AttentionSpec& spec = items[members[0]].attention->spec();
  const bool delta = HasBeta(spec.rule);
  // rwkv6: the gated form read out before each token (the file comment).
  const bool before = ReadsBeforeUpdate(spec.rule);
  // A gate per key channel comes with the gated rule only (spec.cc refuses
  // it for the delta rules): kb, T and a scalar e^{b_L} serve those.
  const bool per_key = GatesPerHead(spec) > 1;
  const uint32_t gates = GatesPerHead(spec);
  const uint32_t G = per_key ? spec.key_dim : 1;  // b's width per row
  const uint32_t K = spec.key_dim, V = spec.value_dim;
  const uint64_t C = options_.chunk_size;

  // Shapes, gates and β were checked by Run; finiteness is checked row by
  // row as the gather reads the input. A member with a value that is not
  // finite is marked (Run names it) and its jobs run on: its rows meet only
  // its own in the batched products.
  // rwkv6: a stream's u (each item's own: the group shares shapes only).
  auto BonusOf = [](std::span<const PrefillItem> all, const RuleStream& st) {
    const AttentionSpec& own = all[st.item].attention->spec();
    return own.bonus.data() + uint64_t{st.head} * own.key_dim;
  };
  std::vector<RuleStream> streams;
  uint64_t longest = 0;
  for (uint32_t i : members) {
    for (uint32_t h = 0; h < spec.num_heads; ++h) streams.push_back({i, h});
    longest = std::max(longest, items[i].in.tokens);
  }
  if (streams.empty()) return absl::OkStatus();
  const uint64_t n_s = streams.size();
  const uint64_t total_chunks = (longest + C - 1) / C;
  const uint64_t per_round = std::clamp<uint64_t>(
      kRuleJobsPerRound / n_s, 1, std::max<uint32_t>(1, options_.round_chunks));

  const uint64_t S_floats = uint64_t{K} * V;
  ws.s.EnsureSize(n_s * S_floats);
  for (uint64_t st = 0; st < n_s; ++st) {
    std::memcpy(ws.s.data() + st * S_floats,
                work[streams[st].item]->s(streams[st].head),
                S_floats * sizeof(float));
  }
  const uint64_t max_jobs = n_s * std::min(per_round, total_chunks);
  ws.qh.EnsureSize(max_jobs * C * K);
  ws.kh.EnsureSize(max_jobs * C * K);
  ws.qt.EnsureSize(max_jobs * C * K);
  ws.kt.EnsureSize(max_jobs * C * K);
  ws.u.EnsureSize(max_jobs * C * V);
  ws.o.EnsureSize(max_jobs * C * V);
  ws.a.EnsureSize(max_jobs * C * C);
  ws.end.EnsureSize(max_jobs * G);
  ws.ds.EnsureSize(max_jobs * S_floats);
  if (per_key) {
    ws.qs.EnsureSize(max_jobs * C * K);
    ws.ks.EnsureSize(max_jobs * C * K);
    ws.sc.EnsureSize(max_jobs * C * C);
    if (ws.slow.size() < max_jobs) ws.slow.resize(max_jobs);
    if (ws.block.size() < max_jobs) ws.block.resize(max_jobs);
  }
  if (delta) {
    ws.kb.EnsureSize(max_jobs * C * K);
    ws.vb.EnsureSize(max_jobs * C * V);
    ws.t.EnsureSize(max_jobs * C * C);
  }
  if (ws.b.size() < max_jobs * C * G) ws.b.resize(max_jobs * C * G);
  if (ws.bad.size() < max_jobs) ws.bad.resize(max_jobs);
  const VectorKernels& kernels = ActiveKernels();

  for (uint64_t c0 = 0; c0 < total_chunks; c0 += per_round) {
    const uint64_t nc = std::min(per_round, total_chunks - c0);
    const int64_t jobs = static_cast<int64_t>(nc * n_s);
    // Job j is chunk c0 + j / n_s of stream j % n_s: the jobs of one chunk
    // index are contiguous, so the state-carrying products batch over
    // streams.
    auto rows_of = [&](int64_t j, uint64_t* start) {
      return RuleJobRows(items, streams, c0, C, j, start);
    };

    // Gather: prepared q and k, cumulative log-gates, scaled copies. A
    // unit is one member's chunk, all heads: the caller's (token, head)
    // rows are read in order, each once.
    const uint32_t H = spec.num_heads;
    const int64_t units = jobs / H;
#pragma omp parallel for schedule(static)
    for (int64_t unit = 0; unit < units; ++unit) {
      const int64_t j0 = unit * H;  // its heads' jobs: j0 .. j0 + H − 1
      const SequenceInput& in = items[streams[j0 % n_s].item].in;
      uint64_t start = 0;
      const uint64_t L = rows_of(j0, &start);
      std::vector<double> run(uint64_t{H} * G, 0.0);
      bool bad = false;
      for (uint64_t i = 0; i < C; ++i) {
        for (uint32_t h = 0; h < H; ++h) {
          const int64_t j = j0 + h;
          float* vrow = (delta ? ws.vb.data() : ws.u.data()) + (j * C + i) * V;
          double* bh = run.data() + uint64_t{h} * G;
          if (i < L) {
            const uint64_t row = (start + i) * H + h;
            bad |= !kernels.all_finite(K, in.q + row * K) ||
                   !kernels.all_finite(K, in.k + row * K) ||
                   !kernels.all_finite(V, in.v + row * V);
            PrepareQueryKey(spec, kernels, in.q + row * K, in.k + row * K,
                            ws.qh.data() + (j * C + i) * K,
                            ws.kh.data() + (j * C + i) * K);
            const float beta = delta ? in.beta[row] : 1.0f;
            for (uint32_t c = 0; c < V; ++c) {
              vrow[c] = beta * in.v[row * V + c];
            }
            for (uint32_t c = 0; gates != 0 && c < G; ++c) {
              bh[c] += static_cast<double>(in.g[row * gates + c]);
            }
          } else {
            std::fill(ws.qh.data() + (j * C + i) * K,
                      ws.qh.data() + (j * C + i + 1) * K, 0.0f);
            std::fill(ws.kh.data() + (j * C + i) * K,
                      ws.kh.data() + (j * C + i + 1) * K, 0.0f);
            std::fill(vrow, vrow + V, 0.0f);
            if (delta) {
              std::fill(ws.u.data() + (j * C + i) * V,
                        ws.u.data() + (j * C + i + 1) * V, 0.0f);
            }
          }
          std::copy(bh, bh + G, ws.b.data() + (j * C + i) * G);
        }
      }
      std::vector<float> up(G), down(G);
      for (uint32_t h = 0; h < H; ++h) {
        const int64_t j = j0 + h;
        ws.bad[j] = bad;
        const double* b = ws.b.data() + j * C * G;
        const float* qh = ws.qh.data() + j * C * K;
        const float* kh = ws.kh.data() + j * C * K;
        // b_L: the last real row's (padding rows keep it).
        const double* b_end = b + (C - 1) * G;
        float* end = ws.end.data() + j * G;
        for (uint32_t c = 0; c < G; ++c) end[c] = static_cast<float>(b_end[c]);
        kernels.exp_shifted(G, 0.0f, 1.0f, end);
        float* qt = ws.qt.data() + j * C * K;
        float* kt = ws.kt.data() + j * C * K;
        float* kb = delta ? ws.kb.data() + j * C * K : nullptr;
        // e^{b_i} and e^{b_L − b_i} per row: one exp each for a gate per
        // head, the vectorised exp over the channels for a gate per key
        // (every exponent ≤ 0).
        for (uint64_t i = 0; i < C; ++i) {
          const float beta =
              delta && i < L ? in.beta[(start + i) * H + h] : 0.0f;
          for (uint32_t c = 0; c < G; ++c) {
            const double b_read = !before  ? b[i * G + c]
                                  : i == 0 ? 0.0
                                           : b[(i - 1) * G + c];
            up[c] = static_cast<float>(b_read);
            down[c] = static_cast<float>(b_end[c] - b[i * G + c]);
          }
          kernels.exp_shifted(G, 0.0f, 1.0f, up.data());
          kernels.exp_shifted(G, 0.0f, 1.0f, down.data());
          if (per_key) {
            for (uint32_t c = 0; c < K; ++c) {
              qt[i * K + c] = qh[i * K + c] * up[c];
              kt[i * K + c] = kh[i * K + c] * down[c];
            }
          } else {
            const float u0 = up[0], d0 = down[0], w0 = -beta * up[0];
            for (uint32_t c = 0; c < K; ++c) {
              qt[i * K + c] = qh[i * K + c] * u0;
              kt[i * K + c] = kh[i * K + c] * d0;
            }
            for (uint32_t c = 0; delta && c < K; ++c) {
              kb[i * K + c] = w0 * kh[i * K + c];
            }
          }
        }
      }
    }
    for (int64_t j = 0; j < jobs; ++j) {
      if (!ws.bad[j]) continue;
      non_finite[streams[j % n_s].item] = 1;
      if (stop_at_non_finite) return absl::OkStatus();
    }

    // Intra-chunk scores A = Q Kᵀ ⊙ Γ (and K Kᵀ for the delta rules).
    const MatmulShape scores{.m = static_cast<int64_t>(C),
                             .k = K,
                             .n = static_cast<int64_t>(C),
                             .transpose_b = true};
    if (!per_key) {
      LINATTN_RETURN_IF_ERROR(
          Gemm(scores, jobs, ws.qh.data(), ws.kh.data(), ws.a.data()));
    }
    if (delta) {
      LINATTN_RETURN_IF_ERROR(
          Gemm(scores, jobs, ws.kh.data(), ws.kh.data(), ws.t.data()));
    }
    if (per_key) {
      // The row block: the largest every job allows. Block I starting at
      // row r refers to b_{r−1} (0 before the chunk), so within it the
      // keys' exponents reach b_{r−1} − b_{r+rows−1}.
#pragma omp parallel for schedule(static)
      for (int64_t j = 0; j < jobs; ++j) {
        const double* b = ws.b.data() + j * C * K;
        uint64_t size = C;
        for (;;) {
          double span = 0;
          for (uint64_t r = 0; r < C; r += size) {
            const double* last = b + (std::min(C, r + size) - 1) * K;
            for (uint32_t c = 0; c < K; ++c) {
              span =
                  std::max(span, (r == 0 ? 0.0 : b[(r - 1) * K + c]) - last[c]);
            }
          }
          if (span <= kGateSubChunkSpan || size <= kGateSubChunk) break;
          size = std::max<uint64_t>(kGateSubChunk, (size + 1) / 2);
        }
        ws.block[j] = size;
      }
      const uint64_t block =
          *std::min_element(ws.block.begin(), ws.block.begin() + jobs);
      // Block by block, every job at once: qs = Q_I ⊙ e^{b − b_{r−1}} (for
      // the first block that is q̃ = Q ⊙ e^{b}, already made) and
      // ks = K_{<r+rows} ⊙ e^{b_{r−1} − b}, their product, then the rows
      // into A (the file comment). A whole-chunk block writes A directly.
      for (uint64_t r = 0; r < C; r += block) {
        const uint64_t rows = std::min<uint64_t>(block, C - r);
        const uint64_t cols = r + rows;
        const bool whole = rows == C;
#pragma omp parallel for schedule(static)
        for (int64_t j = 0; j < jobs; ++j) {
          const double* b = ws.b.data() + j * C * K;
          const double* bref = r == 0 ? nullptr : b + (r - 1) * K;
          const float* qh = ws.qh.data() + j * C * K;
          const float* kh = ws.kh.data() + j * C * K;
          float* qs = ws.qs.data() + j * rows * K;
          float* ks = ws.ks.data() + j * cols * K;
          auto ref = [&](uint32_t c) { return bref ? bref[c] : 0.0; };
          double span = 0;
          for (uint32_t c = 0; c < K; ++c) {
            span = std::max(span, ref(c) - b[(cols - 1) * K + c]);
          }
          const bool slow = span > kGateSubChunkSpan;
          ws.slow[j] = slow;
          for (uint64_t i = 0; r > 0 && i < rows; ++i) {
            float* e = qs + i * K;
            const double* b_read = b + (r + i - (before ? 1 : 0)) * K;
            for (uint32_t c = 0; c < K; ++c) {
              e[c] = static_cast<float>(b_read[c] - ref(c));
            }
            kernels.exp_shifted(K, 0.0f, 1.0f, e);
            for (uint32_t c = 0; c < K; ++c) e[c] *= qh[(r + i) * K + c];
          }
          if (whole && !slow) {
            // K ⊙ e^{−b} = K̃ ⊙ e^{−b_L}: one exp per channel, e^{−b_L} ≤ e^τ.
            float* inv = qs;  // unused by a whole block
            const double* b_end = b + (C - 1) * K;
            for (uint32_t c = 0; c < K; ++c) {
              inv[c] = static_cast<float>(-b_end[c]);
            }
            kernels.exp_shifted(K, 0.0f, 1.0f, inv);
            const float* kt = ws.kt.data() + j * C * K;
            for (uint64_t jj = 0; jj < C; ++jj) {
              for (uint32_t c = 0; c < K; ++c) {
                ks[jj * K + c] = kt[jj * K + c] * inv[c];
              }
            }
            continue;
          }
          const uint64_t scaled = slow ? r : cols;
          for (uint64_t jj = 0; jj < scaled; ++jj) {
            float* e = ks + jj * K;
            for (uint32_t c = 0; c < K; ++c) {
              e[c] = static_cast<float>(ref(c) - b[jj * K + c]);
            }
            kernels.exp_shifted(K, 0.0f, 1.0f, e);
            for (uint32_t c = 0; c < K; ++c) e[c] *= kh[jj * K + c];
          }
          std::fill(ks + scaled * K, ks + cols * K, 0.0f);
        }
        // The first block's rows of Q ⊙ e^{b} sit in q̃ with a stride of C
        // rows per job: as one product only when the block is the chunk.
        const float* lhs = ws.qs.data();
        if (r == 0 && whole) lhs = ws.qt.data();
        if (r == 0 && !whole) {
#pragma omp parallel for schedule(static)
          for (int64_t j = 0; j < jobs; ++j) {
            std::memcpy(ws.qs.data() + j * rows * K, ws.qt.data() + j * C * K,
                        rows * K * sizeof(float));
          }
        }
        float* product = whole ? ws.a.data() : ws.sc.data();
        LINATTN_RETURN_IF_ERROR(Gemm({.m = static_cast<int64_t>(rows),
                                      .k = K,
                                      .n = static_cast<int64_t>(cols),
                                      .transpose_b = true},
                                     jobs, lhs, ws.ks.data(), product));
#pragma omp parallel for schedule(static)
        for (int64_t j = 0; j < jobs; ++j) {
          const double* b = ws.b.data() + j * C * K;
          const float* qh = ws.qh.data() + j * C * K;
          const float* kh = ws.kh.data() + j * C * K;
          const float* sc = product + j * rows * cols;
          float* a = ws.a.data() + j * C * C;
          const float* u = before ? BonusOf(items, streams[j % n_s]) : nullptr;
          std::vector<float> e, qk;
          for (uint64_t i = 0; i < rows; ++i) {
            float* arow = a + (r + i) * C;
            // Columns up to the row's own (rwkv6: before it).
            const uint64_t last = r + i + (before ? 0 : 1);
            if (!whole) std::copy(sc + i * cols, sc + i * cols + last, arow);
            std::fill(arow + last, arow + C, 0.0f);
            if (ws.slow[j] && last > r) {
              // The diagonal block, term by term: Σ_c q_c k_c e^{b_ic − b_jc}
              // (rwkv6: b_{i−1}; its block's first row has no such column).
              e.resize(K);
              qk.resize(K);
              const double* b_read = b + (last - 1) * K;
              for (uint64_t jj = r; jj < last; ++jj) {
                for (uint32_t c = 0; c < K; ++c) {
                  e[c] = static_cast<float>(b_read[c] - b[jj * K + c]);
                  qk[c] = qh[(r + i) * K + c] * kh[jj * K + c];
                }
                kernels.exp_shifted(K, 0.0f, 1.0f, e.data());
                arow[jj] = kernels.dot(K, qk.data(), e.data());
              }
            }
            // rwkv6's own term: Σ_c q_c u_c k_c.
            if (before)
              arow[r + i] =
                  BonusScore(qh + (r + i) * K, kh + (r + i) * K, u, K);
          }
        }
      }
    } else {
      // Γ row by row (one vectorised exp per row), on the scores and, for
      // the delta rules, on M = diag(β) K Kᵀ below the diagonal; for the
      // delta rules then T = (I + M)⁻¹.
#pragma omp parallel for schedule(static)
      for (int64_t j = 0; j < jobs; ++j) {
        const double* b = ws.b.data() + j * C;
        float* a = ws.a.data() + j * C * C;
        float* t = delta ? ws.t.data() + j * C * C : nullptr;
        const RuleStream& st = streams[j % n_s];
        const SequenceInput& in = items[st.item].in;
        uint64_t start = 0;
        const uint64_t L = rows_of(j, &start);
        std::vector<float> e(C);
        for (uint64_t i = 0; i < C; ++i) {
          // rwkv6 (here with d_k = 1): Γ_ij = e^{b_{i−1} − b_j} below the
          // diagonal, its own term on it.
          const double b_read = !before ? b[i] : i == 0 ? 0.0 : b[i - 1];
          for (uint64_t jj = 0; jj <= i; ++jj) {
            e[jj] = static_cast<float>(b_read - b[jj]);
          }
          kernels.exp_shifted(static_cast<uint32_t>(i + 1), 0.0f, 1.0f,
                              e.data());
          float* arow = a + i * C;
          for (uint64_t jj = 0; jj <= i; ++jj) arow[jj] *= e[jj];
          std::fill(arow + i + 1, arow + C, 0.0f);
          if (before) {
            const float* qh = ws.qh.data() + j * C * K;
            const float* kh = ws.kh.data() + j * C * K;
            arow[i] = BonusScore(qh + i * K, kh + i * K, BonusOf(items, st), K);
          }
          if (delta) {
            const float beta =
                i < L ? in.beta[(start + i) * spec.num_heads + st.head] : 0.0f;
            float* trow = t + i * C;
            for (uint64_t jj = 0; jj < i; ++jj) trow[jj] *= beta * e[jj];
          }
        }
        if (!delta) continue;
        // T = (I + M)⁻¹ by forward substitution as fla does.
        kernels.unit_lower_inverse(static_cast<uint32_t>(C), t, e.data());
      }
    }
    if (delta) {
      // U = T (β ⊙ V); W' = T (−β ⊙ e^{b} ⊙ K) = −W.
      const MatmulShape tv{
          .m = static_cast<int64_t>(C), .k = static_cast<int64_t>(C), .n = V};
      LINATTN_RETURN_IF_ERROR(
          Gemm(tv, jobs, ws.t.data(), ws.vb.data(), ws.u.data()));
      const MatmulShape tk{
          .m = static_cast<int64_t>(C), .k = static_cast<int64_t>(C), .n = K};
      // kb is both input and output: the product goes to qh's slots, which
      // the scores no longer need, and becomes −W there.
      LINATTN_RETURN_IF_ERROR(
          Gemm(tk, jobs, ws.t.data(), ws.kb.data(), ws.qh.data()));
    }

    // The read-out needs the state before each chunk only: each job's
    // slot receives it, and O = Q̃·S_before + A·U runs for every job at once
    // afterwards. The gated rule: ΔS = K̃ᵀV for every job at once and a
    // scan of the states along each stream. The delta rules' U depends on
    // the state: chunk by chunk, every stream at once, only U ← U − W S and
    // S ← e^{b_L}·S + K̃ᵀU carry.
    float* ds = ws.ds.data();
    if (!delta) {
      LINATTN_RETURN_IF_ERROR(Gemm(
          {.m = K, .k = static_cast<int64_t>(C), .n = V, .transpose_a = true},
          jobs, ws.kt.data(), ws.u.data(), ds));
      // (S, ΔS_c) ← (e^{b_L}·S + ΔS_c, S): each job's slot then holds the
      // state before its chunk, and the stream's S the state after all.
#pragma omp parallel for schedule(static)
      for (int64_t st = 0; st < static_cast<int64_t>(n_s); ++st) {
        float* state = ws.s.data() + st * S_floats;
        for (uint64_t ci = 0; ci < nc; ++ci) {
          const uint64_t j = ci * n_s + st;
          const float* end = ws.end.data() + j * G;
          float* slot = ds + j * S_floats;
          if (per_key) {
            for (uint32_t c = 0; c < K; ++c) {
              kernels.scan_step(V, end[c], state + uint64_t{c} * V,
                                slot + uint64_t{c} * V);
            }
          } else {
            kernels.scan_step(S_floats, end[0], state, slot);
          }
        }
      }
    }
    const int64_t batch = static_cast<int64_t>(n_s);
    const bool decays = gates != 0;
    for (uint64_t ci = 0; delta && ci < nc; ++ci) {
      const uint64_t first = ci * n_s;
      float* u = ws.u.data() + first * C * V;
      // U ← U − W S
      LINATTN_RETURN_IF_ERROR(Gemm(
          {.m = static_cast<int64_t>(C), .k = K, .n = V, .accumulate = true},
          batch, ws.qh.data() + first * C * K, ws.s.data(), u));
      // The slot ← S; S ← e^{b_L}·S (gated delta; e^{0} = 1 otherwise).
#pragma omp parallel for schedule(static)
      for (int64_t st = 0; st < batch; ++st) {
        float* state = ws.s.data() + st * S_floats;
        std::memcpy(ds + (first + st) * S_floats, state,
                    S_floats * sizeof(float));
        if (decays) kernels.scale(S_floats, ws.end.data()[first + st], state);
      }
      // S ← S + K̃ᵀU
      LINATTN_RETURN_IF_ERROR(Gemm({.m = K,
                                    .k = static_cast<int64_t>(C),
                                    .n = V,
                                    .transpose_a = true,
                                    .accumulate = true},
                                   batch, ws.kt.data() + first * C * K, u,
                                   ws.s.data()));
    }
    LINATTN_RETURN_IF_ERROR(Gemm({.m = static_cast<int64_t>(C), .k = K, .n = V},
                                 jobs, ws.qt.data(), ds, ws.o.data()));
    LINATTN_RETURN_IF_ERROR(Gemm({.m = static_cast<int64_t>(C),
                                  .k = static_cast<int64_t>(C),
                                  .n = V,
                                  .accumulate = true},
                                 jobs, ws.a.data(), ws.u.data(), ws.o.data()));

    ScatterRuleOutputs(spec, items, streams, c0, C, units, ws.o.data());
  }
  StoreRuleStates(streams, work, ws.s.data(), S_floats);
  return absl::OkStatus();
}

void ScatterRuleOutputs(const AttentionSpec& spec,
                        std::span<const PrefillItem> items,
                        std::span<const RuleStream> streams, uint64_t c0,
                        uint64_t C, int64_t units, const float* o) {
  const uint32_t H = spec.num_heads, V = spec.value_dim;
  const uint64_t n_s = streams.size();
#pragma omp parallel for schedule(static)
  for (int64_t unit = 0; unit < units; ++unit) {
    const int64_t j0 = unit * H;
    const SequenceOutput& out = items[streams[j0 % n_s].item].out;
    uint64_t start = 0;
    const uint64_t L = RuleJobRows(items, streams, c0, C, j0, &start);
    for (uint64_t i = 0; i < L; ++i) {
      for (uint32_t h = 0; h < H; ++h) {
        const uint64_t row = (start + i) * H + h;
        float* y = out.output + row * V;
        std::memcpy(y, o + ((j0 + h) * C + i) * V, V * sizeof(float));
        linattn::ReadOut(spec, 0.0f, 0.0f, V, y, out.denominator + row,
                         out.available + row);
      }
    }
  }
}

void StoreRuleStates(std::span<const RuleStream> streams,
                     std::span<AttentionState* const> work, const float* s,
                     uint64_t state_floats) {
  for (uint64_t st = 0; st < streams.size(); ++st) {
    std::memcpy(work[streams[st].item]->s(streams[st].head),
                s + st * state_floats, state_floats * sizeof(float));
  }
}

}  // namespace linattn
