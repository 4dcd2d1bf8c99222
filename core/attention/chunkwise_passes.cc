// ChunkwiseRunner's passes over a round's units (chunkwise.h): the gather
// (φ and the finiteness check in one pass over the caller's rows), the
// products within and across chunks, the state's scan, the read-out.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/attention/chunkwise_round.h"
#include "core/attention/kernels.h"
#include "core/util/status_macros.h"

namespace linattn {

void ChunkwiseRunner::RoundInputs(const Round& r, uint32_t j) const {
  const VectorKernels& kernels = ActiveKernels();
  const uint64_t C = options_.chunk_size;
  const uint64_t qk = C * r.d_phi;
  kernels.to_bf16(qk, r.q.block(j).data(), r.q16.block(j).data());
  kernels.to_bf16(qk, r.k.block(j).data(), r.k16.block(j).data());
  if (r.any_decay) {
    kernels.to_bf16(qk, r.kd.block(j).data(), r.kd16.block(j).data());
  }
  kernels.to_bf16(C * r.d_v, r.v.block(j).data(), r.v16.block(j).data());
}

// Gather and map one unit (an item's chunk, all its heads), token-major so
// the caller's (token, head, d) rows are read contiguously, each once from
// memory, and checked for finiteness as it is read (the one check a
// prefill's input gets: a bad value marks the unit, and Run names it):
// ELU+1's pass over q and k rows and the copy of v rows are the check, the
// other maps check a row next to φ. FAVOR+
// keys get their exponents only, their shift depending on the whole round;
// other keys are finished here, still in cache. Padding rows are zero.
void ChunkwiseRunner::GatherUnit(Round& r, int64_t u, const UnitBlocks& b) {
  const uint32_t C = options_.chunk_size;
  const int64_t d_phi = r.d_phi, d_v = r.d_v;
  const auto [first_stream, chunk] = r.units[u];
  const PrefillItem& item = r.item_of(r.streams[first_stream]);
  const FeatureMap& fm = item.attention->feature_map();
  const uint32_t H = item.attention->num_heads();
  const uint32_t d_k = item.attention->key_dim();
  const uint64_t position0 = r.work[r.streams[first_stream].item]->position();
  const RowView<const float> q = TokenRows(item.in.q, item.in.tokens, H, d_k);
  const RowView<const float> k = TokenRows(item.in.k, item.in.tokens, H, d_k);
  const RowView<const float> v = TokenRows(item.in.v, item.in.tokens, H, d_v);
  const uint32_t j0 = r.streams[first_stream].job(chunk);
  const VectorKernels& kernels = ActiveKernels();
  bool finite = true;
  for (uint32_t t = 0; t < C; ++t) {
    for (uint32_t h = 0; h < H; ++h) {
      const uint32_t j = j0 + h;
      Job& job = r.jobs[j];
      float* qrow = r.q.row(j, t);
      float* krow = b.k + (h * C + t) * d_phi;
      float* vrow = b.v + (h * C + t) * d_v;
      if (t >= job.len) {
        std::memset(qrow, 0, d_phi * sizeof(float));
        std::memset(krow, 0, d_phi * sizeof(float));
        std::memset(vrow, 0, d_v * sizeof(float));
        r.qlog(j, t) = 0.0f;
        continue;
      }
      const uint64_t token = job.start + t;
      const uint64_t row = token * H + h;
      // Each input row checked as it is read, no second pass: q and k by
      // ELU+1's pass over them (other maps check next to φ, FAVOR+ keys
      // right after their exponents), v by its copy.
      bool q_finite = true, k_finite = true;
      r.qlog(j, t) = fm.Apply(q.row(row), position0 + token, qrow, &q_finite);
      if (fm.is_favor()) {
        job.key_max = std::max(job.key_max, fm.Exponents(k.row(row), krow));
        k_finite = kernels.all_finite(d_k, k.row(row));
      } else {
        fm.Apply(k.row(row), position0 + token, krow, &k_finite);
      }
      finite &=
          kernels.copy_finite(d_v, v.row(row), vrow) && q_finite && k_finite;
    }
  }
  unit_bad_[u] = !finite;
  if (!fm.is_favor()) {
    for (uint32_t h = 0; h < H; ++h) {
      FinishKeys(r, j0 + h, b.k + h * C * d_phi, b.kd + h * C * d_phi);
    }
  }
}

void ChunkwiseRunner::MarkNonFinite(const Round& r,
                                    std::span<uint8_t> non_finite) const {
  for (size_t u = 0; u < r.units.size(); ++u) {
    if (unit_bad_[u]) non_finite[r.streams[r.units[u].first].item] = 1;
  }
}

// One chunk's keys, left as (C, d_φ) rows (the matmuls read them
// transposed through strides): Δz = Σ_j γ^{L−1−j} φ(k_j) and, with decay,
// the decayed keys for ΔS. The block stays in L1 throughout.
void ChunkwiseRunner::FinishKeys(const Round& r, uint32_t j,
                                 const float* k_block, float* kd_block) const {
  const uint32_t C = options_.chunk_size;
  const Job& job = r.jobs[j];
  const Stream& st = r.streams[job.stream];
  const RowView<const float> k(k_block, C, r.d_phi);
  float* dz = r.z.row(j);
  std::fill(dz, dz + r.d_phi, 0.0f);
  if (r.any_decay) {
    const RowView<float> kd(kd_block, C, r.d_phi);
    for (uint32_t t = 0; t < C; ++t) {
      const float w = t < job.len ? st.pow[job.len - 1 - t] : 0.0f;
      const float* __restrict row = k.row(t);
      float* __restrict kd_row = kd.row(t);
      for (int64_t c = 0; c < r.d_phi; ++c) {
        kd_row[c] = w * row[c];
        dz[c] += kd_row[c];
      }
    }
  } else {
    for (uint32_t t = 0; t < job.len; ++t) {
      const float* __restrict row = k.row(t);
      for (int64_t c = 0; c < r.d_phi; ++c) dz[c] += row[c];
    }
  }
}

// FAVOR+ keys: one shift per stream and round (the running max of the
// exponents); FavorKeys then gives each job its features and FinishKeys.
void ChunkwiseRunner::ShiftFavorKeys(Round& r) {
  for (Stream& st : r.streams) {
    if (st.jobs == 0 || !r.item_of(st).attention->feature_map().is_favor()) {
      continue;
    }
    const float old_shift = r.work[st.item]->key_shift(st.head);
    float shift = old_shift;
    for (uint32_t c = 0; c < st.jobs; ++c) {
      shift = std::max(shift, r.jobs[st.job(c)].key_max);
    }
    st.shift = shift;
    st.rescale = shift > old_shift ? std::exp(old_shift - shift) : 1.0f;
    r.work[st.item]->key_shift(st.head) = shift;
  }
}

void ChunkwiseRunner::FavorKeys(const Round& r, uint32_t j) const {
  const Stream& st = r.streams[r.jobs[j].stream];
  const FeatureMap& fm = r.item_of(st).attention->feature_map();
  if (!fm.is_favor()) return;
  fm.FavorExp(r.k.block(j).data(), r.jobs[j].len * r.d_phi, st.shift);
  FinishKeys(r, j, r.k.block(j).data(),
             r.any_decay ? r.kd.block(j).data() : nullptr);
}

// Intra-chunk products, all chunks at once: A = Q·Kᵀ and ΔS = (decayed
// K)ᵀ·V; then the causal mask with decay, D_ij = γ^{i−j}[i ≥ j], whose row
// sums are the intra-chunk denominators (the ones column of V⁺).
absl::Status ChunkwiseRunner::IntraChunkProducts(Round& r) {
  const int64_t C = options_.chunk_size;
  const int64_t n_jobs = r.n_jobs();
  if (r.bf16) {
    LINATTN_RETURN_IF_ERROR(
        Gemm({.m = C, .k = r.d_phi, .n = C, .transpose_b = true}, n_jobs,
             r.q16.data(), r.k16.data(), r.a.data()));
    LINATTN_RETURN_IF_ERROR(
        Gemm({.m = r.d_phi, .k = C, .n = r.d_v, .transpose_a = true}, n_jobs,
             r.kd16.data(), r.v16.data(), r.s.data()));
    const VectorKernels& kernels = ActiveKernels();
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < n_jobs; ++j) {
      MaskScores(r, static_cast<uint32_t>(j), r.a.block(j).data());
      kernels.to_bf16(C * C, r.a.block(j).data(), r.a16.block(j).data());
    }
    return absl::OkStatus();
  }
  LINATTN_RETURN_IF_ERROR(
      Gemm({.m = C, .k = r.d_phi, .n = C, .transpose_b = true}, n_jobs,
           r.q.data(), r.k.data(), r.a.data()));
  LINATTN_RETURN_IF_ERROR(
      Gemm({.m = r.d_phi, .k = C, .n = r.d_v, .transpose_a = true}, n_jobs,
           r.any_decay ? r.kd.data() : r.k.data(), r.v.data(), r.s.data()));
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < n_jobs; ++j) {
    MaskScores(r, static_cast<uint32_t>(j), r.a.block(j).data());
  }
  return absl::OkStatus();
}

// The first half of a fused round's unit, on the calling thread, with its
// keys, values and scores in `b`: A = Q·Kᵀ masked (with the intra-chunk
// denominators), ΔS = (decayed K)ᵀ·V, and the intra-chunk numerators
// O = A·V, which need no state. UnitBack adds the inter-chunk terms.
absl::Status ChunkwiseRunner::UnitFront(const Round& r, int64_t u,
                                        const UnitBlocks& b) const {
  const int64_t C = options_.chunk_size;
  const auto [first_stream, chunk] = r.units[u];
  const uint32_t j0 = r.streams[first_stream].job(chunk);
  const int64_t H = r.item_of(r.streams[first_stream]).attention->num_heads();
  if (r.bf16) {
    // The unit's operands rounded while in this core's cache.
    const VectorKernels& kernels = ActiveKernels();
    const uint64_t qk = H * C * r.d_phi;
    kernels.to_bf16(qk, r.q.block(j0).data(), b.q16);
    kernels.to_bf16(qk, b.k, b.k16);
    if (r.any_decay) kernels.to_bf16(qk, b.kd, b.kd16);
    kernels.to_bf16(H * C * r.d_v, b.v, b.v16);
    LINATTN_RETURN_IF_ERROR(
        BatchedPieces({.m = C, .k = r.d_phi, .n = C, .transpose_b = true}, H,
                      b.q16, b.k16, b.a));
    for (uint32_t h = 0; h < H; ++h) MaskScores(r, j0 + h, b.a + h * C * C);
    kernels.to_bf16(H * C * C, b.a, b.a16);
    LINATTN_RETURN_IF_ERROR(
        BatchedPieces({.m = r.d_phi, .k = C, .n = r.d_v, .transpose_a = true},
                      H, b.kd16, b.v16, r.s.block(j0).data()));
    return BatchedPieces({.m = C, .k = C, .n = r.d_v}, H, b.a16, b.v16,
                         r.o.block(j0).data());
  }
  LINATTN_RETURN_IF_ERROR(
      BatchedPieces({.m = C, .k = r.d_phi, .n = C, .transpose_b = true}, H,
                    r.q.block(j0).data(), b.k, b.a));
  for (uint32_t h = 0; h < H; ++h) MaskScores(r, j0 + h, b.a + h * C * C);
  LINATTN_RETURN_IF_ERROR(
      BatchedPieces({.m = r.d_phi, .k = C, .n = r.d_v, .transpose_a = true}, H,
                    b.kd, b.v, r.s.block(j0).data()));
  return BatchedPieces({.m = C, .k = C, .n = r.d_v}, H, b.a, b.v,
                       r.o.block(j0).data());
}

void ChunkwiseRunner::MaskScores(const Round& r, uint32_t j, float* a) const {
  ActiveKernels().mask_rows(options_.chunk_size,
                            r.streams[r.jobs[j].stream].mask_w.data(), a,
                            r.den.row(j));
}

// Scan of one stream: each chunk's (ΔS, Δz) becomes the state before it,
// carrying S ← γ^L·S + ΔS (FAVOR+ states first rescaled to the round's
// shift). Streams are independent.
void ChunkwiseRunner::ScanStream(const Round& r, int64_t si) const {
  const VectorKernels& kernels = ActiveKernels();
  const uint64_t s_floats = uint64_t(r.d_phi) * r.d_v;
  const Stream& st = r.streams[si];
  if (st.jobs == 0) return;
  AttentionState& state = *r.work[st.item];
  float* s = state.s(st.head);
  float* z = state.z(st.head);
  if (st.rescale != 1.0f) {
    kernels.scale(s_floats, st.rescale, s);
    kernels.scale(r.d_phi, st.rescale, z);
  }
  for (uint32_t c = 0; c < st.jobs; ++c) {
    const uint32_t j = st.job(c);
    const float g = st.pow[r.jobs[j].len];
    if (r.bf16) {  // S before the chunk only as the product's operand
      kernels.scan_step_bf16(s_floats, g, s, r.s.block(j).data(),
                             r.s16.block(j).data());
    } else {
      kernels.scan_step(s_floats, g, s, r.s.block(j).data());
    }
    kernels.scan_step(r.d_phi, g, z, r.z.row(j));
  }
}

// Inter-chunk terms: numerators O = Q·S_prev, denominators Q·z_prev added to
// the intra-chunk ones, both times γ^{i+1} on row i.
absl::Status ChunkwiseRunner::InterChunk(Round& r) {
  const int64_t C = options_.chunk_size;
  const int64_t n_jobs = r.n_jobs();
  if (r.bf16) {
    LINATTN_RETURN_IF_ERROR(Gemm({.m = C, .k = r.d_phi, .n = r.d_v}, n_jobs,
                                 r.q16.data(), r.s16.data(), r.o.data()));
  } else {
    LINATTN_RETURN_IF_ERROR(Gemm({.m = C, .k = r.d_phi, .n = r.d_v}, n_jobs,
                                 r.q.data(), r.s.data(), r.o.data()));
  }
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < n_jobs; ++j) {
    InterChunkTerms(r, static_cast<uint32_t>(j));
  }
  return absl::OkStatus();
}

void ChunkwiseRunner::InterChunkTerms(const Round& r, uint32_t j) const {
  const VectorKernels& kernels = ActiveKernels();
  const Stream& st = r.streams[r.jobs[j].stream];
  const float* z_prev = r.z.row(j);
  for (uint32_t i = 0; i < r.jobs[j].len; ++i) {
    float d =
        kernels.dot(static_cast<uint32_t>(r.d_phi), r.q.row(j, i), z_prev);
    if (st.decays) {
      const float g = st.pow[i + 1];
      d *= g;
      kernels.scale(r.d_v, g, r.o.row(j, i));
    }
    r.den(j, i) += d;
  }
}

// O += (Q·Kᵀ ⊙ D)·V: the intra-chunk numerators onto the inter-chunk ones.
absl::Status ChunkwiseRunner::AddIntraChunkValues(Round& r) {
  const int64_t C = options_.chunk_size;
  if (r.bf16) {
    return Gemm({.m = C, .k = C, .n = r.d_v, .accumulate = true}, r.n_jobs(),
                r.a16.data(), r.v16.data(), r.o.data());
  }
  return Gemm({.m = C, .k = C, .n = r.d_v, .accumulate = true}, r.n_jobs(),
              r.a.data(), r.v.data(), r.o.data());
}

// The second half of a fused round's unit, after the scan: queries scaled
// by γ^{i+1} in place (they are not needed after), the inter-chunk
// denominators Q·z_prev, O += Q·S_prev onto UnitFront's numerators, and the
// read-out.
absl::Status ChunkwiseRunner::UnitBack(const Round& r, int64_t u,
                                       const UnitBlocks& b) const {
  const int64_t C = options_.chunk_size;
  const auto [first_stream, chunk] = r.units[u];
  const uint32_t j0 = r.streams[first_stream].job(chunk);
  const int64_t H = r.item_of(r.streams[first_stream]).attention->num_heads();
  const VectorKernels& kernels = ActiveKernels();
  const uint32_t d_phi = static_cast<uint32_t>(r.d_phi);
  for (uint32_t j = j0; j < j0 + H; ++j) {
    const Stream& st = r.streams[r.jobs[j].stream];
    const float* z_prev = r.z.row(j);
    for (uint32_t i = 0; i < r.jobs[j].len; ++i) {
      float* q = r.q.row(j, i);
      if (st.decays) kernels.scale(d_phi, st.pow[i + 1], q);
      r.den(j, i) += kernels.dot(d_phi, q, z_prev);
    }
  }
  if (r.bf16) {
    kernels.to_bf16(H * C * r.d_phi, r.q.block(j0).data(), b.q16);
    LINATTN_RETURN_IF_ERROR(
        BatchedPieces({.m = C, .k = r.d_phi, .n = r.d_v, .accumulate = true}, H,
                      b.q16, r.s16.block(j0).data(), r.o.block(j0).data()));
  } else {
    LINATTN_RETURN_IF_ERROR(BatchedPieces(
        {.m = C, .k = r.d_phi, .n = r.d_v, .accumulate = true}, H,
        r.q.block(j0).data(), r.s.block(j0).data(), r.o.block(j0).data()));
  }
  ReadOutUnit(r, u);
  return absl::OkStatus();
}

// Read-out of one unit into the caller's (token, head) layout: y = O/den
// (or O, when unnormalised) with FAVOR+'s query and key scales,
// availability per head.
void ChunkwiseRunner::ReadOutUnit(const Round& r, int64_t u) const {
  const uint32_t C = options_.chunk_size;
  const auto [first_stream, chunk] = r.units[u];
  const PrefillItem& item = r.item_of(r.streams[first_stream]);
  const AttentionSpec& spec = item.attention->spec();
  const bool favor = item.attention->feature_map().is_favor();
  const uint32_t H = spec.num_heads;
  const RowView<float> y = TokenRows(item.out.output, item.in.tokens, H, r.d_v);
  const uint32_t j0 = r.streams[first_stream].job(chunk);
  const uint32_t len = r.jobs[j0].len;
  for (uint32_t i = 0; i < std::min(C, len); ++i) {
    for (uint32_t h = 0; h < H; ++h) {
      const Stream& st = r.streams[first_stream + h];
      const uint32_t j = j0 + h;
      const uint64_t row = (r.jobs[j].start + i) * H + h;
      std::memcpy(y.row(row), r.o.row(j, i), r.d_v * sizeof(float));
      linattn::ReadOut(spec, r.qlog(j, i) + (favor ? st.shift : 0.0f),
                       r.den(j, i), static_cast<uint32_t>(r.d_v), y.row(row),
                       item.out.denominator + row, item.out.available + row);
    }
  }
}

}  // namespace linattn
