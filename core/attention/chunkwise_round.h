// The working set of ChunkwiseRunner's rounds (chunkwise.h), shared by the
// files its steps live in: chunkwise.cc (entry points, the batched
// products), chunkwise_round.cc (a group's rounds: planning, workspaces,
// the fused round), chunkwise_passes.cc (the passes over a round's units:
// gather, products, scan, read-out). Not for other users.
#ifndef LINATTN_CORE_ATTENTION_CHUNKWISE_ROUND_H_
#define LINATTN_CORE_ATTENTION_CHUNKWISE_ROUND_H_

#include <cmath>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/attention/chunkwise.h"
#include "core/onednn/matmul.h"
#include "core/util/aligned_buffer.h"
#include "core/util/row_view.h"
#include "core/util/status_macros.h"

namespace linattn {

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

// Batched products are cut into pieces of at most this many.
inline constexpr int64_t kMaxBatchPiece = 256;
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

// A caller's (token, head, width) rows as one view.
template <typename T>
RowView<T> TokenRows(T* data, uint64_t tokens, uint32_t heads, int64_t width) {
  return RowView<T>(data, tokens * heads, static_cast<uint64_t>(width));
}

// A view of `count` bf16 values in a float buffer (two per float).
inline void EnsureBf16(AlignedBuffer& buffer, uint64_t count) {
  buffer.EnsureSize((count + 1) / 2);
}
inline uint16_t* Bf16Data(AlignedBuffer& buffer) {
  return reinterpret_cast<uint16_t*>(buffer.data());
}

}  // namespace linattn

#endif  // LINATTN_CORE_ATTENTION_CHUNKWISE_ROUND_H_
