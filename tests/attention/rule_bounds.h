// Random inputs of the gated and delta rules, and the checks that hold
// their evaluation orders to the float64 recurrence (core/attention/
// reference.h) within the fp32 bounds core/attention/rule_bounds.h derives.
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
#include "core/attention/rule_bounds.h"
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
  const uint32_t H = spec.num_heads, V = spec.value_dim;
  const uint64_t T = data.tokens;
  const std::vector<double> bounds =
      RuleOutputBounds(spec, data.input(), ref, C);
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
        if (!WithinBound(
                got.output[e], y, bounds[e],
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
  const std::vector<double> state_error =
      RuleStateErrors(spec, data.input(), ref, C);
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
        bound +=
            GatedRuleBound(double(data.tokens), K, C, GatesPerHead(spec) > 1,
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
