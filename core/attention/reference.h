// The plain scalar reference: the obvious loops of docs/design.md §1 in double
// precision, with no stabilisation, no chunking and no reuse. It is the
// ground truth the fp32 evaluation orders are tested against, and it reports
// the magnitudes the fp32 error bounds are built from. Used only by tests,
// benchmarks and linattn-load's verifier (library linattn_reference); never
// on a serving path.
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

// The gated, delta, rwkv7 and rwkv6 rules (docs/design.md §1), recurrent,
// in double: written from fla's naive recurrences (fla/ops/gla/naive.py,
// simple_gla/naive.py, delta_rule/naive.py, gated_delta_rule/naive.py,
// generalized_delta_rule/dplr/naive.py, rwkv6/recurrent_naive.py):
//   h ← h·exp(g);  (delta) v' = β(v − hᵀk);  h ← h + k·v'ᵀ (gated: k·vᵀ);
//   (rwkv7) h ← h·exp(g) + k·vᵀ + b·(aᵀh_{before});
//   o = hᵀ(q·scale); (rwkv6) o = (h_{before} + diag(u)·k·vᵀ)ᵀ(q·scale)
// with fla's l2norm x/√(Σx² + 1e-6) on q and k when the spec asks, from an
// empty state. Also carries what an fp32 evaluation's error bound is built
// from (rule_bounds.h derives the bound).
struct RuleReferenceResult {
  std::vector<double> output;  // (T, H, d_v)
  // Gated rule, (T, H, d_v): Σ_j Σ_c |q_c k_jc| a_c(j,t)·|v_j| and the same
  // (rwkv6: over j < t, plus its bonus term Σ_c |q_c u_c k_tc|·|v_t|)
  // with each term times L_c(j,t) = Σ_{s=j+1..t} |g_s,c| (the log-gate sum
  // its product of gates spans), where a_c(j,t) = exp(−L_c(j,t)).
  std::vector<double> numerator_abs;
  std::vector<double> numerator_gate_abs;
  // Delta rules, (T, H): ‖S_{t−1}‖_F·(1 + β‖k‖²) + β‖k‖‖v‖ (what one
  // step's rounding is relative to), ρ_t = α·max(1, |1 − β‖k‖²|) (how an
  // earlier error can grow), ‖q_t‖ and ‖S_t‖_F. The rwkv7 rule likewise,
  // with ‖S_{t−1}‖_F·(max α + ‖a‖‖b‖) + ‖k‖‖v‖ and ρ_t a bound on
  // ‖diag(α) + b aᵀ‖₂ (reference.cc says which).
  std::vector<double> step_scale, growth, query_norm, state_norm;
  // The rwkv7 rule, (T, H): ‖T_t ⋯ T_s‖_F, the product of the transitions
  // T_i = diag(α_i) + b_i a_iᵀ of the tokens since the start s of t's
  // window of kRwkv7BoundWindow tokens (s = t rounded down to a multiple
  // of it). RWKV-7's transitions contract over a few tokens, not each on
  // its own: the bound carries an earlier error through this product.
  std::vector<double> window_norm;
  std::vector<double> final_state;  // (H, d_k, d_v)
  // Gated rule, (H, d_k, d_v): the final state's Σ_j a(j,T)|k_j||v_j| and
  // the same with each term times L(j,T), per entry.
  std::vector<double> final_abs, final_gate_abs;
};

inline constexpr uint64_t kRwkv7BoundWindow = 16;

RuleReferenceResult ReferenceRule(const AttentionSpec& spec,
                                  const SequenceInput& in);

}  // namespace linattn

#endif  // LINATTN_CORE_ATTENTION_REFERENCE_H_
