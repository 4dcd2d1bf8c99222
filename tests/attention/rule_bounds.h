// Random inputs of the gated and delta rules, and the fp32 error bounds
// their evaluation orders are held to against the float64 recurrence
// (core/attention/reference.h).
//
// u = 2^-24. n is the number of tokens an output has seen, C the chunk size
// (1 for the recurrent order), d_k the key width.
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
// The rwkv7 rule is held to the delta rules' bound below, with
// S_t = T_t S_{t−1} + kvᵀ, T_t = diag(α) + baᵀ: ρ_t bounds ‖T_t‖₂ and
// s_t = ‖S_{t−1}‖_F(max α + ‖a‖‖b‖) + ‖k‖‖v‖ (core/attention/reference.cc),
// its step a d_k-term product aᵀS and three rounded terms per entry, and
// B_t the largest |g| of each token summed. Its chunkwise form
// (chunkwise_rwkv7.cc) scales a row block's own columns by up to e^τ
// (τ = kGateSubChunkSpan) and its rows by as much less, so each term's
// exponents sum to at most its span plus 2τ; with q ⊙ e^{g} of a block
// done term by term (one exp, one product) κ_t gains 2τ + 2 at every C.
// RWKV-7's transitions contract
// over a few tokens but not each on its own (ρ_t is often above 1), so
// the tokens go in windows of kRwkv7BoundWindow: an error made before a
// window starting at s reaches token t through T_t ⋯ T_s, of Frobenius norm
// P_t (the reference reports it), and the window's own errors through the
// recursion below started from 0: Δ_t = P_t·Δ_{s−1} + δ_t.
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
#ifndef LINATTN_TESTS_ATTENTION_RULE_BOUNDS_H_
#define LINATTN_TESTS_ATTENTION_RULE_BOUNDS_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/attention/attention.h"
#include "core/attention/chunkwise.h"
#include "core/attention/reference.h"
#include "core/attention/state.h"
#include "tests/attention/test_util.h"

namespace linattn::testing {

struct RuleTokens {
  std::vector<float> q, k, v, g, beta, a, b;
  uint64_t tokens = 0;
  SequenceInput input() const {
    SequenceInput in{q.data(), k.data(), v.data(), tokens};
    if (!g.empty()) in.g = g.data();
    if (!beta.empty()) in.beta = beta.data();
    if (!a.empty()) in.a = a.data();
    if (!b.empty()) in.b = b.data();
    return in;
  }
  // Tokens [at, at + n).
  SequenceInput slice(const AttentionSpec& spec, uint64_t at,
                      uint64_t n) const {
    SequenceInput in = TokenOf(spec, input(), at);
    in.tokens = n;
    return in;
  }
};

struct RuleTokenOptions {
  float k_scale = 1.0f;        // k uniform in [−k_scale, k_scale]
  float log_gate_min = -1.0f;  // g uniform in [log_gate_min, 0]
  float beta_fixed = -1.0f;    // β: this value, or uniform in [0, 2] if < 0
};

inline RuleTokens RandomRuleTokens(const AttentionSpec& spec, uint64_t tokens,
                                   uint64_t seed,
                                   const RuleTokenOptions& options) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  RuleTokens t;
  t.tokens = tokens;
  const uint64_t rows = tokens * spec.num_heads;
  t.q.resize(rows * spec.key_dim);
  t.k.resize(rows * spec.key_dim);
  t.v.resize(rows * spec.value_dim);
  for (float& x : t.q) x = unit(rng);
  for (float& x : t.k) x = options.k_scale * unit(rng);
  for (float& x : t.v) x = unit(rng);
  if (HasGates(spec.rule)) {
    std::uniform_real_distribution<float> gate(options.log_gate_min, 0.0f);
    t.g.resize(rows * GatesPerHead(spec));
    for (float& x : t.g) x = gate(rng);
  }
  if (HasBeta(spec.rule)) {
    std::uniform_real_distribution<float> beta(0.0f, 2.0f);
    t.beta.resize(rows);
    for (float& x : t.beta) {
      x = options.beta_fixed >= 0 ? options.beta_fixed : beta(rng);
    }
  }
  if (HasLowRank(spec.rule)) {
    // RWKV-7's own form: a = −κ̂ and b = κ̂ ⊙ λ, κ̂ a unit vector and λ (its
    // in-context learning rate) in [0, 1] per channel.
    const uint32_t d = spec.key_dim;
    std::normal_distribution<float> normal;
    std::uniform_real_distribution<float> rate(0.0f, 1.0f);
    t.a.resize(rows * d);
    t.b.resize(rows * d);
    std::vector<float> kappa(d);
    for (uint64_t r = 0; r < rows; ++r) {
      double norm2 = 0;
      for (float& x : kappa) {
        x = normal(rng);
        norm2 += double(x) * x;
      }
      const float inv = static_cast<float>(1.0 / std::sqrt(norm2));
      for (uint32_t c = 0; c < d; ++c) {
        t.a[r * d + c] = -kappa[c] * inv;
        t.b[r * d + c] = kappa[c] * inv * rate(rng);
      }
    }
  }
  return t;
}

// The delta rules' Δ_t per (token, head), as the file comment defines it
// (empty for the gated rule).
inline std::vector<double> DeltaStateErrors(const AttentionSpec& spec,
                                            const RuleTokens& data,
                                            const RuleReferenceResult& ref,
                                            uint32_t C) {
  if (!StateBoundIsNorm(spec.rule)) return {};
  const uint32_t H = spec.num_heads, G = GatesPerHead(spec);
  const uint64_t T = data.tokens;
  // The largest |g| of a row (its gate per head, or the most of its gates
  // per key channel).
  auto row_gate = [&](uint64_t row) {
    double most = 0;
    for (uint32_t c = 0; c < G; ++c) {
      most = std::max(most, std::abs(double(data.g[row * G + c])));
    }
    return most;
  };
  std::vector<double> out(T * H);
  for (uint32_t h = 0; h < H; ++h) {
    double delta = 0, window = 0, carried = 0;
    for (uint64_t t = 0; t < T; ++t) {
      const uint64_t row = t * H + h;
      if (!data.g.empty()) {
        window += row_gate(row);
        if (t >= C) window -= row_gate((t - C) * H + h);
        window = std::max(window, 0.0);
      }
      const double blocks =
          HasLowRank(spec.rule) ? 2.0 * kGateSubChunkSpan + 2 : 0.0;
      const double kappa = 4.0 * (spec.key_dim + C) + 16 + 4 * window + blocks;
      if (ref.window_norm.empty()) {
        delta = ref.growth[row] * delta +
                kUnitRoundoff * kappa * ref.step_scale[row];
        out[row] = delta;
        continue;
      }
      // rwkv7: within a window, its own errors through the per-token
      // norms; the error before it through the window's product.
      if (t % kRwkv7BoundWindow == 0) {
        carried = t == 0 ? 0.0 : out[row - H];
        delta = 0;
      }
      delta =
          ref.growth[row] * delta + kUnitRoundoff * kappa * ref.step_scale[row];
      out[row] = ref.window_norm[row] * carried + delta;
    }
  }
  return out;
}

// The gated rule's bound on one entry after n tokens, from the sums of
// |terms| and of |terms|·(log-gate span) the reference reports.
inline double GatedBound(double n, uint32_t K, uint32_t C, bool per_key,
                         bool own_term, double abs_sum, double gate_abs_sum) {
  const double blocks = per_key ? 2.0 * kGateSubChunkSpan + 3 : 0.0;
  const double own = own_term ? 4.0 : 0.0;
  return kUnitRoundoff *
         ((4 * n + 2.0 * K + 2.0 * C + 32 + blocks + own) * abs_sum +
          4 * gate_abs_sum);
}

// A spec of `rule` with a gate per key channel (rwkv7, rwkv6, gated):
// q and k as given, unnormalised, scale 1.
inline AttentionSpec KeyGatedSpec(UpdateRule rule, uint32_t heads, uint32_t d_k,
                                  uint32_t d_v) {
  AttentionSpec spec{.rule = rule,
                     .num_heads = heads,
                     .key_dim = d_k,
                     .value_dim = d_v,
                     .feature_map = FeatureMapKind::kIdentity,
                     .unnormalized = true};
  spec.gate = GateShape::kKey;
  return spec;
}

// rwkv6's bonus u for `spec`: uniform in [−1, 1] from `seed` (RWKV-6
// checkpoints' time_faaaa is of that order).
inline std::vector<float> RandomBonus(const AttentionSpec& spec,
                                      uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::vector<float> u(uint64_t{spec.num_heads} * spec.key_dim);
  for (float& x : u) x = unit(rng);
  return u;
}

inline void ExpectRuleMatchesReference(const AttentionSpec& spec,
                                       const RuleTokens& data,
                                       const RuleReferenceResult& ref,
                                       const Outputs& got, uint32_t C,
                                       const std::string& what) {
  const uint32_t H = spec.num_heads, K = spec.key_dim, V = spec.value_dim;
  const uint64_t T = data.tokens;
  const bool delta = StateBoundIsNorm(spec.rule);
  const std::vector<double> state_error = DeltaStateErrors(spec, data, ref, C);
  int failures = 0;
  for (uint64_t t = 0; t < T && failures < 5; ++t) {
    for (uint32_t h = 0; h < H && failures < 5; ++h) {
      const uint64_t row = t * H + h;
      if (got.available[row] != 1 || got.denominator[row] != 0.0f) {
        ADD_FAILURE() << what << ": token " << t << " head " << h
                      << " available " << int(got.available[row])
                      << ", denominator " << got.denominator[row];
        ++failures;
        continue;
      }
      for (uint32_t c = 0; c < V; ++c) {
        const uint64_t e = row * V + c;
        const double y = ref.output[e];
        double bound = 2 * kUnitRoundoff * std::abs(y);
        if (delta) {
          bound += ref.query_norm[row] * state_error[row] +
                   (2.0 * K + 8) * kUnitRoundoff * ref.query_norm[row] *
                       ref.state_norm[row];
        } else {
          bound += GatedBound(double(t + 1), K, C, GatesPerHead(spec) > 1,
                              ReadsBeforeUpdate(spec.rule),
                              ref.numerator_abs[e], ref.numerator_gate_abs[e]);
        }
        if (!WithinBound(
                got.output[e], y, bound,
                absl::StrCat(what, ": token ", t, " head ", h, " column ", c),
                &failures)) {
          break;
        }
      }
    }
  }
}

// The state after the sequence against the reference's final state.
inline void ExpectStateMatches(const AttentionSpec& spec,
                               const RuleTokens& data,
                               const RuleReferenceResult& ref,
                               const AttentionState& state, uint32_t C,
                               const std::string& what) {
  const uint32_t H = spec.num_heads, K = spec.key_dim, V = spec.value_dim;
  const std::vector<double> state_error = DeltaStateErrors(spec, data, ref, C);
  int failures = 0;
  for (uint32_t h = 0; h < H; ++h) {
    const float* s = state.s(h);
    for (uint64_t e = 0; e < uint64_t{K} * V && failures < 5; ++e) {
      const uint64_t at = uint64_t{h} * K * V + e;
      const double want = ref.final_state[at];
      double bound = 2 * kUnitRoundoff * std::abs(want);
      if (!state_error.empty()) {
        bound += state_error[(data.tokens - 1) * H + h];
      } else {
        bound += GatedBound(double(data.tokens), K, C, GatesPerHead(spec) > 1,
                            false, ref.final_abs[at], ref.final_gate_abs[at]);
      }
      if (!WithinBound(s[e], want, bound,
                       absl::StrCat(what, ": state head ", h, " entry ", e),
                       &failures)) {
        break;
      }
    }
  }
}

}  // namespace linattn::testing

#endif  // LINATTN_TESTS_ATTENTION_RULE_BOUNDS_H_
