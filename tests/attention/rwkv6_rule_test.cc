// The rwkv6 rule (core/attention/spec.h) against RWKV-6's own statement of
// its time-mix state, written from BlinkDL's demo (BlinkDL/RWKV-LM,
// RWKV-v5/rwkv_v6_demo.py, time_mixing):
//   w = exp(−exp(w));  a = k @ v;  x = r @ (time_first * a + s);
//   s = a + w * s
// with s indexed (key, value) as fla's and linattn's, time_first = u (the
// spec's bonus). These tests hold that form, the bonus being each session's
// own in a batch, and the spec's checks; rules_test.cc runs the rule
// through every evaluation order against the float64 recurrence.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "core/attention/attention.h"
#include "core/attention/chunkwise.h"
#include "core/attention/recurrent.h"
#include "core/attention/reference.h"
#include "core/attention/spec.h"
#include "core/attention/state.h"
#include "tests/attention/rule_bounds.h"
#include "tests/attention/test_util.h"

namespace linattn {
namespace {

AttentionSpec Rwkv6Spec(uint32_t heads, uint32_t d_k, uint32_t d_v,
                        uint64_t bonus_seed = 1) {
  AttentionSpec spec =
      testing::KeyGatedSpec(UpdateRule::kRwkv6, heads, d_k, d_v);
  spec.bonus = testing::RandomBonus(spec, bonus_seed);
  return spec;
}

// Four tokens of one head in BlinkDL's form, in double, beside the same
// recursion on absolute values (what each term's rounding is relative to).
TEST(Rwkv6Rule, StepsAreBlinkDLsTimeMixState) {
  constexpr uint32_t N = 4;  // head size: keys and values
  const AttentionSpec spec = Rwkv6Spec(1, N, N);
  const Attention attention = *Attention::Create(spec);
  AttentionState state = attention.NewState();
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f), raw(-3.0f, 1.0f);
  double s[N][N] = {}, s_abs[N][N] = {};  // (key, value)
  for (int t = 0; t < 4; ++t) {
    float r[N], k[N], v[N], g[N];
    double w[N];
    for (uint32_t i = 0; i < N; ++i) {
      r[i] = unit(rng), k[i] = unit(rng), v[i] = unit(rng);
      // The demo's decay exp(−exp(w)); linattn takes its log, −exp(w).
      const float w_raw = raw(rng);
      g[i] = -std::exp(w_raw);
      w[i] = std::exp(-std::exp(double(w_raw)));
    }
    SequenceInput in{r, k, v, 1, g};
    testing::Outputs out(spec, 1);
    ASSERT_TRUE(Step(attention, state, in, out.view()).ok());
    double a[N][N];
    for (uint32_t i = 0; i < N; ++i) {
      for (uint32_t j = 0; j < N; ++j) a[i][j] = double(k[i]) * v[j];
    }
    // x = r @ (time_first * a + s)
    for (uint32_t j = 0; j < N; ++j) {
      double x = 0, x_abs = 0;
      for (uint32_t i = 0; i < N; ++i) {
        const double u = spec.bonus[i];
        x += r[i] * (u * a[i][j] + s[i][j]);
        x_abs += std::abs(r[i]) * (std::abs(u * a[i][j]) + s_abs[i][j]);
      }
      // Each step: a rounded exp (2 ulp) and two rounded terms per entry,
      // four per entry of the token's own term, the read-out a 4-term sum:
      // well inside 64u of the absolute sum.
      EXPECT_NEAR(out.output[j], x, 64 * testing::kUnitRoundoff * x_abs)
          << "token " << t << " value " << j;
    }
    // s = a + w * s
    for (uint32_t i = 0; i < N; ++i) {
      for (uint32_t j = 0; j < N; ++j) {
        s[i][j] = a[i][j] + w[i] * s[i][j];
        s_abs[i][j] = std::abs(a[i][j]) + w[i] * s_abs[i][j];
      }
    }
  }
  for (uint32_t i = 0; i < N; ++i) {
    for (uint32_t j = 0; j < N; ++j) {
      EXPECT_NEAR(state.s(0)[i * N + j], s[i][j],
                  64 * testing::kUnitRoundoff * s_abs[i][j]);
    }
  }
}

// The first token reads an empty state: its output is its own term alone,
// (Σ_c q_c u_c k_c)·v, and the gate does not touch it.
TEST(Rwkv6Rule, TheFirstTokenReadsOnlyItsOwnTerm) {
  AttentionSpec spec = Rwkv6Spec(1, 2, 2);
  spec.bonus = {0.5f, -2.0f};
  const Attention attention = *Attention::Create(spec);
  AttentionState state = attention.NewState();
  const float q[] = {1.0f, 0.25f}, k[] = {2.0f, 4.0f}, v[] = {1.0f, -3.0f};
  const float g[] = {-50.0f, -0.5f};
  testing::Outputs out(spec, 1);
  ASSERT_TRUE(Step(attention, state, {q, k, v, 1, g}, out.view()).ok());
  // 1·0.5·2 + 0.25·(−2)·4 = 1 − 2 = −1: exact in fp32.
  EXPECT_EQ(out.output[0], -1.0f);
  EXPECT_EQ(out.output[1], 3.0f);
  // S = k vᵀ, undecayed.
  EXPECT_EQ(state.s(0)[0], 2.0f);
  EXPECT_EQ(state.s(0)[3], -12.0f);
}

// Sessions that share a shape but not their bonus run in one batch, in
// both orders: each reads its own u.
TEST(Rwkv6Rule, EachSessionOfABatchReadsItsOwnBonus) {
  const uint64_t T = 90;
  std::vector<Attention> attentions;
  for (uint64_t seed : {1u, 2u, 3u}) {
    attentions.push_back(*Attention::Create(Rwkv6Spec(2, 16, 16, seed)));
  }
  // The same inputs for all three: only u differs.
  const testing::RuleTokens data =
      testing::RandomRuleTokens(attentions[0].spec(), T, 9, {});
  std::vector<AttentionState> states;
  std::vector<testing::Outputs> outs;
  for (const Attention& a : attentions) {
    states.push_back(a.NewState());
    outs.emplace_back(a.spec(), T);
  }
  std::vector<PrefillItem> items;
  for (size_t m = 0; m < attentions.size(); ++m) {
    items.push_back({&attentions[m], &states[m], data.input(), outs[m].view()});
  }
  ChunkwiseRunner runner({.chunk_size = 32});
  ASSERT_TRUE(runner.Run(items).ok());
  for (size_t m = 0; m < attentions.size(); ++m) {
    const AttentionSpec& spec = attentions[m].spec();
    const RuleReferenceResult ref = ReferenceRule(spec, data.input());
    const std::string what = "bonus " + std::to_string(m) + " in a batch";
    testing::ExpectRuleMatchesReference(spec, data, ref, outs[m], 32, what);
    testing::ExpectStateMatches(spec, data, ref, states[m], 32, what);
  }
  // The states agree (u never enters them), the outputs do not.
  EXPECT_NE(outs[0].output, outs[1].output);
  // A decode batch likewise: one step of all three from their states.
  std::vector<StepItem> steps;
  std::vector<testing::Outputs> step_outs;
  const testing::RuleTokens next =
      testing::RandomRuleTokens(attentions[0].spec(), 1, 10, {});
  for (size_t m = 0; m < attentions.size(); ++m) {
    step_outs.emplace_back(attentions[m].spec(), 1);
  }
  for (size_t m = 0; m < attentions.size(); ++m) {
    steps.push_back(
        {&attentions[m], &states[m], next.input(), step_outs[m].view()});
  }
  std::vector<AttentionState> alone;
  for (const AttentionState& st : states) alone.push_back(st.Copy());
  ASSERT_TRUE(StepBatch(steps).ok());
  for (size_t m = 0; m < attentions.size(); ++m) {
    testing::Outputs one(attentions[m].spec(), 1);
    ASSERT_TRUE(Step(attentions[m], alone[m], next.input(), one.view()).ok());
    EXPECT_EQ(one.output, step_outs[m].output) << "session " << m;
  }
}

TEST(Rwkv6Rule, SpecsAreChecked) {
  EXPECT_EQ(*ParseUpdateRule("rwkv6"), UpdateRule::kRwkv6);
  EXPECT_EQ(UpdateRuleName(UpdateRule::kRwkv6), "rwkv6");
  AttentionSpec spec = Rwkv6Spec(2, 8, 4);
  EXPECT_TRUE(ValidateSpec(spec).ok());
  EXPECT_EQ(GatesPerHead(spec), 8u);
  EXPECT_EQ(StateFloatsPerHead(spec), 32u);  // S alone, no z
  EXPECT_EQ(ParameterBytes(spec), 2u * 8 * 4);
  auto refused = [](const AttentionSpec& s, const std::string& prefix) {
    const absl::Status status = ValidateSpec(s);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << prefix;
    EXPECT_TRUE(absl::StartsWith(status.message(), prefix)) << status.message();
  };
  spec.bonus.pop_back();
  refused(spec, "bonus: rule rwkv6 takes num_heads × key_dim = 16");
  spec = Rwkv6Spec(2, 8, 4);
  spec.bonus[5] = NAN;
  refused(spec, "bonus[5]: must be finite");
  spec = Rwkv6Spec(2, 8, 4);
  spec.gate = GateShape::kHead;
  refused(spec, "gate:");
  spec = Rwkv6Spec(2, 8, 4);
  spec.unnormalized = false;
  refused(spec, "unnormalized:");
  // Every other rule refuses a bonus.
  AttentionSpec gated = Rwkv6Spec(2, 8, 4);
  gated.rule = UpdateRule::kGated;
  refused(gated, "bonus: only rule rwkv6");
  AttentionSpec linear{.num_heads = 1, .key_dim = 2, .value_dim = 2};
  linear.bonus = {1.0f, 1.0f};
  refused(linear, "bonus: only rule rwkv6");
}

}  // namespace
}  // namespace linattn
