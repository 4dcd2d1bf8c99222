// The plain scalar reference: the obvious loops of docs/design.md §1 in double
// precision, with no stabilisation, no chunking and no reuse. It is the
// ground truth the fp32 evaluation orders are tested against, and it reports
// the magnitudes the fp32 error bounds are built from. Used only by tests and
// benchmarks (library linattn_reference); never on a serving path.
#ifndef LINATTN_CORE_ATTENTION_REFERENCE_H_
#define LINATTN_CORE_ATTENTION_REFERENCE_H_

#include <cstdint>
#include <vector>

#include "core/attention/attention.h"

namespace linattn {

struct ReferenceResult {
  std::vector<double> output;       // (T, H, d_v); NaN where unavailable
  std::vector<double> denominator;  // (T, H): φ(q)ᵀz
  std::vector<uint8_t> available;   // (T, H)
  // Σ_j γ^{i−j}·Σ_c|φ(q_i)_c·φ(k_j)_c|·|v_j|, (T, H, d_v): bounds numerator
  // error (the inner absolute sum, not |φ(q_i)·φ(k_j)|, since fp32 dot
  // products err relative to it).
  std::vector<double> numerator_abs;
  // Σ_j γ^{i−j}·Σ_c|φ(q_i)_c·φ(k_j)_c|, (T, H): bounds denominator error.
  std::vector<double> denominator_abs;
  // Largest FAVOR+ exponent magnitude Σ_c|ω_ic·x̂_c| + ‖x̂‖²/2 over all q
  // and k (0 for other maps): fp32 exponents carry error ∝ it.
  double favor_exponent_scale = 0.0;
};

// Attention over `in` from an empty state at `start_position`, the spec's ε
// included. Uses `attention` only for its spec and FAVOR+ projection.
ReferenceResult ReferenceAttention(const Attention& attention,
                                   const SequenceInput& in,
                                   uint64_t start_position = 0);

}  // namespace linattn

#endif  // LINATTN_CORE_ATTENTION_REFERENCE_H_
