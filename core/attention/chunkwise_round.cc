// ChunkwiseRunner's rounds of one group (chunkwise.h): which chunks of
// which streams run together, the round's workspaces, and the fused round
// that runs each unit's products on one thread.
#include "core/attention/chunkwise_round.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/attention/kernels.h"
#include "core/util/status_macros.h"

namespace linattn {

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
}  // namespace linattn
