#include "core/attention/chunkwise.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/attention/kernels.h"
#include "core/util/status_macros.h"

namespace linattn {

namespace {
constexpr int64_t kMaxBatchPiece = 256;
constexpr uint32_t kMaxChunk = 4096;

}  // namespace

// One (session, head) sequence.
struct ChunkwiseRunner::Stream {
  uint32_t item = 0;
  uint32_t head = 0;
  uint64_t done = 0;          // tokens already prefilled
  std::vector<float> pow;     // γ^k for k = 0..C, from double
  std::vector<float> mask_w;  // γ^{C−1−k} for k < C
  bool decays = false;        // γ != 1
  float rescale = 1.0f;       // FAVOR+: e^{old shift − new shift} this round
  float shift = 0.0f;         // FAVOR+: key log-scale this round
  uint32_t first_job = 0;     // this round's jobs: [first_job, first_job+jobs)
  uint32_t jobs = 0;
};

// One chunk of one stream.
struct ChunkwiseRunner::Job {
  uint32_t stream = 0;
  uint64_t start = 0;  // first token
  uint32_t len = 0;    // L ≤ C
  float key_max = -INFINITY;
};

ChunkwiseRunner::ChunkwiseRunner(ChunkwiseOptions options)
    : options_(options) {}

absl::Status ChunkwiseRunner::Run(const Attention& attention,
                                  AttentionState& state,
                                  const SequenceInput& in,
                                  const SequenceOutput& out) {
  PrefillItem item{&attention, &state, in, out};
  return Run({&item, 1});
}

absl::Status ChunkwiseRunner::Gemm(MatmulShape shape, int64_t batch,
                                   const float* a, const float* b, float* c) {
  const int64_t a_stride = shape.m * shape.k;
  const int64_t b_stride = shape.k * shape.n;
  const int64_t c_stride = shape.m * shape.n;
  int64_t done = 0;
  while (done < batch) {
    int64_t piece = kMaxBatchPiece;
    while (piece > batch - done) piece /= 2;
    shape.batch = piece;
    LINATTN_RETURN_IF_ERROR(BatchedMatmul(
        shape, a + done * a_stride, b + done * b_stride, c + done * c_stride));
    last_flops_ += shape.Flops();
    done += piece;
  }
  return absl::OkStatus();
}

absl::Status ChunkwiseRunner::Run(std::span<const PrefillItem> items,
                                  PrefillCommit mode,
                                  std::span<absl::Status> refused) {
  last_flops_ = 0;
  if (options_.chunk_size == 0 || options_.chunk_size > kMaxChunk) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_size: must be in [1, ", kMaxChunk, "], got ",
                     options_.chunk_size));
  }
  if (options_.round_chunks == 0) {
    return absl::InvalidArgumentError("round_chunks: must be at least 1");
  }
  std::vector<const AttentionState*> seen;
  for (size_t i = 0; i < items.size(); ++i) {
    const PrefillItem& item = items[i];
    if (item.attention == nullptr || item.state == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("items[", i, "]: attention and state are required"));
    }
    // Finiteness is checked row by row in the gather pass (the input is read
    // there anyway); no state is committed before it has passed.
    absl::Status s = item.attention->ValidateInput(*item.state, item.in,
                                                   /*check_values=*/false);
    if (s.ok() && item.in.tokens != 0 &&
        (item.out.output == nullptr || item.out.denominator == nullptr ||
         item.out.available == nullptr)) {
      s = absl::InvalidArgumentError("out: output buffers missing");
    }
    if (!s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("items[", i, "].", s.message()));
    }
    seen.push_back(item.state);
  }
  std::sort(seen.begin(), seen.end());
  if (std::adjacent_find(seen.begin(), seen.end()) != seen.end()) {
    return absl::InvalidArgumentError(
        "items: the same state appears twice in one prefill batch");
  }

  // Work on copies; commit only once every product has succeeded. In place,
  // the caller holds the copies (and drops them on error).
  std::vector<AttentionState> copies;
  std::vector<AttentionState*> work;
  work.reserve(items.size());
  try {
    if (mode == PrefillCommit::kAllOrNothing) {
      copies.reserve(items.size());
      for (const PrefillItem& item : items) {
        copies.push_back(item.state->Copy());
      }
      for (AttentionState& copy : copies) work.push_back(&copy);
    } else {
      for (const PrefillItem& item : items) work.push_back(item.state);
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        "memory: allocating the working copies of a prefill failed");
  }

  std::map<std::pair<uint32_t, uint32_t>, std::vector<uint32_t>> groups;
  for (uint32_t i = 0; i < items.size(); ++i) {
    if (items[i].in.tokens == 0) continue;
    groups[{items[i].attention->feature_dim(), items[i].attention->value_dim()}]
        .push_back(i);
  }
  try {
    for (const auto& [dims, members] : groups) {
      LINATTN_RETURN_IF_ERROR(RunGroup(items, work, members));
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory in chunkwise prefill");
  }
  // A state that left fp32's range is refused, and nothing commits (in
  // place with `refused`: that item is reported there and the others go
  // on); the measurement is also the state's new magnitude bound
  // (kStateMagnitudeLimit).
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].in.tokens == 0) continue;
    if (!std::isfinite(work[i]->MeasureMagnitude())) {
      absl::Status overflow = absl::OutOfRangeError(absl::StrCat(
          "items[", i,
          "].k, v: these values would overflow the session's state (an entry "
          "of S or z would pass fp32's largest value, 3.4e38); nothing "
          "changed"));
      if (mode != PrefillCommit::kInPlace || refused.size() != items.size()) {
        return overflow;
      }
      refused[i] = std::move(overflow);
    }
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const uint64_t position = items[i].state->position() + items[i].in.tokens;
    if (mode == PrefillCommit::kAllOrNothing)
      *items[i].state = std::move(copies[i]);
    items[i].state->set_position(position);
  }
  return absl::OkStatus();
}

// One chunk's keys, left as (C, d_φ) rows (the matmuls read them
// transposed through strides): Δz = Σ_j γ^{L−1−j} φ(k_j) and, with decay,
// the decayed keys for ΔS. The block stays in L1 throughout.
void ChunkwiseRunner::FinishKeys(const Job& job, const Stream& st, int64_t j,
                                 int64_t d_phi, bool any_decay) {
  const uint32_t C = options_.chunk_size;
  const float* k = k_.data() + uint64_t(j) * C * d_phi;  // (C, d_φ)
  float* dz = z_.data() + j * d_phi;
  std::fill(dz, dz + d_phi, 0.0f);
  if (any_decay) {
    float* kd = kd_.data() + uint64_t(j) * C * d_phi;
    for (uint32_t t = 0; t < C; ++t) {
      const float w = t < job.len ? st.pow[job.len - 1 - t] : 0.0f;
      const float* __restrict row = k + uint64_t(t) * d_phi;
      float* __restrict kd_row = kd + uint64_t(t) * d_phi;
      for (int64_t c = 0; c < d_phi; ++c) {
        kd_row[c] = w * row[c];
        dz[c] += kd_row[c];
      }
    }
  } else {
    for (uint32_t t = 0; t < job.len; ++t) {
      const float* __restrict row = k + uint64_t(t) * d_phi;
      for (int64_t c = 0; c < d_phi; ++c) dz[c] += row[c];
    }
  }
}

absl::Status ChunkwiseRunner::RunGroup(std::span<const PrefillItem> items,
                                       std::span<AttentionState* const> work,
                                       const std::vector<uint32_t>& members) {
  const uint32_t C = options_.chunk_size;
  const int64_t d_phi = items[members[0]].attention->feature_dim();
  const int64_t d_v = items[members[0]].attention->value_dim();
  const StepKernels& kernels = ActiveKernels();

  std::vector<Stream> streams;
  for (uint32_t i : members) {
    const AttentionSpec& spec = items[i].attention->spec();
    for (uint32_t h = 0; h < spec.num_heads; ++h) {
      Stream st;
      st.item = i;
      st.head = h;
      const double g = HeadDecay(spec, h);
      st.decays = g != 1.0;
      st.pow.resize(C + 1);
      for (uint32_t p = 0; p <= C; ++p) {
        st.pow[p] = static_cast<float>(std::pow(g, static_cast<double>(p)));
      }
      st.mask_w.resize(C);
      for (uint32_t k = 0; k < C; ++k) st.mask_w[k] = st.pow[C - 1 - k];
      streams.push_back(std::move(st));
    }
  }
  bool any_decay = false;
  for (const Stream& st : streams) any_decay |= st.decays;

  std::vector<Job> jobs;
  std::vector<std::pair<uint32_t, uint32_t>> units;
  while (true) {
    // Plan the round: up to round_chunks chunks of every unfinished stream.
    jobs.clear();
    for (uint32_t si = 0; si < streams.size(); ++si) {
      Stream& st = streams[si];
      const uint64_t total = items[st.item].in.tokens;
      st.first_job = static_cast<uint32_t>(jobs.size());
      st.jobs = 0;
      for (uint64_t t = st.done; t < total && st.jobs < options_.round_chunks;
           t += C) {
        jobs.push_back(
            {si, t, static_cast<uint32_t>(std::min<uint64_t>(C, total - t))});
        ++st.jobs;
      }
    }
    if (jobs.empty()) break;
    const int64_t n_jobs = static_cast<int64_t>(jobs.size());
    // Gather and scatter go token-major, all heads of a token together, so
    // the caller's (token, head, d) rows are read and written contiguously:
    // one unit = (an item's first stream, chunk index within the round).
    units.clear();
    for (uint32_t si = 0; si < streams.size();
         si += items[streams[si].item].attention->num_heads()) {
      for (uint32_t c = 0; c < streams[si].jobs; ++c) units.emplace_back(si, c);
    }
    const int64_t n_units = static_cast<int64_t>(units.size());
    const uint64_t rows = uint64_t(n_jobs) * C;
    q_.EnsureSize(rows * d_phi);
    k_.EnsureSize(rows * d_phi);
    if (any_decay) kd_.EnsureSize(rows * d_phi);
    v_.EnsureSize(rows * d_v);
    a_.EnsureSize(rows * C);
    o_.EnsureSize(rows * d_v);
    s_.EnsureSize(uint64_t(n_jobs) * d_phi * d_v);
    z_.EnsureSize(uint64_t(n_jobs) * d_phi);
    den_.EnsureSize(rows);
    qlog_.EnsureSize(rows);

    // Pass 1: gather rows, check them, and apply φ (FAVOR+ keys: exponents
    // only, since their shift depends on the whole round). Padding rows are
    // zero.
    uint32_t non_finite = 0;
#pragma omp parallel for schedule(static) reduction(| : non_finite)
    for (int64_t u = 0; u < n_units; ++u) {
      const auto [first_stream, chunk] = units[u];
      const PrefillItem& item = items[streams[first_stream].item];
      const FeatureMap& fm = item.attention->feature_map();
      const uint32_t H = item.attention->num_heads();
      const uint32_t d_k = item.attention->key_dim();
      const uint64_t position0 = work[streams[first_stream].item]->position();
      // The unit's tokens are one contiguous block of each input.
      {
        const Job& job = jobs[streams[first_stream].first_job + chunk];
        const uint64_t qk = uint64_t(H) * d_k, vv = uint64_t(H) * d_v;
        non_finite |= !AllFinite(item.in.q + job.start * qk, job.len * qk) ||
                      !AllFinite(item.in.k + job.start * qk, job.len * qk) ||
                      !AllFinite(item.in.v + job.start * vv, job.len * vv);
      }
      for (uint32_t t = 0; t < C; ++t) {
        for (uint32_t h = 0; h < H; ++h) {
          const uint32_t j = streams[first_stream + h].first_job + chunk;
          Job& job = jobs[j];
          float* qrow = q_.data() + (uint64_t(j) * C + t) * d_phi;
          float* krow = k_.data() + (uint64_t(j) * C + t) * d_phi;
          float* vrow = v_.data() + (uint64_t(j) * C + t) * d_v;
          if (t >= job.len) {
            std::memset(qrow, 0, d_phi * sizeof(float));
            std::memset(krow, 0, d_phi * sizeof(float));
            std::memset(vrow, 0, d_v * sizeof(float));
            qlog_.data()[uint64_t(j) * C + t] = 0.0f;
            continue;
          }
          const uint64_t token = job.start + t;
          const uint64_t row = token * H + h;
          const float* q = item.in.q + row * d_k;
          const float* k = item.in.k + row * d_k;
          const float* v = item.in.v + row * d_v;
          qlog_.data()[uint64_t(j) * C + t] =
              fm.Apply(q, position0 + token, qrow);
          if (fm.is_favor()) {
            job.key_max = std::max(job.key_max, fm.Exponents(k, krow));
          } else {
            fm.Apply(k, position0 + token, krow);
          }
          std::memcpy(vrow, v, d_v * sizeof(float));
        }
      }
      // This unit's key blocks are still in cache: finish them now
      // (FAVOR+ keys wait for the round's shift, in pass 2).
      if (!fm.is_favor()) {
        for (uint32_t h = 0; h < H; ++h) {
          const Stream& st = streams[first_stream + h];
          FinishKeys(jobs[st.first_job + chunk], st, st.first_job + chunk,
                     d_phi, any_decay);
        }
      }
    }
    if (non_finite != 0) {
      // Name the first bad value; the working copies are dropped.
      for (uint32_t i : members) {
        if (absl::Status s =
                items[i].attention->ValidateInput(*items[i].state, items[i].in);
            !s.ok()) {
          return absl::Status(s.code(),
                              absl::StrCat("items[", i, "].", s.message()));
        }
      }
    }
    // FAVOR+: one key shift per stream and round (the running max).
    for (Stream& st : streams) {
      if (st.jobs == 0 || !items[st.item].attention->feature_map().is_favor()) {
        continue;
      }
      const float old_shift = work[st.item]->key_shift(st.head);
      float shift = old_shift;
      for (uint32_t j = st.first_job; j < st.first_job + st.jobs; ++j) {
        shift = std::max(shift, jobs[j].key_max);
      }
      st.shift = shift;
      st.rescale = shift > old_shift ? std::exp(old_shift - shift) : 1.0f;
      work[st.item]->key_shift(st.head) = shift;
    }
    // Pass 2 (FAVOR+ keys only; the others had it at the end of pass 1).
    bool any_favor = false;
    for (uint32_t i : members)
      any_favor |= items[i].attention->feature_map().is_favor();
    if (any_favor) {
#pragma omp parallel for schedule(static)
      for (int64_t j = 0; j < n_jobs; ++j) {
        const Stream& st = streams[jobs[j].stream];
        const FeatureMap& fm = items[st.item].attention->feature_map();
        if (!fm.is_favor()) continue;
        fm.FavorExp(k_.data() + uint64_t(j) * C * d_phi, jobs[j].len * d_phi,
                    st.shift);
        FinishKeys(jobs[j], st, j, d_phi, any_decay);
      }
    }
    // A = Q·Kᵀ and ΔS = (decayed K)ᵀ·V, all chunks at once.
    LINATTN_RETURN_IF_ERROR(
        Gemm({.m = C, .k = d_phi, .n = C, .transpose_b = true}, n_jobs,
             q_.data(), k_.data(), a_.data()));
    LINATTN_RETURN_IF_ERROR(
        Gemm({.m = d_phi, .k = C, .n = d_v, .transpose_a = true}, n_jobs,
             any_decay ? kd_.data() : k_.data(), v_.data(), s_.data()));
    // Pass 3: causal mask with decay, D_ij = γ^{i−j}[i ≥ j]; the intra-chunk
    // denominator is the row sum (the ones column of V⁺).
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < n_jobs; ++j) {
      kernels.mask_rows(C, streams[jobs[j].stream].mask_w.data(),
                        a_.data() + uint64_t(j) * C * C,
                        den_.data() + uint64_t(j) * C);
    }
    // Scan: turn each chunk's (ΔS, Δz) into the state before it, carrying
    // S ← γ^L·S + ΔS along the stream. Streams are independent.
#pragma omp parallel for schedule(dynamic)
    for (int64_t si = 0; si < static_cast<int64_t>(streams.size()); ++si) {
      const Stream& st = streams[si];
      if (st.jobs == 0) continue;
      AttentionState& state = *work[st.item];
      float* s = state.s(st.head);
      float* z = state.z(st.head);
      if (st.rescale != 1.0f) {
        kernels.scale(uint64_t(d_phi) * d_v, st.rescale, s);
        kernels.scale(d_phi, st.rescale, z);
      }
      for (uint32_t j = st.first_job; j < st.first_job + st.jobs; ++j) {
        const float g = st.pow[jobs[j].len];
        kernels.scan_step(uint64_t(d_phi) * d_v, g, s,
                          s_.data() + uint64_t(j) * d_phi * d_v);
        kernels.scan_step(d_phi, g, z, z_.data() + uint64_t(j) * d_phi);
      }
    }
    // O = Q·S_prev (inter-chunk numerators).
    LINATTN_RETURN_IF_ERROR(Gemm({.m = C, .k = d_phi, .n = d_v}, n_jobs,
                                 q_.data(), s_.data(), o_.data()));
    // Pass 4: inter-chunk denominators Q·z_prev, and diag(γ^{i+1}) on the
    // inter-chunk terms before the intra-chunk products are added.
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < n_jobs; ++j) {
      const Stream& st = streams[jobs[j].stream];
      const float* zp = z_.data() + j * d_phi;
      for (uint32_t i = 0; i < jobs[j].len; ++i) {
        const float* qrow = q_.data() + (uint64_t(j) * C + i) * d_phi;
        float d = kernels.dot(static_cast<uint32_t>(d_phi), qrow, zp);
        if (st.decays) {
          const float g = st.pow[i + 1];
          d *= g;
          kernels.scale(d_v, g, o_.data() + (uint64_t(j) * C + i) * d_v);
        }
        den_.data()[j * C + i] += d;
      }
    }
    // O += (Q·Kᵀ ⊙ D)·V.
    LINATTN_RETURN_IF_ERROR(Gemm({.m = C, .k = C, .n = d_v, .accumulate = true},
                                 n_jobs, a_.data(), v_.data(), o_.data()));
    // Pass 5: read-out into the caller's (token, head) layout.
#pragma omp parallel for schedule(static)
    for (int64_t u = 0; u < n_units; ++u) {
      const auto [first_stream, chunk] = units[u];
      const PrefillItem& item = items[streams[first_stream].item];
      const AttentionSpec& spec = item.attention->spec();
      const bool favor = item.attention->feature_map().is_favor();
      const uint32_t H = spec.num_heads;
      for (uint32_t i = 0; i < C; ++i) {
        for (uint32_t h = 0; h < H; ++h) {
          const Stream& st = streams[first_stream + h];
          const uint32_t j = st.first_job + chunk;
          if (i >= jobs[j].len) break;
          const uint64_t row = (jobs[j].start + i) * H + h;
          float* y = item.out.output + row * d_v;
          std::memcpy(y, o_.data() + (uint64_t(j) * C + i) * d_v,
                      d_v * sizeof(float));
          ReadOut(spec,
                  qlog_.data()[uint64_t(j) * C + i] + (favor ? st.shift : 0.0f),
                  den_.data()[uint64_t(j) * C + i], static_cast<uint32_t>(d_v),
                  y, item.out.denominator + row, item.out.available + row);
        }
      }
    }
    for (Stream& st : streams) {
      for (uint32_t j = st.first_job; j < st.first_job + st.jobs; ++j) {
        st.done += jobs[j].len;
      }
      st.rescale = 1.0f;
    }
  }
  return absl::OkStatus();
}

}  // namespace linattn
