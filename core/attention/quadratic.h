// The quadratic evaluation order: the materialised causal kernel matrix,
//   y_i = Σ_{j≤i} γ^{i−j} (φ(q_i)·φ(k_j)) v_j / Σ_{j≤i} γ^{i−j}
//   (φ(q_i)·φ(k_j)),
// in fp32 from an empty state starting at `start_position`. O(T²) time and
// O(T) extra memory per head: for tests and the explorer, not for serving.
#ifndef LINATTN_CORE_ATTENTION_QUADRATIC_H_
#define LINATTN_CORE_ATTENTION_QUADRATIC_H_

#include <cstdint>

#include "absl/status/status.h"
#include "core/attention/attention.h"

namespace linattn {

absl::Status QuadraticAttention(const Attention& attention,
                                const SequenceInput& in,
                                const SequenceOutput& out,
                                uint64_t start_position = 0);

}  // namespace linattn

#endif  // LINATTN_CORE_ATTENTION_QUADRATIC_H_
