// The workspaces of ChunkwiseRunner's rule groups (chunkwise.h): the gated
// and delta rules' (chunkwise_rules.cc) and the rwkv7 rule's
// (chunkwise_rwkv7.cc). Not for other users.
#ifndef LINATTN_CORE_ATTENTION_CHUNKWISE_WORKSPACES_H_
#define LINATTN_CORE_ATTENTION_CHUNKWISE_WORKSPACES_H_

#include <cstdint>
#include <vector>

#include "core/attention/chunkwise.h"
#include "core/util/aligned_buffer.h"

namespace linattn {

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
  AlignedBuffer q, k;  // (jobs, C, d_k)  prepared q and k
  AlignedBuffer a, b;  // (jobs, C, d_k)  the low-rank vectors
  AlignedBuffer v;     // (jobs, C, d_v)
  AlignedBuffer qt;    // (jobs, C, d_k)  q ⊙ e^{l_i}
  AlignedBuffer wt;    // (jobs, C, d_k)  a ⊙ e^{l_{i−1}}
  AlignedBuffer w;     // (jobs, C, d_k)  W = T·wt
  AlignedBuffer kbar;  // (jobs, C, d_k)  k ⊙ e^{l_L − l_i}
  AlignedBuffer bbar;  // (jobs, C, d_k)  b ⊙ e^{l_L − l_i}
  AlignedBuffer end;   // (jobs, d_k)     e^{l_L}
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
