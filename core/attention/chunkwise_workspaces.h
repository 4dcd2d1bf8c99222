// The workspaces of ChunkwiseRunner's rule groups (chunkwise.h): the gated
// and delta rules' (chunkwise_rules.cc) and the rwkv7 rule's
// (chunkwise_rwkv7.cc). Not for other users.
#ifndef LINATTN_CORE_ATTENTION_CHUNKWISE_WORKSPACES_H_
#define LINATTN_CORE_ATTENTION_CHUNKWISE_WORKSPACES_H_

#include <cstdint>
#include <span>
#include <vector>

#include "core/attention/chunkwise.h"
#include "core/util/aligned_buffer.h"

namespace linattn {

// One (item, head) of a rule group: a stream of chunks. A round's job j is
// chunk c0 + j / streams.size() of stream j % streams.size(), so the jobs
// of one chunk index are contiguous; H consecutive jobs from a multiple of
// H (a unit) are one item's chunk, all heads.
struct RuleStream {
  uint32_t item, head;
};

// How many rows of its chunk of C job j has (0 past the item's end), and
// where they start in the item's sequence (*start).
inline uint64_t RuleJobRows(std::span<const PrefillItem> items,
                            std::span<const RuleStream> streams, uint64_t c0,
                            uint64_t C, int64_t j, uint64_t* start) {
  const RuleStream& st = streams[j % streams.size()];
  *start = (c0 + j / streams.size()) * C;
  const uint64_t tokens = items[st.item].in.tokens;
  return *start >= tokens ? uint64_t{0} : std::min(C, tokens - *start);
}

// The round's outputs `o` (jobs, C, d_v) into the callers' rows, unit by
// unit in the caller's order, each row through ReadOut.
void ScatterRuleOutputs(const AttentionSpec& spec,
                        std::span<const PrefillItem> items,
                        std::span<const RuleStream> streams, uint64_t c0,
                        uint64_t C, int64_t units, const float* o);

// The packed states `s` (streams, d_k·d_v) back into the working states.
void StoreRuleStates(std::span<const RuleStream> streams,
                     std::span<AttentionState* const> work, const float* s,
                     uint64_t state_floats);

struct ChunkwiseRunner::RuleWorkspace {
  AlignedBuffer qh;  // (jobs, C, d_k)  prepared q (L2 norm, scale)
  AlignedBuffer kh;  // (jobs, C, d_k)  prepared k
  AlignedBuffer qt;  // (jobs, C, d_k)  q ⊙ e^{b}
  AlignedBuffer kt;  // (jobs, C, d_k)  k ⊙ e^{b_L − b}
  AlignedBuffer kb;  // (jobs, C, d_k)  −β ⊙ e^{b} ⊙ k, then −W (delta)
  AlignedBuffer vb;  // (jobs, C, d_v)  β ⊙ v (delta)
  AlignedBuffer u;   // (jobs, C, d_v)  V (gated) or U (delta)
  AlignedBuffer o;   // (jobs, C, d_v)  outputs
  AlignedBuffer a;   // (jobs, C, C)    masked scores Q Kᵀ ⊙ Γ
  AlignedBuffer t;   // (jobs, C, C)    K Kᵀ, then T (delta)
  AlignedBuffer end;  // (jobs, G)      e^{b_L}: per key channel or one
  AlignedBuffer s;    // (streams, d_k, d_v) the states, packed
  AlignedBuffer ds;   // (jobs, d_k, d_v) (gated: ΔS, then) S before the chunk
  AlignedBuffer qs;   // (jobs, C, d_k)   per key: a row block's scaled q
  AlignedBuffer ks;   // (jobs, C, d_k)   per key: the keys up to it, scaled
  AlignedBuffer sc;   // (jobs, C, C)     per key: their product
  std::vector<uint8_t> slow;    // (jobs) per key: diagonal term by term
  std::vector<uint64_t> block;  // (jobs) per key: the largest row block
  std::vector<uint8_t> bad;     // (jobs) a value that is not finite
  std::vector<double> b;        // (jobs, C, G) cumulative log-gates
};

// The rwkv7 rule's round (the formulas are in chunkwise_rwkv7.cc).
struct ChunkwiseRunner::Rwkv7Workspace {
  AlignedBuffer q, k;           // (jobs, C, d_k)  prepared q and k
  AlignedBuffer a, b;           // (jobs, C, d_k)  the low-rank vectors
  AlignedBuffer v;              // (jobs, C, d_v)
  AlignedBuffer qt;             // (jobs, C, d_k)  q ⊙ e^{l_i}
  AlignedBuffer wt;             // (jobs, C, d_k)  a ⊙ e^{l_{i−1}}
  AlignedBuffer w;              // (jobs, C, d_k)  W = T·wt
  AlignedBuffer kbar;           // (jobs, C, d_k)  k ⊙ e^{l_L − l_i}
  AlignedBuffer bbar;           // (jobs, C, d_k)  b ⊙ e^{l_L − l_i}
  AlignedBuffer end;            // (jobs, d_k)     e^{l_L}
  AlignedBuffer aqk, aqb, aak;  // (jobs, C, C)  intra-chunk scores
  AlignedBuffer t;              // (jobs, C, C)  −A_ab, then T
  AlignedBuffer x;              // (jobs, C, d_v) A_ak·V
  AlignedBuffer u;              // (jobs, C, d_v) U
  AlignedBuffer o;              // (jobs, C, d_v) outputs
  AlignedBuffer lhs;            // (jobs, 2R, d_k) a row block's q and a
  AlignedBuffer rhs;            // (jobs, 2C, d_k) the columns before it
  AlignedBuffer prod;           // (jobs, 2R, 2C)  their product
  AlignedBuffer s;              // (streams, d_k, d_v) the states, packed
  AlignedBuffer ds;             // (jobs, d_k, d_v) S before the chunk
  std::vector<double> l;        // (jobs, C, d_k) cumulative log-gates
  std::vector<uint8_t> bad;     // (jobs) a value that is not finite
  std::vector<uint8_t> slow;    // (jobs, blocks) a block term by term
};

}  // namespace linattn

#endif  // LINATTN_CORE_ATTENTION_CHUNKWISE_WORKSPACES_H_
