// Shared helpers for the attention tests: random inputs, and the fp32 error
// bounds every fast evaluation order is held to against the double-precision
// reference.
//
// Error bound (standard floating-point analysis, u = 2^-24 for fp32
// round-to-nearest). Every weight w_ij = γ^{i−j}·φ(q_i)·φ(k_j) is computed
// with relative error at most
//   ρ_q + ρ_k          feature maps (exp within 2 ulp; for FAVOR+ the
//   exponent's own
//                      rounding, (d_k + 8)·u·A, amplified by exp)
//   + d_φ·u            the dot product of non-negative features (absolute
//                      sums bound it for signed ones)
//   + 2n·u             γ applied once per step (recurrent) or per chunk and
//                      via powers (chunkwise), for n ≤ i+1 steps
// and each sum of n such terms adds n·u relative to the sum of |terms|
// (any summation order). So with e = ρ_q + ρ_k + (3n + 2d_φ + 16)·u:
//   |Ñ − N| ≤ e·Σ|w||v|,   |D̃ − D| ≤ e·Σ|w|,
// and for the normalised read-out y = N/D,
//   |ỹ − y| ≤ e·(Σ|w||v| + |y|·Σ|w|) / (D − e·Σ|w|) + 2u|y|.
#ifndef LINATTN_TESTS_ATTENTION_TEST_UTIL_H_
#define LINATTN_TESTS_ATTENTION_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/attention/attention.h"
#include "core/attention/reference.h"

namespace linattn::testing {

inline constexpr double kUnitRoundoff = 0x1.0p-24;

// Inputs of a (T, H, d) sequence, uniform in [-scale, scale].
struct Tokens {
  std::vector<float> q, k, v;
  uint64_t tokens = 0;
  SequenceInput input() const { return {q.data(), k.data(), v.data(), tokens}; }
};

inline Tokens RandomTokens(const AttentionSpec& spec, uint64_t tokens,
                           uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  Tokens t;
  t.tokens = tokens;
  t.q.resize(tokens * spec.num_heads * spec.key_dim);
  t.k.resize(t.q.size());
  t.v.resize(tokens * spec.num_heads * spec.value_dim);
  for (float& x : t.q) x = dist(rng);
  for (float& x : t.k) x = dist(rng);
  for (float& x : t.v) x = dist(rng);
  return t;
}

// Output buffers of a sequence.
struct Outputs {
  std::vector<float> output, denominator;
  std::vector<uint8_t> available;
  Outputs(const AttentionSpec& spec, uint64_t tokens)
      : output(tokens * spec.num_heads * spec.value_dim),
        denominator(tokens * spec.num_heads),
        available(tokens * spec.num_heads) {}
  SequenceOutput view(uint64_t first_token = 0, uint32_t heads = 0,
                      uint32_t d_v = 0) {
    return {output.data() + first_token * heads * d_v,
            denominator.data() + first_token * heads,
            available.data() + first_token * heads};
  }
};

// Relative error of one weight from the feature maps (ρ_q + ρ_k).
inline double FeatureError(const AttentionSpec& spec,
                           const ReferenceResult& ref) {
  if (spec.feature_map == FeatureMapKind::kFavor) {
    return 2.0 * ((spec.key_dim + 8) * ref.favor_exponent_scale + 5) *
           kUnitRoundoff;
  }
  // Each feature within 2 ulp (= 4u) of φ: the vectorised exp's accuracy.
  return 8.0 * kUnitRoundoff;
}

// |got − want| ≤ bound, or a failure naming `where` (counted in *failures;
// false once five have been reported).
inline bool WithinBound(double got, double want, double bound,
                        const std::string& where, int* failures) {
  if (std::abs(got - want) <= bound) return true;
  ADD_FAILURE() << where << ": " << got << " vs reference " << want
                << " (|diff| " << std::abs(got - want) << " > bound " << bound
                << ")";
  return ++*failures < 5;
}

// Checks every (token, head) of `got` against the reference within the bound
// above; `what` names the evaluation order in failure messages.
inline void ExpectMatchesReference(const Attention& attention,
                                   const ReferenceResult& ref,
                                   const Outputs& got,
                                   const std::string& what) {
  const AttentionSpec& spec = attention.spec();
  const uint32_t H = spec.num_heads, d_v = spec.value_dim;
  const uint64_t T = ref.denominator.size() / H;
  const double rho = FeatureError(spec, ref);
  int failures = 0;
  for (uint64_t t = 0; t < T && failures < 5; ++t) {
    const double e =
        rho +
        (3.0 * (t + 1) + 2.0 * attention.feature_dim() + 16) * kUnitRoundoff;
    for (uint32_t h = 0; h < H && failures < 5; ++h) {
      const uint64_t row = t * H + h;
      const double D_abs = ref.denominator_abs[row];
      if (got.available[row] != ref.available[row]) {
        ADD_FAILURE() << what << ": token " << t << " head " << h
                      << " available=" << int(got.available[row])
                      << ", reference " << int(ref.available[row])
                      << " (denominator " << ref.denominator[row] << ")";
        ++failures;
        continue;
      }
      const double den_bound =
          e * D_abs + kUnitRoundoff * std::abs(ref.denominator[row]);
      if (std::abs(ref.denominator[row]) > std::numeric_limits<float>::max()) {
        // Beyond fp32's range the reported denominator saturates to ±inf.
        EXPECT_TRUE(std::isinf(got.denominator[row]))
            << what << ": token " << t;
      } else if (std::abs(got.denominator[row] - ref.denominator[row]) >
                 den_bound) {
        ADD_FAILURE() << what << ": token " << t << " head " << h
                      << " denominator " << got.denominator[row]
                      << " vs reference " << ref.denominator[row] << " (bound "
                      << den_bound << ")";
        ++failures;
      }
      if (!ref.available[row]) {
        for (uint32_t c = 0; c < d_v; ++c) {
          EXPECT_TRUE(std::isnan(got.output[row * d_v + c]))
              << what << ": unavailable must be NaN";
        }
        continue;
      }
      const double D = ref.denominator[row] + spec.epsilon;
      for (uint32_t c = 0; c < d_v; ++c) {
        const double y = ref.output[row * d_v + c];
        const double N_abs = ref.numerator_abs[row * d_v + c];
        double bound;
        if (spec.unnormalized) {
          bound = e * N_abs + 2 * kUnitRoundoff * std::abs(y);
        } else {
          const double margin = D - e * D_abs;
          if (margin <= 0) continue;  // too ill-conditioned to bound
          bound = e * (N_abs + std::abs(y) * D_abs) / margin +
                  2 * kUnitRoundoff * std::abs(y);
        }
        if (!WithinBound(
                got.output[row * d_v + c], y, bound,
                absl::StrCat(what, ": token ", t, " head ", h, " column ", c),
                &failures)) {
          break;
        }
      }
    }
  }
}

}  // namespace linattn::testing

#endif  // LINATTN_TESTS_ATTENTION_TEST_UTIL_H_
