// The chunkwise order of the rwkv7 rule (docs/design.md §1, "Chunkwise
// forms"): fla's chunk_dplr, the WY / UT representation of a diagonal-plus-
// low-rank transition, with a decay per key channel. Per head, a chunk of
// L ≤ C rows after a state S; l_i is the cumulative log-gate vector of row i
// inside the chunk (l_{−1} = 0, every l ≤ 0 and falling), u_i = a_iᵀS_{i−1}
// the row the low-rank term reads. Unrolling S_i = diag(e^{g_i})S_{i−1} +
// b_i u_i + k_i v_iᵀ inside the chunk:
//
//   S_i = diag(e^{l_i}) S + Σ_{j≤i} diag(e^{l_i − l_j}) (b_j u_j + k_j v_jᵀ)
//   u_i = (a_i ⊙ e^{l_{i−1}})ᵀS + Σ_{j<i} A_ab[i,j] u_j + A_ak[i,j] v_jᵀ
//   o_i = (q_i ⊙ e^{l_i})ᵀS + Σ_{j≤i} A_qb[i,j] u_j + A_qk[i,j] v_jᵀ
//
// with A_xy[i,j] = Σ_c x_ic y_jc e^{l_{i',c} − l_{j,c}} (i' = i for the
// rows of q, i − 1 for those of a). In matrices, T = (I − A_ab)⁻¹:
//
//   W = T (A ⊙ e^{l_{i−1}}),   U = T (A_ak V) + W S
//   O = (Q ⊙ e^{l}) S + A_qk V + A_qb U
//   S ← diag(e^{l_L}) S + (K ⊙ e^{l_L − l})ᵀ V + (B ⊙ e^{l_L − l})ᵀ U
//
// The scores are made in row blocks of kRwkv7ScoreBlock rows. Block I
// starting at row r is one product over every job of the round,
// [Q_I ⊙ e^{l − l_{r−1}}; A_I ⊙ e^{l_{−1} − l_{r−1}}] ·
// [K_{<r+R} ⊙ e^{l_{r−1} − l}; B_{<r+R} ⊙ e^{l_{r−1} − l}]ᵀ: the rows'
// exponents and the earlier columns' are ≤ 0, the block's own columns'
// at most the span of its gates, and the two factors of a term multiply to
// its own e^{l_{i'} − l_j}. A job's block whose gates span more than
// kGateSubChunkSpan (factors up to e^8) takes its own columns term by term
// with e^{l_{i−1} − l_j} ≤ 1 instead, so no factor exceeds e^8 whatever the
// gates (a gate of −200 only makes terms that are 0 anyway). Which way a
// block goes depends on its own gates only: a job's results depend on its
// own rows, not on the other sessions of its round (unlike the gated
// rule's blocks, whose size the round chooses).
//
// The products run as batched oneDNN matmuls over every (session, head,
// chunk) of a round; the two that carry the state (U ← U + W S and the
// state update) run over every (session, head) at each chunk index in
// turn, as the delta rules' do, and the read-out over every job at once.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/attention/chunkwise.h"
#include "core/attention/chunkwise_workspaces.h"
#include "core/attention/kernels.h"
#include "core/util/status_macros.h"

namespace linattn {

namespace {

// Jobs per round at most (a round holds at least one chunk of every stream).
constexpr uint64_t kRwkv7JobsPerRound = 64;
// Rows per block of the intra-chunk scores.
constexpr uint64_t kRwkv7ScoreBlock = 16;

// x ← x ⊙ e^{e} for n channels; e is overwritten (every e ≤ 0).
void ScaleByExp(const VectorKernels& kernels, uint32_t n, float* e,
                const float* x, float* out) {
  kernels.exp_shifted(n, 0.0f, 1.0f, e);
  for (uint32_t c = 0; c < n; ++c) out[c] = x[c] * e[c];
}

}  // namespace

uint64_t ChunkwiseRunner::Rwkv7WorkspaceBytesPerJob(uint32_t d_k,
                                                    uint32_t d_v) const {
  const uint64_t C = options_.chunk_size, K = d_k, V = d_v;
  const uint64_t R = std::min(kRwkv7ScoreBlock, C);
  return sizeof(float) * (C * (9 * K + 4 * V + 4 * C) + 2 * R * K + 2 * C * K +
                          4 * R * C + K * (2 * V + 1)) +
         sizeof(double) * C * K + 1 + (C + R - 1) / R;
}

absl::Status ChunkwiseRunner::RunRwkv7Group(
    std::span<const PrefillItem> items, std::span<AttentionState* const> work,
    const std::vector<uint32_t>& members, std::span<uint8_t> non_finite,
    bool stop_at_non_finite) {
  if (rwkv7_ == nullptr) rwkv7_ = std::make_unique<Rwkv7Workspace>();
  Rwkv7Workspace& ws = *rwkv7_;
  // Run groups members by widths, head count and the preparation of q and
  // k: one spec stands for all.
  const AttentionSpec& spec = items[members[0]].attention->spec();
  const uint32_t K = spec.key_dim, V = spec.value_dim, H = spec.num_heads;
  const uint64_t C = options_.chunk_size;
  const uint64_t R = std::min(kRwkv7ScoreBlock, C);

  // Shapes, gates, a and b were checked by Run; q, k and v are checked row
  // by row as the gather reads them. A member with a value that is not
  // finite is marked (Run names it) and its jobs run on: its rows meet only
  // its own in the batched products.
  std::vector<RuleStream> streams;
  uint64_t longest = 0;
  for (uint32_t i : members) {
    for (uint32_t h = 0; h < H; ++h) streams.push_back({i, h});
    longest = std::max(longest, items[i].in.tokens);
  }
  if (streams.empty()) return absl::OkStatus();
  const uint64_t n_s = streams.size();
  const uint64_t total_chunks = (longest + C - 1) / C;
  const uint64_t per_round =
      std::clamp<uint64_t>(kRwkv7JobsPerRound / n_s, 1,
                           std::max<uint32_t>(1, options_.round_chunks));

  const uint64_t S_floats = uint64_t{K} * V;
  ws.s.EnsureSize(n_s * S_floats);
  for (uint64_t st = 0; st < n_s; ++st) {
    std::memcpy(ws.s.data() + st * S_floats,
                work[streams[st].item]->s(streams[st].head),
                S_floats * sizeof(float));
  }
  const uint64_t max_jobs = n_s * std::min(per_round, total_chunks);
  for (AlignedBuffer* buffer : {&ws.q, &ws.k, &ws.a, &ws.b, &ws.qt, &ws.wt,
                                &ws.w, &ws.kbar, &ws.bbar}) {
    buffer->EnsureSize(max_jobs * C * K);
  }
  for (AlignedBuffer* buffer : {&ws.v, &ws.x, &ws.u, &ws.o}) {
    buffer->EnsureSize(max_jobs * C * V);
  }
  for (AlignedBuffer* buffer : {&ws.aqk, &ws.aqb, &ws.aak, &ws.t}) {
    buffer->EnsureSize(max_jobs * C * C);
  }
  ws.end.EnsureSize(max_jobs * K);
  ws.lhs.EnsureSize(max_jobs * 2 * R * K);
  ws.rhs.EnsureSize(max_jobs * 2 * C * K);
  ws.prod.EnsureSize(max_jobs * 4 * R * C);
  ws.ds.EnsureSize(max_jobs * S_floats);
  if (ws.l.size() < max_jobs * C * K) ws.l.resize(max_jobs * C * K);
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

    // Gather: prepared q and k, a, b, v and the cumulative log-gates. A
    // unit is one member's chunk, all heads: the caller's (token, head)
    // rows are read in order, each once. Rows past the end are zero and
    // keep the last log-gates.
    const int64_t units = jobs / H;
#pragma omp parallel for schedule(static)
    for (int64_t unit = 0; unit < units; ++unit) {
      const int64_t j0 = unit * H;
      const SequenceInput& in = items[streams[j0 % n_s].item].in;
      uint64_t start = 0;
      const uint64_t L = rows_of(j0, &start);
      bool bad = false;
      for (uint64_t i = 0; i < C; ++i) {
        for (uint32_t h = 0; h < H; ++h) {
          const uint64_t at = (uint64_t(j0) + h) * C + i;
          float* q = ws.q.data() + at * K;
          float* k = ws.k.data() + at * K;
          float* a = ws.a.data() + at * K;
          float* b = ws.b.data() + at * K;
          float* v = ws.v.data() + at * V;
          double* l = ws.l.data() + at * K;
          if (i < L) {
            const uint64_t row = (start + i) * H + h;
            bad |= !kernels.all_finite(K, in.q + row * K) ||
                   !kernels.all_finite(K, in.k + row * K) ||
                   !kernels.all_finite(V, in.v + row * V);
            PrepareQueryKey(spec, kernels, in.q + row * K, in.k + row * K, q,
                            k);
            std::memcpy(a, in.a + row * K, K * sizeof(float));
            std::memcpy(b, in.b + row * K, K * sizeof(float));
            std::memcpy(v, in.v + row * V, V * sizeof(float));
            const float* g = in.g + row * K;
            const double* prev = l - K;  // the row before (i > 0)
            for (uint32_t c = 0; c < K; ++c) {
              l[c] = (i == 0 ? 0.0 : prev[c]) + static_cast<double>(g[c]);
            }
          } else {
            std::fill(q, q + K, 0.0f);
            std::fill(k, k + K, 0.0f);
            std::fill(a, a + K, 0.0f);
            std::fill(b, b + K, 0.0f);
            std::fill(v, v + V, 0.0f);
            const double* prev = l - K;
            for (uint32_t c = 0; c < K; ++c) l[c] = i == 0 ? 0.0 : prev[c];
          }
        }
      }
      for (uint32_t h = 0; h < H; ++h) ws.bad[j0 + h] = bad;
    }
    for (int64_t j = 0; j < jobs; ++j) {
      if (!ws.bad[j]) continue;
      non_finite[streams[j % n_s].item] = 1;
      if (stop_at_non_finite) return absl::OkStatus();
    }

    // The rows scaled to the chunk's start and end: q ⊙ e^{l_i},
    // a ⊙ e^{l_{i−1}}, k and b ⊙ e^{l_L − l_i}, and e^{l_L}.
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < jobs; ++j) {
      const double* l = ws.l.data() + j * C * K;
      const double* l_end = l + (C - 1) * K;
      std::vector<float> e(K);
      float* end = ws.end.data() + j * K;
      for (uint32_t c = 0; c < K; ++c) end[c] = static_cast<float>(l_end[c]);
      kernels.exp_shifted(K, 0.0f, 1.0f, end);
      for (uint64_t i = 0; i < C; ++i) {
        const uint64_t at = (j * C + i) * K;
        const double* li = l + i * K;
        for (uint32_t c = 0; c < K; ++c) e[c] = static_cast<float>(li[c]);
        ScaleByExp(kernels, K, e.data(), ws.q.data() + at, ws.qt.data() + at);
        const double* before = li - K;  // l_{i−1} (i > 0)
        for (uint32_t c = 0; c < K; ++c) {
          e[c] = i == 0 ? 0.0f : static_cast<float>(before[c]);
        }
        ScaleByExp(kernels, K, e.data(), ws.a.data() + at, ws.wt.data() + at);
        for (uint32_t c = 0; c < K; ++c) {
          e[c] = static_cast<float>(l_end[c] - li[c]);
        }
        kernels.exp_shifted(K, 0.0f, 1.0f, e.data());
        for (uint32_t c = 0; c < K; ++c) {
          ws.kbar.data()[at + c] = ws.k.data()[at + c] * e[c];
          ws.bbar.data()[at + c] = ws.b.data()[at + c] * e[c];
        }
      }
    }

    // The scores, row block by row block over every job at once (the file
    // comment); a job's block whose gates span more than kGateSubChunkSpan
    // takes its own columns term by term below.
    const uint64_t blocks = (C + R - 1) / R;
    if (ws.slow.size() < uint64_t(jobs) * blocks) {
      ws.slow.resize(uint64_t(jobs) * blocks);
    }
    for (uint64_t r = 0; r < C; r += R) {
      const uint64_t rows = std::min(R, C - r), cols = r + rows;
#pragma omp parallel for schedule(static)
      for (int64_t j = 0; j < jobs; ++j) {
        const double* l = ws.l.data() + j * C * K;
        std::vector<double> ref(K, 0.0);  // l_{r−1}
        if (r > 0) std::copy(l + (r - 1) * K, l + r * K, ref.begin());
        double span = 0;
        for (uint32_t c = 0; c < K; ++c) {
          span = std::max(span, ref[c] - l[(cols - 1) * K + c]);
        }
        const bool slow = span > kGateSubChunkSpan;
        ws.slow[j * blocks + r / R] = slow;
        float* lhs = ws.lhs.data() + j * 2 * rows * K;
        float* rhs = ws.rhs.data() + j * 2 * cols * K;
        std::vector<float> e(K);
        for (uint64_t i = 0; i < rows; ++i) {
          const uint64_t at = (j * C + r + i) * K;
          const double* li = l + (r + i) * K;
          for (uint32_t c = 0; c < K; ++c) {
            e[c] = static_cast<float>(li[c] - ref[c]);
          }
          ScaleByExp(kernels, K, e.data(), ws.q.data() + at, lhs + i * K);
          const double* before = li - K;  // l_{i−1}; 0 before the chunk
          for (uint32_t c = 0; c < K; ++c) {
            e[c] = r + i == 0 ? 0.0f : static_cast<float>(before[c] - ref[c]);
          }
          ScaleByExp(kernels, K, e.data(), ws.a.data() + at,
                     lhs + (rows + i) * K);
        }
        // Columns before the block: exponents ≤ 0; its own: in [0, span].
        const uint64_t scaled = slow ? r : cols;
        for (uint64_t jj = 0; jj < scaled; ++jj) {
          const uint64_t at = (j * C + jj) * K;
          const double* lj = l + jj * K;
          for (uint32_t c = 0; c < K; ++c) {
            e[c] = static_cast<float>(ref[c] - lj[c]);
          }
          kernels.exp_shifted(K, 0.0f, 1.0f, e.data());
          for (uint32_t c = 0; c < K; ++c) {
            rhs[jj * K + c] = ws.k.data()[at + c] * e[c];
            rhs[(cols + jj) * K + c] = ws.b.data()[at + c] * e[c];
          }
        }
        std::fill(rhs + scaled * K, rhs + cols * K, 0.0f);
        std::fill(rhs + (cols + scaled) * K, rhs + 2 * cols * K, 0.0f);
      }
      LINATTN_RETURN_IF_ERROR(Gemm({.m = static_cast<int64_t>(2 * rows),
                                    .k = K,
                                    .n = static_cast<int64_t>(2 * cols),
                                    .transpose_b = true},
                                   jobs, ws.lhs.data(), ws.rhs.data(),
                                   ws.prod.data()));
      // Rows r + i: A_qk, A_qb up to the diagonal, A_ak, −A_ab below it,
      // zeros past (a slow block: the columns before it only).
#pragma omp parallel for schedule(static)
      for (int64_t j = 0; j < jobs; ++j) {
        const bool slow = ws.slow[j * blocks + r / R];
        const float* p = ws.prod.data() + j * 4 * rows * cols;
        for (uint64_t i = 0; i < rows; ++i) {
          const uint64_t row = (j * C + r + i) * C;
          const float* pq = p + i * 2 * cols;
          const float* pa = p + (rows + i) * 2 * cols;
          const uint64_t q_cols = slow ? r : r + i + 1;
          const uint64_t a_cols = slow ? r : r + i;
          float* aqk = ws.aqk.data() + row;
          float* aqb = ws.aqb.data() + row;
          float* aak = ws.aak.data() + row;
          float* t = ws.t.data() + row;
          std::copy(pq, pq + q_cols, aqk);
          std::copy(pq + cols, pq + cols + q_cols, aqb);
          std::copy(pa, pa + a_cols, aak);
          for (uint64_t jj = 0; jj < a_cols; ++jj) t[jj] = -pa[cols + jj];
          std::fill(aqk + q_cols, aqk + C, 0.0f);
          std::fill(aqb + q_cols, aqb + C, 0.0f);
          std::fill(aak + a_cols, aak + C, 0.0f);
        }
      }
    }

    // A slow block's own columns term by term, e^{l_{i−1} − l_j} (≤ 1) for
    // both: q_i ⊙ e^{g_i} makes q's e^{l_i − l_j}. Then T = (I − A_ab)⁻¹.
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < jobs; ++j) {
      const double* l = ws.l.data() + j * C * K;
      const float* q = ws.q.data() + j * C * K;
      const float* k = ws.k.data() + j * C * K;
      const float* a = ws.a.data() + j * C * K;
      const float* b = ws.b.data() + j * C * K;
      float* aqk = ws.aqk.data() + j * C * C;
      float* aqb = ws.aqb.data() + j * C * C;
      float* aak = ws.aak.data() + j * C * C;
      float* t = ws.t.data() + j * C * C;
      std::vector<float> qg(K), e(std::max<uint64_t>(K, C)), ae(K), qe(K);
      for (uint64_t i = 0; i < C; ++i) {
        const uint64_t r = i / R * R;  // the row's block starts here
        if (!ws.slow[j * blocks + i / R]) continue;
        aqk[i * C + i] = kernels.dot(K, q + i * K, k + i * K);
        aqb[i * C + i] = kernels.dot(K, q + i * K, b + i * K);
        if (i == r) continue;
        const double* li = l + i * K;
        const double* before = li - K;  // i > r ≥ 0
        for (uint32_t c = 0; c < K; ++c) {
          e[c] = static_cast<float>(li[c] - before[c]);
        }
        ScaleByExp(kernels, K, e.data(), q + i * K, qg.data());
        for (uint64_t jj = r; jj < i; ++jj) {
          const double* lj = l + jj * K;
          for (uint32_t c = 0; c < K; ++c) {
            e[c] = static_cast<float>(before[c] - lj[c]);
          }
          kernels.exp_shifted(K, 0.0f, 1.0f, e.data());
          for (uint32_t c = 0; c < K; ++c) {
            ae[c] = a[i * K + c] * e[c];
            qe[c] = qg[c] * e[c];
          }
          aak[i * C + jj] = kernels.dot(K, ae.data(), k + jj * K);
          t[i * C + jj] = -kernels.dot(K, ae.data(), b + jj * K);
          aqk[i * C + jj] = kernels.dot(K, qe.data(), k + jj * K);
          aqb[i * C + jj] = kernels.dot(K, qe.data(), b + jj * K);
        }
      }
      kernels.unit_lower_inverse(static_cast<uint32_t>(C), t, e.data());
    }

    // W = T·(A ⊙ e^{l_{i−1}}); U = T·(A_ak·V), before the state's part.
    const int64_t Ci = static_cast<int64_t>(C);
    LINATTN_RETURN_IF_ERROR(Gemm({.m = Ci, .k = Ci, .n = K}, jobs, ws.t.data(),
                                 ws.wt.data(), ws.w.data()));
    LINATTN_RETURN_IF_ERROR(Gemm({.m = Ci, .k = Ci, .n = V}, jobs,
                                 ws.aak.data(), ws.v.data(), ws.x.data()));
    LINATTN_RETURN_IF_ERROR(Gemm({.m = Ci, .k = Ci, .n = V}, jobs, ws.t.data(),
                                 ws.x.data(), ws.u.data()));

    // Chunk by chunk, every stream at once: U ← U + W S, the slot ← S,
    // S ← diag(e^{l_L}) S + K̄ᵀV + B̄ᵀU.
    const int64_t batch = static_cast<int64_t>(n_s);
    float* ds = ws.ds.data();
    for (uint64_t ci = 0; ci < nc; ++ci) {
      const uint64_t first = ci * n_s;
      float* u = ws.u.data() + first * C * V;
      LINATTN_RETURN_IF_ERROR(
          Gemm({.m = Ci, .k = K, .n = V, .accumulate = true}, batch,
               ws.w.data() + first * C * K, ws.s.data(), u));
#pragma omp parallel for schedule(static)
      for (int64_t st = 0; st < batch; ++st) {
        float* state = ws.s.data() + st * S_floats;
        std::memcpy(ds + (first + st) * S_floats, state,
                    S_floats * sizeof(float));
        const float* end = ws.end.data() + (first + st) * K;
        for (uint32_t c = 0; c < K; ++c) {
          kernels.scale(V, end[c], state + uint64_t{c} * V);
        }
      }
      const MatmulShape update{
          .m = K, .k = Ci, .n = V, .transpose_a = true, .accumulate = true};
      LINATTN_RETURN_IF_ERROR(Gemm(update, batch,
                                   ws.kbar.data() + first * C * K,
                                   ws.v.data() + first * C * V, ws.s.data()));
      LINATTN_RETURN_IF_ERROR(
          Gemm(update, batch, ws.bbar.data() + first * C * K, u, ws.s.data()));
    }
    // O = (Q ⊙ e^{l})·S_before + A_qk·V + A_qb·U.
    LINATTN_RETURN_IF_ERROR(
        Gemm({.m = Ci, .k = K, .n = V}, jobs, ws.qt.data(), ds, ws.o.data()));
    const MatmulShape intra{.m = Ci, .k = Ci, .n = V, .accumulate = true};
    LINATTN_RETURN_IF_ERROR(
        Gemm(intra, jobs, ws.aqk.data(), ws.v.data(), ws.o.data()));
    LINATTN_RETURN_IF_ERROR(
        Gemm(intra, jobs, ws.aqb.data(), ws.u.data(), ws.o.data()));

    ScatterRuleOutputs(spec, items, streams, c0, C, units, ws.o.data());
  }
  StoreRuleStates(streams, work, ws.s.data(), S_floats);
  return absl::OkStatus();
}

}  // namespace linattn
