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
//
// Products whose operands are rounded first (bf16 chunkwise prefill,
// docs/design.md §1) multiply each term's error by (1 + u_b)^r for the r
// roundings in its chain (numerators and denominators have their own r),
// and operands a product flushes for being subnormal add an absolute
// error; OperandRounding carries both.
#ifndef LINATTN_TESTS_ATTENTION_TEST_UTIL_H_
#define LINATTN_TESTS_ATTENTION_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <algorithm>
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

struct OperandRounding {
  double unit = 0;              // u_b of the operands' format (bf16: 2^-8)
  int numerator_roundings = 0;  // roundings in a numerator term's chain
  int denominator_roundings = 0;
  double absolute = 0;  // bound on flushed terms, numerator or denominator
};

// The bound of bf16 chunkwise prefill (docs/design.md §1): each operand of
// the four products is rounded to bf16 once (u_b = 2^-8). A numerator term
// meets four roundings either way: within its chunk φ(q), φ(k), the masked
// score and v; across chunks the decayed key and v (in ΔS, which the fp32
// state keeps), S before the chunk and φ(q). A denominator term meets two
// (φ(q) and φ(k) in the scores whose row sums it takes; Q·z_prev is fp32).
// A product may also flush an operand below 2^-126 (bf16 has fp32's
// exponent range; vdpbf16ps treats subnormal inputs as zero), each such
// term off by less than 2^-126 times its other operand, whose magnitude X
// bounds: the features M, values V, scores d_φ·M², state entries T·M·V;
// and it may flush a subnormal sum, off by less than 2^-126: so each term
// is off by less than 2^-126·(X + 1). Per row that is at most d_φ·C score
// terms carried by C values, C terms of A·V, T·d_φ terms of S carried by
// the queries and d_φ of Q·S. FAVOR+ features are computed scaled (by
// e^{-log scale} of their query, and of the round's largest key exponent)
// and scaled back in the read-out, so there the term grows by
// e^{largest query log scale + largest key exponent}.
inline OperandRounding Bf16Rounding(const Attention& attention,
                                    const Tokens& data, uint32_t chunk) {
  const AttentionSpec& spec = attention.spec();
  const uint64_t rows = data.tokens * spec.num_heads;
  const uint32_t d_phi = attention.feature_dim();
  std::vector<float> phi(d_phi);
  double M = 1, V = 1;
  double log_scale[2] = {-INFINITY, -INFINITY};  // queries, keys
  for (uint64_t r = 0; r < rows; ++r) {
    int which = 0;
    for (const std::vector<float>* x : {&data.q, &data.k}) {
      const float ls = attention.feature_map().Apply(
          x->data() + r * spec.key_dim, r / spec.num_heads, phi.data());
      log_scale[which] = std::max(log_scale[which], double(ls));
      ++which;
      for (float f : phi) M = std::max(M, double(std::abs(f)));
    }
  }
  for (float v : data.v) V = std::max(V, double(std::abs(v)));
  const double T = static_cast<double>(data.tokens);
  const double X = std::max({M, V, d_phi * M * M, T * M * V});
  const double terms =
      d_phi * double(chunk) * V + chunk + T * d_phi * M + d_phi;
  const double scale = rows == 0 ? 1.0 : std::exp(log_scale[0] + log_scale[1]);
  return {.unit = 0x1.0p-8,
          .numerator_roundings = 4,
          .denominator_roundings = 2,
          .absolute = 0x1.0p-126 * (X + 1) * terms * scale};
}

// Checks every (token, head) of `got` against the reference within the bound
// above; `what` names the evaluation order in failure messages.
inline void ExpectMatchesReference(const Attention& attention,
                                   const ReferenceResult& ref,
                                   const Outputs& got, const std::string& what,
                                   const OperandRounding& rounding = {}) {
  const AttentionSpec& spec = attention.spec();
  const uint32_t H = spec.num_heads, d_v = spec.value_dim;
  const uint64_t T = ref.denominator.size() / H;
  const double rho = FeatureError(spec, ref);
  int failures = 0;
  for (uint64_t t = 0; t < T && failures < 5; ++t) {
    const double e_fp32 =
        rho +
        (3.0 * (t + 1) + 2.0 * attention.feature_dim() + 16) * kUnitRoundoff;
    // (1 + e_fp32)·(1 + u_b)^r − 1, for the numerators and denominators.
    const double e = (1 + e_fp32) * std::pow(1 + rounding.unit,
                                             rounding.numerator_roundings) -
                     1;
    const double e_den =
        (1 + e_fp32) *
            std::pow(1 + rounding.unit, rounding.denominator_roundings) -
        1;
    const double tiny = rounding.absolute;
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
          e_den * D_abs + tiny + kUnitRoundoff * std::abs(ref.denominator[row]);
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
          bound = e * N_abs + tiny + 2 * kUnitRoundoff * std::abs(y);
        } else {
          const double margin = D - e_den * D_abs - tiny;
          if (margin <= 0) continue;  // too ill-conditioned to bound
          bound = (e * N_abs + tiny + std::abs(y) * (e_den * D_abs + tiny)) /
                      margin +
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
