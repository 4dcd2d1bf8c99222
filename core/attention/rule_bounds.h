// The fp32 error bounds of the gated, delta, rwkv7 and rwkv6 rules against
// their float64 recurrence (reference.h), for an evaluation in chunks of C
// tokens (C = 1: the recurrent step). The rule tests hold every evaluation
// order to them (tests/attention/rule_bounds.h), and linattn-load's
// verifier holds a server's outputs to them. Library linattn_reference.
//
// u = 2^-24. n is the number of tokens an output has seen, d_k the key
// width.
//
// Gated rule. o_t = Σ_j Σ_c q_c k_jc a_c(j,t) v_j with a_c(j,t) the product
// of the gates after token j, exp(−L_c(j,t)). Each term's relative error:
//   q and k prepared (L2 norm, scale)                  (d_k + 8)·u
//   the product of gates: recurrent, a rounded exp and a rounded product
//   per step (2u each, 4n·u); chunkwise, each factor exp(x) of a rounded
//   exponent x (|x| ≤ L_c(j,t) overall, u·|x| each, two per term at most
//   twice over: 4u·L_c(j,t)) and one rounding per chunk crossed; with a
//   gate per key channel, a row block as one product adds 2u·τ (its
//   exponents sum to L_c(j,t) + 2·(b_{r−1} − b_j), the second part at most
//   τ = kGateSubChunkSpan) and 3u for the whole-chunk block's keys, one
//   more rounded exp and product (K̃ ⊙ e^{−b_L}); chunkwise at any C, C = 1
//   included, so the allowance goes with the gate shape, not the order
//   sums: the read-out's d_k terms, the state's n terms (recurrent) or a
//   chunk's C terms per chunk crossed (chunkwise, ≤ n + 3n/C)
// so |õ − o| ≤ u·((4n + 2d_k + 2C + 32 + 2τ + 3)·N_abs + 4·N_gate) +
// 2u·|o| (2τ + 3 only with a gate per key channel), with
// N_abs = Σ|q_c k_jc| a_c |v_j| and N_gate the same with each term times
// L_c(j,t) (the reference reports both). The final state's entries
// likewise, with Σ a|k||v| and Σ a·L|k||v| per entry. The rwkv6 rule is
// the gated rule read out before each token (its terms j < t, a gate per
// key channel) plus the token's own term Σ_c q_c u_c k_c v, whose three
// products and one more sum add 4u of its magnitude (in N_abs).
//
// Delta rules. S_t = α(I − βkkᵀ)S_{t−1} + βkvᵀ maps an error in S_{t−1}
// through a matrix of 2-norm ρ_t = α·max(1, |1 − β‖k‖²|), and each step
// makes a new error of at most u·κ_t·s_t in Frobenius norm, where
// s_t = ‖S_{t−1}‖_F(1 + β‖k‖²) + β‖k‖‖v‖ and κ_t = 4(d_k + C) + 16 +
// 4·B_t covers the d_k-term products Sᵀk, the C-term products of a chunk
// (its UT transform T, U = T(β⊙V) and W S) and the gates' exponents
// (B_t = Σ|g_s| over the C tokens up to t, the most any exponent inside a
// chunk spans). So ‖ΔS_t‖_F ≤ Δ_t = ρ_t·Δ_{t−1} + u·κ_t·s_t, and
// |Δo_t,c| ≤ ‖q_t‖·Δ_t + (2d_k + 8)·u·‖q_t‖‖S_t‖_F + 2u·|o_t,c|.
//
// The rwkv7 rule is held to the delta rules' bound, with
// S_t = T_t S_{t−1} + kvᵀ, T_t = diag(α) + baᵀ: ρ_t bounds ‖T_t‖₂ and
// s_t = ‖S_{t−1}‖_F(max α + ‖a‖‖b‖) + ‖k‖‖v‖ (reference.cc), its step a
// d_k-term product aᵀS and three rounded terms per entry, and B_t the
// largest |g| of each token summed. Its chunkwise form (chunkwise_rwkv7.cc)
// scales a row block's own columns by up to e^τ and its rows by as much
// less, so each term's exponents sum to at most its span plus 2τ; with
// q ⊙ e^{g} of a block done term by term (one exp, one product) κ_t gains
// 2τ + 2 at every C. RWKV-7's transitions contract over a few tokens but
// not each on its own (ρ_t is often above 1), so the tokens go in windows
// of kRwkv7BoundWindow: an error made before a window starting at s reaches
// token t through T_t ⋯ T_s, of Frobenius norm P_t (the reference reports
// it), and the window's own errors through the recursion above started
// from 0: Δ_t = P_t·Δ_{s−1} + δ_t.
#ifndef LINATTN_CORE_ATTENTION_RULE_BOUNDS_H_
#define LINATTN_CORE_ATTENTION_RULE_BOUNDS_H_

#include <cstdint>
#include <vector>

#include "core/attention/attention.h"
#include "core/attention/reference.h"

namespace linattn {

inline constexpr double kFloatUnitRoundoff = 0x1.0p-24;

// The delta and rwkv7 rules' Δ_t per (token, head) for `in` (the inputs
// `ref` was computed from) in chunks of C; empty for the gated rules, whose
// bounds are per entry.
std::vector<double> RuleStateErrors(const AttentionSpec& spec,
                                    const SequenceInput& in,
                                    const RuleReferenceResult& ref, uint32_t C);

// The gated rules' bound on one entry after n tokens, from the sums of
// |terms| and of |terms|·(log-gate span) the reference reports; `per_key`
// for a gate per key channel, `own_term` for rwkv6's bonus term.
double GatedRuleBound(double n, uint32_t key_dim, uint32_t C, bool per_key,
                      bool own_term, double abs_sum, double gate_abs_sum);

// The bound on each output (T, H, d_v) of an fp32 evaluation of `in` in
// chunks of C, |õ − o| for o = ref.output, 2u·|o| included.
std::vector<double> RuleOutputBounds(const AttentionSpec& spec,
                                     const SequenceInput& in,
                                     const RuleReferenceResult& ref,
                                     uint32_t C);

}  // namespace linattn

#endif  // LINATTN_CORE_ATTENTION_RULE_BOUNDS_H_
