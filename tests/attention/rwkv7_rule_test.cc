// The rwkv7 rule (core/attention/spec.h) against RWKV-7's own statement of
// its time-mix state, written from BlinkDL's numpy reference
// (BlinkDL/RWKV-LM, RWKV-v7/rwkv_v7_numpy.py, time_mixing):
//   S = S * w.mT - S @ kk * (kk*a).mT + v * k.mT;   y = S @ r
// with S indexed (value, key). linattn keeps fla's (key, value) layout and
// takes a = −κ̂, b = κ̂ ⊙ a_lr; these tests hold that mapping, the spec's
// checks and the error bound's reach. rules_test.cc runs the rule through
// every evaluation order against the float64 recurrence.
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

AttentionSpec Rwkv7Spec(uint32_t heads, uint32_t d_k, uint32_t d_v) {
  return testing::KeyGatedSpec(UpdateRule::kRwkv7, heads, d_k, d_v);
}

// Three tokens of one head in BlinkDL's layout and form, in double, beside
// the same recursion on absolute values (what the rounding of each term is
// relative to).
TEST(Rwkv7Rule, StepsAreBlinkDLsTimeMixState) {
  constexpr uint32_t N = 4;  // head size: keys and values
  const AttentionSpec spec = Rwkv7Spec(1, N, N);
  const Attention attention = *Attention::Create(spec);
  AttentionState state = attention.NewState();
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f), rate(0.0f, 1.0f),
      log_decay(-0.6065f, 0.0f);
  double S[N][N] = {}, S_abs[N][N] = {};  // (value, key)
  for (int t = 0; t < 3; ++t) {
    float r[N], k[N], v[N], g[N], kk[N], lr[N], a[N], b[N];
    double norm = 0;
    for (uint32_t i = 0; i < N; ++i) {
      r[i] = unit(rng), k[i] = unit(rng), v[i] = unit(rng);
      g[i] = log_decay(rng), kk[i] = unit(rng), lr[i] = rate(rng);
      norm += double(kk[i]) * kk[i];
    }
    for (uint32_t i = 0; i < N; ++i) {
      kk[i] = static_cast<float>(kk[i] / std::sqrt(norm));
      a[i] = -kk[i];
      b[i] = kk[i] * lr[i];
    }
    SequenceInput in{r, k, v, 1, g};
    in.a = a;
    in.b = b;
    testing::Outputs out(spec, 1);
    ASSERT_TRUE(Step(attention, state, in, out.view()).ok());

    double Skk[N] = {}, Skk_abs[N] = {};
    for (uint32_t x = 0; x < N; ++x) {
      for (uint32_t m = 0; m < N; ++m) {
        Skk[x] += S[x][m] * kk[m];
        Skk_abs[x] += S_abs[x][m] * std::abs(kk[m]);
      }
    }
    for (uint32_t x = 0; x < N; ++x) {
      for (uint32_t j = 0; j < N; ++j) {
        const double w = std::exp(double(g[j]));
        S[x][j] = S[x][j] * w - Skk[x] * (double(kk[j]) * lr[j]) +
                  double(v[x]) * k[j];
        S_abs[x][j] = S_abs[x][j] * w +
                      Skk_abs[x] * std::abs(double(kk[j]) * lr[j]) +
                      std::abs(double(v[x]) * k[j]);
      }
    }
    for (uint32_t x = 0; x < N; ++x) {
      double y = 0, y_abs = 0;
      for (uint32_t j = 0; j < N; ++j) {
        y += S[x][j] * r[j];
        y_abs += S_abs[x][j] * std::abs(r[j]);
      }
      // Each step: a 4-term product, three rounded terms, exp within 2 ulp;
      // the read-out a 4-term product: well inside 64u of the absolute sum.
      EXPECT_NEAR(out.output[x], y, 64 * testing::kUnitRoundoff * y_abs)
          << "token " << t << " value " << x;
    }
  }
  // The state itself, transposed.
  for (uint32_t x = 0; x < N; ++x) {
    for (uint32_t j = 0; j < N; ++j) {
      EXPECT_NEAR(state.s(0)[j * N + x], S[x][j],
                  64 * testing::kUnitRoundoff * S_abs[x][j]);
    }
  }
}

// With RWKV-7's decays (log-decay in [−e^{−0.5}, 0), as its models make
// them) the bound rules_test.cc holds the rule to stays within 1e-3 of the
// state's norm over 400 tokens (κ ≈ 150 roundings per step, carried
// through windows that contract): a wrong term cannot hide in it.
TEST(Rwkv7Rule, TheErrorBoundStaysTightWithRwkv7Decays) {
  const AttentionSpec spec = Rwkv7Spec(2, 32, 32);
  const Attention attention = *Attention::Create(spec);
  const uint64_t T = 400;
  const testing::RuleTokens data = testing::RandomRuleTokens(
      spec, T, 3, {.log_gate_min = -0.6065306597126334f});
  const RuleReferenceResult ref = ReferenceRule(spec, data.input());
  const std::vector<double> bound = RuleStateErrors(spec, data.input(), ref, 1);
  for (uint32_t h = 0; h < spec.num_heads; ++h) {
    const uint64_t last = (T - 1) * spec.num_heads + h;
    EXPECT_LT(bound[last], 1e-3 * ref.state_norm[last]) << "head " << h;
  }
  AttentionState state = attention.NewState();
  testing::Outputs out(spec, T);
  ASSERT_TRUE(StepSequence(attention, state, data.input(), out.view()).ok());
  testing::ExpectRuleMatchesReference(spec, data, ref, out, 1, "rwkv7");
  testing::ExpectStateMatches(spec, data, ref, state, 1, "rwkv7");
  // The chunkwise WY form, whose bound counts a chunk's products and its
  // blocks' factors: still within 1e-2 of the state at C = 64.
  for (const uint32_t C : {16u, 64u}) {
    const std::vector<double> chunk_bound =
        RuleStateErrors(spec, data.input(), ref, C);
    for (uint32_t h = 0; h < spec.num_heads; ++h) {
      const uint64_t last = (T - 1) * spec.num_heads + h;
      EXPECT_LT(chunk_bound[last], 1e-2 * ref.state_norm[last])
          << "head " << h << " C=" << C;
    }
    ChunkwiseRunner runner(
        {.chunk_size = C, .rwkv7_order = Rwkv7Order::kChunkwise});
    AttentionState chunked = attention.NewState();
    testing::Outputs out_c(spec, T);
    ASSERT_TRUE(
        runner.Run(attention, chunked, data.input(), out_c.view()).ok());
    const std::string what = "rwkv7 chunkwise C=" + std::to_string(C);
    testing::ExpectRuleMatchesReference(spec, data, ref, out_c, C, what);
    testing::ExpectStateMatches(spec, data, ref, chunked, C, what);
  }
}

TEST(Rwkv7Rule, SpecsAndInputsAreChecked) {
  EXPECT_EQ(*ParseUpdateRule("rwkv7"), UpdateRule::kRwkv7);
  EXPECT_EQ(UpdateRuleName(UpdateRule::kRwkv7), "rwkv7");
  AttentionSpec spec = Rwkv7Spec(2, 8, 8);
  EXPECT_TRUE(ValidateSpec(spec).ok());
  EXPECT_EQ(GatesPerHead(spec), 8u);
  EXPECT_EQ(StateFloatsPerHead(spec), 64u);  // S alone, no z
  spec.gate = GateShape::kHead;
  absl::Status s = ValidateSpec(spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(s.message(), "gate:")) << s.message();
  spec = Rwkv7Spec(2, 8, 8);
  spec.unnormalized = false;
  EXPECT_TRUE(absl::StartsWith(ValidateSpec(spec).message(), "unnormalized:"));

  // a missing; a row whose ‖a‖‖b‖ is past fp32's squares still measured.
  spec = Rwkv7Spec(1, 2, 2);
  const Attention attention = *Attention::Create(spec);
  AttentionState state = attention.NewState();
  const float q[] = {1, 1}, k[] = {1, 0}, v[] = {1, 2}, g[] = {0, -1};
  const float big[] = {3e30f, 0}, small[] = {0, 1e-30f};
  SequenceInput in{q, k, v, 1, g};
  in.b = small;
  testing::Outputs out(spec, 1);
  s = Step(attention, state, in, out.view());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::EndsWith(s.message(), "a: missing")) << s.message();
  in.a = big;
  InputMagnitude m;
  ASSERT_TRUE(attention.ValidateInput(state, in, true, &m).ok());
  EXPECT_NEAR(m.low_rank, 3e30 * 1e-30, 1e-6);
}

}  // namespace
}  // namespace linattn
