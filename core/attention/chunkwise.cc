#include "core/attention/chunkwise.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/attention/kernels.h"
#include "core/util/row_view.h"
#include "core/util/status_macros.h"

namespace linattn {

namespace {
constexpr int64_t kMaxBatchPiece = 256;
constexpr uint32_t kMaxChunk = 4096;

// A view of `count` bf16 values in a float buffer (two per float).
void EnsureBf16(AlignedBuffer& buffer, uint64_t count) {
  buffer.EnsureSize((count + 1) / 2);
}
uint16_t* Bf16Data(AlignedBuffer& buffer) {
  return reinterpret_cast<uint16_t*>(buffer.data());
}

}  // namespace

const char* PrefillPrecisionName(PrefillPrecision precision) {
  return precision == PrefillPrecision::kBf16 ? "bf16" : "f32";
}

absl::StatusOr<PrefillPrecision> ParsePrefillPrecision(std::string_view name) {
  if (name == "f32") return PrefillPrecision::kF32;
  if (name == "bf16") return PrefillPrecision::kBf16;
  return absl::InvalidArgumentError(
      absl::StrCat("prefill_precision: must be f32 or bf16, got \"",
                   std::string(name), "\""));
}

absl::Status PrefillPrecisionSupported(PrefillPrecision precision) {
  if (precision == PrefillPrecision::kF32 || NativeBf16Products()) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      "prefill_precision: bf16 needs a CPU with AVX512_BF16 or AMX (oneDNN's "
      "effective ISA here has neither); use f32");
}

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
  // This round's jobs: chunk c of the stream is job first_job + c·job_stride
  // (the jobs of one gather unit, all heads of an item's chunk, are
  // consecutive, so a unit's products are one batched call).
  uint32_t first_job = 0;
  uint32_t jobs = 0;
  uint32_t job_stride = 1;

  uint32_t job(uint32_t chunk) const { return first_job + chunk * job_stride; }
};

// One chunk of one stream.
struct ChunkwiseRunner::Job {
  uint32_t stream = 0;
  uint64_t start = 0;  // first token
  uint32_t len = 0;    // L ≤ C
  float key_max = -INFINITY;
};

absl::Status ChunkwiseRunner::Run(const Attention& attention,
                                  AttentionState& state,
                                  const SequenceInput& in,
                                  const SequenceOutput& out) {
  PrefillItem item{&attention, &state, in, out};
  return Run({&item, 1});
}

namespace {

// `batch` products of `shape` as primitives of power-of-two batch (so that
// few shapes are cached), on fp32 or bf16 (uint16_t) inputs. Thread-safe;
// inside a parallel region oneDNN runs each on the calling thread.
template <typename In>
absl::Status BatchedPieces(MatmulShape shape, int64_t batch, const In* a,
                           const In* b, float* c) {
  static_assert(std::is_same_v<In, float> || std::is_same_v<In, uint16_t>);
  shape.bf16_inputs = std::is_same_v<In, uint16_t>;
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
    done += piece;
  }
  return absl::OkStatus();
}

}  // namespace

template <typename In>
absl::Status ChunkwiseRunner::Gemm(MatmulShape shape, int64_t batch,
                                   const In* a, const In* b, float* c) {
  LINATTN_RETURN_IF_ERROR(BatchedPieces(shape, batch, a, b, c));
  shape.batch = batch;
  last_flops_ += shape.Flops();
  return absl::OkStatus();
}
// (chunkwise_rules.cc runs fp32 products through it too.)
template absl::Status ChunkwiseRunner::Gemm<float>(MatmulShape, int64_t,
                                                   const float*, const float*,
                                                   float*);
template absl::Status ChunkwiseRunner::Gemm<uint16_t>(MatmulShape, int64_t,
                                                      const uint16_t*,
                                                      const uint16_t*, float*);

absl::Status ChunkwiseRunner::Run(std::span<const PrefillItem> items,
                                  PrefillCommit mode,
                                  std::span<absl::Status> refused) {
  last_flops_ = 0;
  last_fused_rounds_ = 0;
  last_rounds_ = 0;
  if (options_.chunk_size == 0 || options_.chunk_size > kMaxChunk) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_size: must be in [1, ", kMaxChunk, "], got ",
                     options_.chunk_size));
  }
  if (options_.round_chunks == 0) {
    return absl::InvalidArgumentError("round_chunks: must be at least 1");
  }
  LINATTN_RETURN_IF_ERROR(PrefillPrecisionSupported(options_.precision));
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

  // Items share products when their rule, gate shape and widths agree; the
  // gated and delta rules' rounds also take one head count and one
  // preparation of q and k (L2 norm, scale) for the whole group, while the
  // linear rule's carry each item's own spec per stream.
  std::map<std::tuple<UpdateRule, GateShape, uint32_t, uint32_t, uint32_t, bool,
                      float>,
           std::vector<uint32_t>>
      groups;
  for (uint32_t i = 0; i < items.size(); ++i) {
    if (items[i].in.tokens == 0) continue;
    const AttentionSpec& spec = items[i].attention->spec();
    const bool linear = spec.rule == UpdateRule::kLinear;
    groups[{spec.rule, spec.gate, items[i].attention->feature_dim(),
            items[i].attention->value_dim(), linear ? 0 : spec.num_heads,
            linear ? false : spec.qk_l2norm, linear ? 0.0f : spec.scale}]
        .push_back(i);
  }
  // In place with `refused`, an item with a value that is not finite is
  // refused alone: its rows only ever meet its own rows in the batched
  // products, so the others complete.
  const bool refuse_alone =
      mode == PrefillCommit::kInPlace && refused.size() == items.size();
  std::vector<uint8_t> non_finite(items.size(), 0);
  try {
    for (const auto& [key, members] : groups) {
      if (std::get<0>(key) == UpdateRule::kLinear) {
        LINATTN_RETURN_IF_ERROR(
            RunGroup(items, work, members, non_finite, !refuse_alone));
      } else {
        LINATTN_RETURN_IF_ERROR(
            RunRuleGroup(items, work, members, non_finite, !refuse_alone));
      }
      // Failing as a whole, the Run stops at the first bad value.
      if (!refuse_alone && std::find(non_finite.begin(), non_finite.end(), 1) !=
                               non_finite.end()) {
        break;
      }
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory in chunkwise prefill");
  }
  for (size_t i = 0; i < items.size(); ++i) {
    if (!non_finite[i]) continue;
    // Named from the input (the slow path runs only for a bad item).
    absl::Status s =
        items[i].attention->ValidateInput(*items[i].state, items[i].in);
    if (s.ok()) s = absl::InternalError("a non-finite value went unnamed");
    s = absl::Status(s.code(), absl::StrCat("items[", i, "].", s.message()));
    if (!refuse_alone) return s;
    refused[i] = std::move(s);
  }
  // A state that left fp32's range is refused, and nothing commits (in
  // place with `refused`: that item is reported there and the others go
  // on); the measurement is also the state's new magnitude bound
  // (kStateMagnitudeLimit).
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].in.tokens == 0 || non_finite[i]) continue;
    if (!std::isfinite(work[i]->MeasureMagnitude())) {
      absl::Status overflow = absl::OutOfRangeError(absl::StrCat(
          "items[", i,
          "].k, v: these values would overflow the session's state (an entry "
          "of S or z would pass fp32's largest value, 3.4e38); nothing "
          "changed"));
      if (!refuse_alone) return overflow;
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

// The working set of one round of one group (items of equal d_φ, d_v).
struct ChunkwiseRunner::Round {
  std::span<const PrefillItem> items;
  std::span<AttentionState* const> work;  // the states the round advances
  int64_t d_phi = 0;
  int64_t d_v = 0;
  bool any_decay = false;
  bool any_favor = false;
  bool bf16 = false;            // the products take bf16 operands
  std::vector<Stream> streams;  // every (item, head), item by item
  std::vector<Job> jobs;        // this round's chunks
  // Gather and read-out go token-major, all heads of a token together, so
  // the caller's (token, head, d) rows are read and written contiguously:
  // one unit = (an item's first stream, chunk index within the round).
  std::vector<std::pair<uint32_t, uint32_t>> units;
  // The round's workspaces, one block per job (FinishKeys, the products).
  BlockView<float> q;   // (C, d_φ)   φ(Q)
  BlockView<float> k;   // (C, d_φ)   φ(K)
  BlockView<float> kd;  // (C, d_φ)   diag(γ^{L−1−j})·φ(K), with decay
  BlockView<float> v;   // (C, d_v)
  BlockView<float> a;   // (C, C)     masked Q·Kᵀ
  BlockView<float> o;   // (C, d_v)   numerators
  BlockView<float> s;   // (d_φ, d_v) ΔS, then S before the chunk
  RowView<float> z;     // (jobs, d_φ) Δz, then z before the chunk
  RowView<float> den;   // (jobs, C)   denominators
  RowView<float> qlog;  // (jobs, C)   FAVOR+ query log-scales
  // bf16 rounds: the operands of the products, as the fp32 blocks above
  // (fused rounds use q16, k16, kd16, v16 and a16 as thread scratch).
  BlockView<uint16_t> q16, k16, kd16, v16, a16;
  BlockView<uint16_t> s16;  // (d_φ, d_v) S before the chunk

  uint32_t max_heads = 0;  // the most heads of an item in this round
  int64_t n_jobs() const { return static_cast<int64_t>(jobs.size()); }
  const PrefillItem& item_of(const Stream& st) const { return items[st.item]; }
};

// A unit's keys (and decayed keys; the same blocks without decay), values
// and scores: one block per head, consecutive, (C, d_φ), (C, d_v), (C, C).
struct ChunkwiseRunner::UnitBlocks {
  float* k = nullptr;
  float* kd = nullptr;
  float* v = nullptr;
  float* a = nullptr;
  // bf16 rounds: the unit's operands, rounded (kd16 is k16 without decay).
  uint16_t* q16 = nullptr;
  uint16_t* k16 = nullptr;
  uint16_t* kd16 = nullptr;
  uint16_t* v16 = nullptr;
  uint16_t* a16 = nullptr;
};

namespace {

// A caller's (token, head, width) rows as one view.
template <typename T>
RowView<T> TokenRows(T* data, uint64_t tokens, uint32_t heads, int64_t width) {
  return RowView<T>(data, tokens * heads, static_cast<uint64_t>(width));
}

}  // namespace

absl::Status ChunkwiseRunner::RunGroup(std::span<const PrefillItem> items,
                                       std::span<AttentionState* const> work,
                                       const std::vector<uint32_t>& members,
                                       std::span<uint8_t> non_finite,
                                       bool stop_at_non_finite) {
  Round r;
  r.items = items;
  r.work = work;
  r.d_phi = items[members[0]].attention->feature_dim();
  r.d_v = items[members[0]].attention->value_dim();
  r.bf16 = options_.precision == PrefillPrecision::kBf16;
  PlanStreams(r, members);
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  while (PlanChunks(r, non_finite)) {
    MapWorkspaces(r);
    unit_bad_.assign(r.units.size(), 0);
    // With two units or more per thread, the round is one parallel region
    // in which each thread takes its units through every pass; with fewer,
    // or FAVOR+ keys (whose shift needs the whole round gathered first), the
    // passes run one after another, each spread over the team (the products
    // through oneDNN's own threads).
    ++last_rounds_;
    if (!r.any_favor && threads > 1 &&
        r.units.size() >= 2 * static_cast<size_t>(threads) &&
        r.jobs.size() >= uint64_t{r.max_heads} * threads) {
      ++last_fused_rounds_;
      LINATTN_RETURN_IF_ERROR(FusedRound(r, threads, stop_at_non_finite));
      MarkNonFinite(r, non_finite);
      if (stop_at_non_finite) {
        for (uint32_t i : members) {
          if (non_finite[i]) return absl::OkStatus();  // Run names it
        }
      }
    } else {
      const int64_t n_units = static_cast<int64_t>(r.units.size());
#pragma omp parallel for schedule(static)
      for (int64_t u = 0; u < n_units; ++u) {
        GatherUnit(
            r, u,
            RoundBlocks(r, r.streams[r.units[u].first].job(r.units[u].second)));
      }
      MarkNonFinite(r, non_finite);
      if (stop_at_non_finite) {
        for (uint32_t i : members) {
          if (non_finite[i]) return absl::OkStatus();  // Run names it
        }
      }
      if (r.any_favor) {
        ShiftFavorKeys(r);
        const int64_t n_jobs = r.n_jobs();
#pragma omp parallel for schedule(static)
        for (int64_t j = 0; j < n_jobs; ++j) {
          FavorKeys(r, static_cast<uint32_t>(j));
        }
      }
      if (r.bf16) {
        const int64_t n_jobs = r.n_jobs();
#pragma omp parallel for schedule(static)
        for (int64_t j = 0; j < n_jobs; ++j) {
          RoundInputs(r, static_cast<uint32_t>(j));
        }
      }
      LINATTN_RETURN_IF_ERROR(IntraChunkProducts(r));
      const int64_t n_streams = static_cast<int64_t>(r.streams.size());
#pragma omp parallel for schedule(dynamic)
      for (int64_t si = 0; si < n_streams; ++si) ScanStream(r, si);
      LINATTN_RETURN_IF_ERROR(InterChunk(r));
      LINATTN_RETURN_IF_ERROR(AddIntraChunkValues(r));
#pragma omp parallel for schedule(static)
      for (int64_t u = 0; u < n_units; ++u) ReadOutUnit(r, u);
    }
    for (Stream& st : r.streams) {
      for (uint32_t c = 0; c < st.jobs; ++c) st.done += r.jobs[st.job(c)].len;
      st.rescale = 1.0f;
    }
  }
  return absl::OkStatus();
}

// One round as one parallel region. A thread takes each of its units from
// the gather through every product that does not need the state before the
// chunk: keys, values and scores live in that thread's scratch (hot in its
// cache, reused unit after unit; a slice of the round's K, V and A
// buffers), and only what the second half needs
// (queries, ΔS, the intra-chunk numerators) goes to the round's workspace.
// After the scan, the units' inter-chunk terms and read-out. oneDNN runs
// each unit's batched products on the calling thread inside the region.
absl::Status ChunkwiseRunner::FusedRound(Round& r, int threads,
                                         bool stop_at_non_finite) {
  const int64_t n_units = static_cast<int64_t>(r.units.size());
  const int64_t n_streams = static_cast<int64_t>(r.streams.size());
  const uint64_t C = options_.chunk_size;
  // Each thread's scratch is the first max_heads blocks after its own
  // offset in the round's K, decayed K, V and A buffers, and in a bf16
  // round the same blocks of their bf16 copies and of φ(Q)'s (which holds
  // the unit's queries, unscaled for Q·Kᵀ, then scaled for Q·S_prev).
  // RunGroup fuses only rounds of at least threads · max_heads jobs, and a
  // fused round does not otherwise use these buffers: the workspace stays
  // what the passes would hold.
  const uint64_t blocks = r.max_heads;
  std::atomic<bool> failed{false};
  std::mutex mu;
  absl::Status first_error;
  auto note = [&](absl::Status s) {
    if (s.ok()) return;
    std::lock_guard<std::mutex> lock(mu);
    if (first_error.ok()) first_error = std::move(s);
    failed.store(true, std::memory_order_relaxed);
  };
#pragma omp parallel num_threads(threads)
  {
    const uint64_t first = blocks * omp_get_thread_num();
    UnitBlocks b;
    b.k = r.k.block(first).data();
    b.kd = r.any_decay ? r.kd.block(first).data() : b.k;
    b.v = r.v.block(first).data();
    b.a = r.a.block(first).data();
    if (r.bf16) {
      b.q16 = r.q16.block(first).data();
      b.k16 = r.k16.block(first).data();
      b.kd16 = r.any_decay ? r.kd16.block(first).data() : b.k16;
      b.v16 = r.v16.block(first).data();
      b.a16 = r.a16.block(first).data();
    }
    // Dynamic: the two cores of a VM do not always run at one speed.
#pragma omp for schedule(dynamic)
    for (int64_t u = 0; u < n_units; ++u) {
      GatherUnit(r, u, b);
      if (!failed.load(std::memory_order_relaxed)) note(UnitFront(r, u, b));
    }
    // After the gather's barrier: a value that is not finite fails a Run
    // that stops at one before any state moves, as in the passes' form;
    // a failed product stops the round too (the caller drops its states).
#pragma omp single
    if (stop_at_non_finite &&
        std::find(unit_bad_.begin(), unit_bad_.end(), 1) != unit_bad_.end()) {
      failed.store(true, std::memory_order_relaxed);
    }
    const bool go_on = !failed.load(std::memory_order_relaxed);
    if (go_on) {
#pragma omp for schedule(dynamic)
      for (int64_t si = 0; si < n_streams; ++si) ScanStream(r, si);
#pragma omp for schedule(dynamic)
      for (int64_t u = 0; u < n_units; ++u) {
        if (!failed.load(std::memory_order_relaxed)) note(UnitBack(r, u, b));
      }
    }
  }
  if (!first_error.ok()) return first_error;
  // The products every job ran (2C(C·d_φ + 2·d_φ·d_v + C·d_v) each).
  last_flops_ += 2.0 * C * (C * r.d_phi + 2.0 * r.d_phi * r.d_v + C * r.d_v) *
                 static_cast<double>(r.n_jobs());
  return absl::OkStatus();
}

ChunkwiseRunner::UnitBlocks ChunkwiseRunner::RoundBlocks(const Round& r,
                                                         uint32_t j0) const {
  UnitBlocks b;
  b.k = r.k.block(j0).data();
  b.kd = r.any_decay ? r.kd.block(j0).data() : b.k;
  b.v = r.v.block(j0).data();
  b.a = r.a.block(j0).data();
  return b;
}

// Every (item, head) of the group, with its decay's powers (from double).
void ChunkwiseRunner::PlanStreams(Round& r,
                                  const std::vector<uint32_t>& members) const {
  const uint32_t C = options_.chunk_size;
  for (uint32_t i : members) {
    const AttentionSpec& spec = r.items[i].attention->spec();
    r.any_favor |= r.items[i].attention->feature_map().is_favor();
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
      r.any_decay |= st.decays;
      r.streams.push_back(std::move(st));
    }
  }
}

// Up to round_chunks chunks of every unfinished item (none found
// non-finite), as gather units (an item's chunk) of one job per head; false
// when every stream is done. An item's heads advance together.
bool ChunkwiseRunner::PlanChunks(Round& r,
                                 std::span<const uint8_t> non_finite) const {
  const uint32_t C = options_.chunk_size;
  r.jobs.clear();
  r.units.clear();
  r.max_heads = 0;
  for (uint32_t si = 0; si < r.streams.size();) {
    const PrefillItem& item = r.item_of(r.streams[si]);
    const uint32_t H = item.attention->num_heads();
    const uint64_t total = item.in.tokens;
    const uint64_t done = r.streams[si].done;
    uint32_t chunks = 0;
    if (!non_finite[r.streams[si].item]) {  // refused: no more rounds
      while (chunks < options_.round_chunks &&
             done + uint64_t{chunks} * C < total) {
        ++chunks;
      }
    }
    const uint32_t first = static_cast<uint32_t>(r.jobs.size());
    for (uint32_t h = 0; h < H; ++h) {
      Stream& st = r.streams[si + h];
      st.first_job = first + h;
      st.jobs = chunks;
      st.job_stride = H;
    }
    if (chunks != 0) r.max_heads = std::max(r.max_heads, H);
    for (uint32_t c = 0; c < chunks; ++c) {
      r.units.emplace_back(si, c);
      const uint64_t start = done + uint64_t{c} * C;
      const uint32_t len =
          static_cast<uint32_t>(std::min<uint64_t>(C, total - start));
      for (uint32_t h = 0; h < H; ++h) r.jobs.push_back({si + h, start, len});
    }
    si += H;
  }
  return !r.jobs.empty();
}

void ChunkwiseRunner::MapWorkspaces(Round& r) {
  const uint64_t C = options_.chunk_size;
  const uint64_t jobs = static_cast<uint64_t>(r.n_jobs());
  const uint64_t d_phi = r.d_phi, d_v = r.d_v;
  q_.EnsureSize(jobs * C * d_phi);
  k_.EnsureSize(jobs * C * d_phi);
  if (r.any_decay) kd_.EnsureSize(jobs * C * d_phi);
  v_.EnsureSize(jobs * C * d_v);
  a_.EnsureSize(jobs * C * C);
  o_.EnsureSize(jobs * C * d_v);
  s_.EnsureSize(jobs * d_phi * d_v);
  z_.EnsureSize(jobs * d_phi);
  den_.EnsureSize(jobs * C);
  qlog_.EnsureSize(jobs * C);
  r.q = BlockView<float>(q_.data(), jobs, C, d_phi);
  r.k = BlockView<float>(k_.data(), jobs, C, d_phi);
  r.kd = r.any_decay ? BlockView<float>(kd_.data(), jobs, C, d_phi)
                     : BlockView<float>();
  r.v = BlockView<float>(v_.data(), jobs, C, d_v);
  r.a = BlockView<float>(a_.data(), jobs, C, C);
  r.o = BlockView<float>(o_.data(), jobs, C, d_v);
  r.s = BlockView<float>(s_.data(), jobs, d_phi, d_v);
  r.z = RowView<float>(z_.data(), jobs, d_phi);
  r.den = RowView<float>(den_.data(), jobs, C);
  r.qlog = RowView<float>(qlog_.data(), jobs, C);
  if (!r.bf16) return;
  EnsureBf16(q16_, jobs * C * d_phi);
  EnsureBf16(k16_, jobs * C * d_phi);
  if (r.any_decay) EnsureBf16(kd16_, jobs * C * d_phi);
  EnsureBf16(v16_, jobs * C * d_v);
  EnsureBf16(a16_, jobs * C * C);
  EnsureBf16(s16_, jobs * d_phi * d_v);
  r.q16 = BlockView<uint16_t>(Bf16Data(q16_), jobs, C, d_phi);
  r.k16 = BlockView<uint16_t>(Bf16Data(k16_), jobs, C, d_phi);
  r.kd16 = r.any_decay ? BlockView<uint16_t>(Bf16Data(kd16_), jobs, C, d_phi)
                       : r.k16;
  r.v16 = BlockView<uint16_t>(Bf16Data(v16_), jobs, C, d_v);
  r.a16 = BlockView<uint16_t>(Bf16Data(a16_), jobs, C, C);
  r.s16 = BlockView<uint16_t>(Bf16Data(s16_), jobs, d_phi, d_v);
}

// A bf16 round's passes: job j's φ(Q), φ(K), decayed keys and values
// rounded for the products (FAVOR+ keys after their shift).
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
