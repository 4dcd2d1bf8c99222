// The gated, delta, rwkv7 and rwkv6 rules (docs/design.md §1): every
// evaluation order —
// the recurrent step alone and batched, the chunkwise prefill alone and
// batched — against the float64 recurrence written from fla's naive code
// (core/attention/reference.h), within the bounds of rule_bounds.h.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/attention/attention.h"
#include "core/attention/chunkwise.h"
#include "core/attention/kernels.h"
#include "core/attention/recurrent.h"
#include "core/attention/reference.h"
#include "tests/attention/rule_bounds.h"
#include "tests/attention/test_util.h"

namespace linattn {
namespace {

using testing::Outputs;
using testing::RuleTokens;

struct Case {
  std::string name;
  UpdateRule rule;
  GateShape gate = GateShape::kHead;
  bool l2norm = false;
  float scale = 0.0f;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

AttentionSpec SpecOf(const Case& c, uint32_t H, uint32_t d_k, uint32_t d_v) {
  AttentionSpec spec{.rule = c.rule,
                     .num_heads = H,
                     .key_dim = d_k,
                     .value_dim = d_v,
                     .feature_map = FeatureMapKind::kIdentity,
                     .unnormalized = true};
  spec.gate = c.gate;
  spec.qk_l2norm = c.l2norm;
  spec.scale = c.scale;
  if (c.rule == UpdateRule::kRwkv6) spec.bonus = testing::RandomBonus(spec, 5);
  return spec;
}

std::vector<Case> AllCases() {
  return {
      {"gated_head", UpdateRule::kGated},
      {"gated_head_l2", UpdateRule::kGated, GateShape::kHead, true, 0.125f},
      {"gated_key", UpdateRule::kGated, GateShape::kKey},
      {"gated_key_l2", UpdateRule::kGated, GateShape::kKey, true, 0.25f},
      {"delta_l2", UpdateRule::kDelta, GateShape::kHead, true, 0.125f},
      {"delta_raw", UpdateRule::kDelta},
      {"gated_delta_l2", UpdateRule::kGatedDelta, GateShape::kHead, true,
       0.125f},
      {"rwkv7", UpdateRule::kRwkv7, GateShape::kKey},
      {"rwkv7_scaled", UpdateRule::kRwkv7, GateShape::kKey, false, 0.5f},
      {"rwkv6", UpdateRule::kRwkv6, GateShape::kKey},
      {"rwkv6_l2", UpdateRule::kRwkv6, GateShape::kKey, true, 0.25f},
  };
}

// Unnormalised delta-rule keys must keep β‖k‖² ≤ 2 for the state to stay
// bounded: their inputs are scaled to ‖k‖ ≲ 1.
float KeyScaleFor(const AttentionSpec& spec) {
  return HasBeta(spec.rule) && !spec.qk_l2norm
             ? 1.0f / std::sqrt(static_cast<float>(spec.key_dim))
             : 1.0f;
}

// The chunkwise order with these options; for rwkv7 its WY form at every
// width (the step's order is StepSequence's, tested beside it).
ChunkwiseOptions Chunked(ChunkwiseOptions options) {
  options.rwkv7_order = Rwkv7Order::kChunkwise;
  return options;
}

class RuleOrders : public ::testing::TestWithParam<Case> {};

// Recurrent (token by token, each ISA) and chunkwise (several chunk
// sizes, T not a multiple of C) against the reference.
TEST_P(RuleOrders, MatchTheReference) {
  const Case& c = GetParam();
  // d_v of 16, 32, 64 and 128 take each ISA's register step kernels (in
  // vectors of its own width); 40 takes the plain loops.
  for (auto [d_k, d_v] : {std::pair<uint32_t, uint32_t>{16, 16},
                          {24, 40},
                          {32, 32},
                          {64, 64},
                          {128, 128}}) {
    const AttentionSpec spec = SpecOf(c, 2, d_k, d_v);
    auto attention = Attention::Create(spec);
    ASSERT_TRUE(attention.ok()) << attention.status();
    const uint64_t T = 150;
    // Gates in [−1, 0] and in [−0.05, 0]: per key channel, the first
    // makes row blocks of 16 rows and term-by-term diagonals, the second
    // whole-chunk blocks.
    for (const float log_gate_min : {-1.0f, -0.05f}) {
      const RuleTokens data = testing::RandomRuleTokens(
          spec, T, 7 + d_k,
          {.k_scale = KeyScaleFor(spec), .log_gate_min = log_gate_min});
      const RuleReferenceResult ref = ReferenceRule(spec, data.input());
      for (const VectorKernels* kernels : SupportedKernels()) {
        ScopedKernelsOverride use(kernels);
        AttentionState state = attention->NewState();
        Outputs out(spec, T);
        ASSERT_TRUE(
            StepSequence(*attention, state, data.input(), out.view()).ok());
        testing::ExpectRuleMatchesReference(spec, data, ref, out, 1,
                                            c.name + " recurrent " +
                                                kernels->name +
                                                " d=" + std::to_string(d_k));
        testing::ExpectStateMatches(spec, data, ref, state, 1, c.name);
      }
      // 40: sub-chunks of 16, 16 and 8 rows for gates per key.
      for (uint32_t C : {1u, 16u, 40u, 64u}) {
        ChunkwiseRunner runner(Chunked({.chunk_size = C, .round_chunks = 2}));
        AttentionState state = attention->NewState();
        Outputs out(spec, T);
        ASSERT_TRUE(
            runner.Run(*attention, state, data.input(), out.view()).ok());
        EXPECT_EQ(state.position(), T);
        testing::ExpectRuleMatchesReference(
            spec, data, ref, out, C,
            c.name + " chunkwise C=" + std::to_string(C) +
                " d=" + std::to_string(d_k));
        testing::ExpectStateMatches(spec, data, ref, state, C, c.name);
      }
    }
  }
}

// Gates near 0 (α down to 1e-3 per step, and far below), β at 0 and at 2,
// and prefills that start and stop at chunk boundaries and between them.
TEST_P(RuleOrders, ExtremeGatesAndBetasAndChunkBoundaries) {
  const Case& c = GetParam();
  const AttentionSpec spec = SpecOf(c, 2, 32, 32);
  auto attention = *Attention::Create(spec);
  for (const char* regime : {"alpha_1e-3", "beta_0", "beta_2", "underflow"}) {
    testing::RuleTokenOptions options{.k_scale = KeyScaleFor(spec)};
    const std::string r = regime;
    if (r == "alpha_1e-3") options.log_gate_min = std::log(1e-3f);
    if (r == "beta_0") options.beta_fixed = 0.0f;
    if (r == "beta_2") options.beta_fixed = 2.0f;
    if (r == "underflow") options.log_gate_min = -200.0f;
    const uint64_t T = 200;
    const RuleTokens data = testing::RandomRuleTokens(spec, T, 31, options);
    const RuleReferenceResult ref = ReferenceRule(spec, data.input());
    // Prefilled in pieces of 64 | 1 | 63 | 72 tokens (C = 64), the recurrent
    // order in the same pieces.
    const uint64_t pieces[] = {64, 1, 63, 72};
    ChunkwiseRunner runner(Chunked({.chunk_size = 64}));
    AttentionState chunked = attention.NewState();
    AttentionState stepped = attention.NewState();
    Outputs out_c(spec, T), out_s(spec, T);
    uint64_t at = 0;
    for (uint64_t n : pieces) {
      const SequenceInput piece = data.slice(spec, at, n);
      ASSERT_TRUE(runner
                      .Run(attention, chunked, piece,
                           out_c.view(at, spec.num_heads, spec.value_dim))
                      .ok());
      ASSERT_TRUE(StepSequence(attention, stepped, piece,
                               out_s.view(at, spec.num_heads, spec.value_dim))
                      .ok());
      at += n;
    }
    testing::ExpectRuleMatchesReference(spec, data, ref, out_c, 64,
                                        c.name + " chunkwise " + r);
    testing::ExpectRuleMatchesReference(spec, data, ref, out_s, 1,
                                        c.name + " recurrent " + r);
    testing::ExpectStateMatches(spec, data, ref, chunked, 64, c.name + " " + r);
  }
}

// Several sessions of different lengths in one chunkwise Run, and one
// StepBatch over several sessions: each the same as alone.
TEST_P(RuleOrders, BatchedEqualsOneByOne) {
  const Case& c = GetParam();
  const AttentionSpec spec = SpecOf(c, 3, 32, 16);
  auto attention = *Attention::Create(spec);
  const uint64_t lengths[] = {70, 1, 129, 64};
  std::vector<RuleTokens> data;
  std::vector<Outputs> batched, alone;
  std::vector<AttentionState> states, alone_states;
  for (int s = 0; s < 4; ++s) {
    data.push_back(testing::RandomRuleTokens(spec, lengths[s], 100 + s,
                                             {.k_scale = KeyScaleFor(spec)}));
    batched.emplace_back(spec, lengths[s]);
    alone.emplace_back(spec, lengths[s]);
    states.push_back(attention.NewState());
    alone_states.push_back(attention.NewState());
  }
  ChunkwiseRunner runner(Chunked({.chunk_size = 32}));
  std::vector<PrefillItem> items;
  for (int s = 0; s < 4; ++s) {
    items.push_back(
        {&attention, &states[s], data[s].input(), batched[s].view()});
  }
  ASSERT_TRUE(runner.Run(items).ok());
  for (int s = 0; s < 4; ++s) {
    ChunkwiseRunner one(Chunked({.chunk_size = 32}));
    ASSERT_TRUE(
        one.Run(attention, alone_states[s], data[s].input(), alone[s].view())
            .ok());
    const RuleReferenceResult ref = ReferenceRule(spec, data[s].input());
    testing::ExpectRuleMatchesReference(spec, data[s], ref, batched[s], 32,
                                        c.name + " batched prefill");
    // The same products on the same rows: equal within the bound of each
    // against the reference, and in practice to the last bit or nearly.
    testing::ExpectRuleMatchesReference(spec, data[s], ref, alone[s], 32,
                                        c.name + " prefill alone");
  }
  // One decode step for each session at once, then alone from copies.
  const RuleTokens next =
      testing::RandomRuleTokens(spec, 1, 9, {.k_scale = KeyScaleFor(spec)});
  std::vector<AttentionState> copies;
  for (auto& s : states) copies.push_back(s.Copy());
  std::vector<Outputs> step_out, step_alone;
  std::vector<StepItem> step_items;
  for (int s = 0; s < 4; ++s) {
    step_out.emplace_back(spec, 1);
    step_alone.emplace_back(spec, 1);
  }
  for (int s = 0; s < 4; ++s) {
    step_items.push_back(
        {&attention, &states[s], next.input(), step_out[s].view()});
  }
  ASSERT_TRUE(StepBatch(step_items).ok());
  for (int s = 0; s < 4; ++s) {
    ASSERT_TRUE(
        Step(attention, copies[s], next.input(), step_alone[s].view()).ok());
    EXPECT_EQ(step_out[s].output, step_alone[s].output) << c.name;
    EXPECT_EQ(
        0, std::memcmp(states[s].data(), copies[s].data(), states[s].bytes()))
        << c.name << ": batched and alone steps must agree bit for bit";
  }
}

// A step into another state (StepItem::into) on every ISA: the state
// after the token has the bits the step in place gives, the outputs too,
// and the state read is left as it was. Register widths and the plain
// loops (d_v = 40).
TEST_P(RuleOrders, StepIntoAnotherStateGivesTheInPlaceBits) {
  const Case& c = GetParam();
  for (uint32_t d_v : {16u, 40u, 64u, 128u}) {
    const AttentionSpec spec = SpecOf(c, 2, 24, d_v);
    auto attention = *Attention::Create(spec);
    const RuleTokens data = testing::RandomRuleTokens(
        spec, 9, 40 + d_v, {.k_scale = KeyScaleFor(spec)});
    for (const VectorKernels* kernels : SupportedKernels()) {
      ScopedKernelsOverride use(kernels);
      const std::string where =
          c.name + " " + kernels->name + " d_v=" + std::to_string(d_v);
      AttentionState state = attention.NewState();
      Outputs warm(spec, 8);
      ASSERT_TRUE(
          StepSequence(attention, state, data.slice(spec, 0, 8), warm.view())
              .ok());
      AttentionState in_place = state.Copy(), before = state.Copy();
      // The target holds another state, as an engine's reused slot does.
      AttentionState into = attention.NewState();
      Outputs other(spec, 3);
      ASSERT_TRUE(
          StepSequence(attention, into, data.slice(spec, 2, 3), other.view())
              .ok());
      const SequenceInput last = data.slice(spec, 8, 1);
      Outputs out_in_place(spec, 1), out_into(spec, 1);
      ASSERT_TRUE(Step(attention, in_place, last, out_in_place.view()).ok());
      const StepItem item{&attention, &state, last, out_into.view(), &into};
      ASSERT_TRUE(StepBatch({&item, 1}).ok()) << where;
      EXPECT_EQ(out_into.output, out_in_place.output) << where;
      EXPECT_EQ(into.position(), in_place.position()) << where;
      EXPECT_EQ(0, std::memcmp(into.data(), in_place.data(), into.bytes()))
          << where;
      EXPECT_EQ(state.position(), before.position()) << where;
      EXPECT_EQ(0, std::memcmp(state.data(), before.data(), state.bytes()))
          << where << ": the state read must be left as it was";
    }
  }
}

// 65,536 tokens: the state stays finite and the outputs stay within the
// bound (H = 1, d = 16 so that the double reference stays quick).
TEST_P(RuleOrders, LongSequencesStayFinite) {
  const Case& c = GetParam();
  const AttentionSpec spec = SpecOf(c, 1, 16, 16);
  auto attention = *Attention::Create(spec);
  const uint64_t T = 65536;
  // rwkv7's transitions contract over a few tokens, not each on its own:
  // with gates near 0 its bound (a product of per-token norms) would grow
  // without limit over 64k tokens, so its gates reach lower.
  const RuleTokens data = testing::RandomRuleTokens(
      spec, T, 5,
      {.k_scale = KeyScaleFor(spec),
       .log_gate_min = HasLowRank(spec.rule) ? -1.0f : -0.05f});
  const RuleReferenceResult ref = ReferenceRule(spec, data.input());
  ChunkwiseRunner runner(Chunked({.chunk_size = 64}));
  AttentionState state = attention.NewState();
  Outputs out(spec, T);
  ASSERT_TRUE(runner.Run(attention, state, data.input(), out.view()).ok());
  EXPECT_TRUE(std::isfinite(state.MeasureMagnitude()));
  testing::ExpectRuleMatchesReference(spec, data, ref, out, 64,
                                      c.name + " 64k chunkwise");
  AttentionState stepped = attention.NewState();
  Outputs out_s(spec, T);
  ASSERT_TRUE(
      StepSequence(attention, stepped, data.input(), out_s.view()).ok());
  testing::ExpectRuleMatchesReference(spec, data, ref, out_s, 1,
                                      c.name + " 64k recurrent");
}

INSTANTIATE_TEST_SUITE_P(Rules, RuleOrders, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<Case>& p) {
                           return p.param.name;
                         });

// With every gate at 0 (α = 1) the gated rule is the linear rule with the
// identity map, unnormalised: two independent paths.
TEST(Rules, OpenGatesAreTheLinearRule) {
  AttentionSpec linear{.num_heads = 2,
                       .key_dim = 16,
                       .value_dim = 16,
                       .feature_map = FeatureMapKind::kIdentity,
                       .unnormalized = true};
  AttentionSpec gated = linear;
  gated.rule = UpdateRule::kGated;
  const uint64_t T = 40;
  RuleTokens data = testing::RandomRuleTokens(gated, T, 3, {});
  std::fill(data.g.begin(), data.g.end(), 0.0f);
  auto a_lin = *Attention::Create(linear);
  auto a_gated = *Attention::Create(gated);
  AttentionState s_lin = a_lin.NewState(), s_gated = a_gated.NewState();
  Outputs o_lin(linear, T), o_gated(gated, T);
  ASSERT_TRUE(StepSequence(a_lin, s_lin, data.input(), o_lin.view()).ok());
  ASSERT_TRUE(
      StepSequence(a_gated, s_gated, data.input(), o_gated.view()).ok());
  // Both against the gated rule's reference, within its bound (the linear
  // rule also reports φ(q)ᵀz, which the gated rule does not have).
  std::fill(o_lin.denominator.begin(), o_lin.denominator.end(), 0.0f);
  const RuleReferenceResult ref = ReferenceRule(gated, data.input());
  testing::ExpectRuleMatchesReference(gated, data, ref, o_gated, 1, "gated");
  testing::ExpectRuleMatchesReference(gated, data, ref, o_lin, 1,
                                      "linear, identity, unnormalised");
}

// One token of the delta rule from an empty state with a unit key: S = βkvᵀ
// and o = β(q·k)v, exactly as the rule says.
TEST(Rules, OneDeltaStepFromEmpty) {
  AttentionSpec spec{.rule = UpdateRule::kDelta,
                     .num_heads = 1,
                     .key_dim = 2,
                     .value_dim = 2,
                     .feature_map = FeatureMapKind::kIdentity,
                     .unnormalized = true};
  auto attention = *Attention::Create(spec);
  const float q[] = {2, 1}, k[] = {1, 0}, v[] = {3, -4}, beta[] = {0.5f};
  AttentionState state = attention.NewState();
  Outputs out(spec, 1);
  SequenceInput in{q, k, v, 1};
  in.beta = beta;
  ASSERT_TRUE(Step(attention, state, in, out.view()).ok());
  EXPECT_EQ(out.output[0], 0.5f * 2 * 3);
  EXPECT_EQ(out.output[1], 0.5f * 2 * -4);
  EXPECT_EQ(out.denominator[0], 0.0f);
  // A second token on the same key with β = 1 overwrites the association:
  // S = k v₂ᵀ.
  const float v2[] = {1, 1}, beta2[] = {1.0f};
  in.v = v2;
  in.beta = beta2;
  ASSERT_TRUE(Step(attention, state, in, out.view()).ok());
  EXPECT_EQ(out.output[0], 2.0f);
  EXPECT_EQ(out.output[1], 2.0f);
}

// The linear rule steps into another state too (S, z and FAVOR+'s key
// shifts carried over); an `into` that is the state itself, of another
// spec, or another item's state is refused and nothing changes.
TEST(Rules, StepIntoChecksItsTargetAndCarriesTheLinearRule) {
  const AttentionSpec favor{.num_heads = 2,
                            .key_dim = 20,
                            .value_dim = 16,
                            .feature_map = FeatureMapKind::kFavor,
                            .feature_dim = 24,
                            .seed = 5};
  const AttentionSpec elu{.num_heads = 2, .key_dim = 20, .value_dim = 16};
  for (const AttentionSpec& spec : {favor, elu}) {
    const Attention attention = *Attention::Create(spec);
    const testing::Tokens data = testing::RandomTokens(spec, 6, 3);
    AttentionState state = attention.NewState();
    Outputs warm(spec, 5), out(spec, 1), out_into(spec, 1);
    const SequenceInput first{data.q.data(), data.k.data(), data.v.data(), 5};
    ASSERT_TRUE(StepSequence(attention, state, first, warm.view()).ok());
    const uint64_t q_at = 5 * spec.num_heads * spec.key_dim;
    const SequenceInput last{data.q.data() + q_at, data.k.data() + q_at,
                             data.v.data() + 5 * spec.num_heads * 16, 1};
    AttentionState in_place = state.Copy(), before = state.Copy();
    // The target holds another state (FAVOR+: other key shifts too).
    AttentionState into = attention.NewState();
    Outputs earlier(spec, 2);
    const SequenceInput two{data.q.data() + q_at / 5, data.k.data() + q_at / 5,
                            data.v.data() + spec.num_heads * 16, 2};
    ASSERT_TRUE(StepSequence(attention, into, two, earlier.view()).ok());
    ASSERT_TRUE(Step(attention, in_place, last, out.view()).ok());
    const StepItem item{&attention, &state, last, out_into.view(), &into};
    ASSERT_TRUE(StepBatch({&item, 1}).ok());
    EXPECT_EQ(out_into.output, out.output);
    EXPECT_EQ(0, std::memcmp(into.data(), in_place.data(), into.bytes()));
    EXPECT_EQ(0, std::memcmp(state.data(), before.data(), state.bytes()));
    EXPECT_EQ(into.position(), 6u);
    EXPECT_EQ(state.position(), 5u);

    const Attention other = *Attention::Create(
        AttentionSpec{.num_heads = 1, .key_dim = 20, .value_dim = 16});
    AttentionState wrong = other.NewState(), second = attention.NewState();
    Outputs out2(spec, 1);
    const std::vector<StepItem> bad[] = {
        {{&attention, &state, last, out.view(), &state}},
        {{&attention, &state, last, out.view(), &wrong}},
        {{&attention, &state, last, out.view(), &second},
         {&attention, &second, last, out2.view()}}};
    for (const auto& items : bad) {
      const absl::Status s = StepBatch(items);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_EQ(0, std::memcmp(state.data(), before.data(), state.bytes()));
      EXPECT_EQ(state.position(), 5u);
      EXPECT_EQ(second.position(), 0u);
    }
  }
}

// Bad per-token inputs are refused naming the field, and nothing changes.
TEST(Rules, BadGatesAndBetasAreRefusedAndChangeNothing) {
  for (const Case& c : AllCases()) {
    const AttentionSpec spec = SpecOf(c, 2, 8, 8);
    auto attention = *Attention::Create(spec);
    const RuleTokens good = testing::RandomRuleTokens(spec, 10, 1, {});
    AttentionState state = attention.NewState();
    Outputs out(spec, 10);
    ASSERT_TRUE(StepSequence(attention, state, good.input(), out.view()).ok());
    const AttentionState before = state.Copy();
    struct Bad {
      std::string field;
      float value;
    };
    std::vector<Bad> bads;
    if (HasGates(spec.rule)) {
      bads.push_back({"g", 0.5f});
      bads.push_back({"g", NAN});
      bads.push_back({"g", -INFINITY});
    }
    if (HasBeta(spec.rule)) {
      bads.push_back({"beta", 2.5f});
      bads.push_back({"beta", -0.1f});
      bads.push_back({"beta", NAN});
    }
    if (HasLowRank(spec.rule)) {
      bads.push_back({"a", NAN});
      bads.push_back({"b", INFINITY});
    }
    for (const Bad& bad : bads) {
      RuleTokens data = good;
      std::vector<float>& field = bad.field == "g"      ? data.g
                                  : bad.field == "beta" ? data.beta
                                  : bad.field == "a"    ? data.a
                                                        : data.b;
      field[field.size() / 2] = bad.value;
      const std::string where =
          absl::StrCat(bad.field, "[", field.size() / 2, "]");
      absl::Status s = StepSequence(attention, state, data.input(), out.view());
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name;
      EXPECT_NE(s.message().find(where), std::string::npos) << s.message();
      ChunkwiseRunner runner(Chunked({.chunk_size = 4}));
      s = runner.Run(attention, state, data.input(), out.view());
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name;
      EXPECT_NE(s.message().find(where), std::string::npos) << s.message();
      EXPECT_EQ(state.position(), before.position());
      EXPECT_EQ(0, std::memcmp(state.data(), before.data(), state.bytes()))
          << c.name << " " << where;
    }
    // A missing input is named too.
    RuleTokens data = good;
    SequenceInput in = data.input();
    if (HasGates(spec.rule)) in.g = nullptr;
    if (HasBeta(spec.rule)) in.beta = nullptr;
    if (HasLowRank(spec.rule)) in.b = nullptr;
    const absl::Status s = StepSequence(attention, state, in, out.view());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("missing"), std::string::npos) << s.message();
  }
}

// One chunkwise Run over sessions whose specs share the rule and widths but
// not the head count, the L2 normalisation or the scale, and (gates per
// key) whose gates span little or much: each matches its own reference.
TEST(Rules, MixedSpecsInOneRunEachMatchTheirReference) {
  struct Member {
    Case c;
    uint32_t heads;
    float log_gate_min;
  };
  const std::vector<Member> members = {
      {{"gated_key", UpdateRule::kGated, GateShape::kKey}, 2, -0.02f},
      {{"gated_key", UpdateRule::kGated, GateShape::kKey}, 3, -1.5f},
      {{"gated_key_l2", UpdateRule::kGated, GateShape::kKey, true, 0.25f},
       2,
       -0.02f},
      {{"gated_head", UpdateRule::kGated}, 1, -1.0f},
      {{"gated_head", UpdateRule::kGated}, 4, -1.0f},
      {{"delta_l2", UpdateRule::kDelta, GateShape::kHead, true, 0.125f},
       2,
       -1.0f},
      {{"delta_raw", UpdateRule::kDelta}, 3, -1.0f},
      {{"gated_delta_l2", UpdateRule::kGatedDelta, GateShape::kHead, true,
        0.125f},
       5,
       -1.0f},
  };
  const uint64_t lengths[] = {150, 70, 129, 64, 100, 90, 33, 140};
  std::vector<Attention> attentions;
  std::vector<RuleTokens> data;
  std::vector<Outputs> outs;
  std::vector<AttentionState> states;
  for (size_t m = 0; m < members.size(); ++m) {
    const AttentionSpec spec = SpecOf(members[m].c, members[m].heads, 16, 24);
    attentions.push_back(*Attention::Create(spec));
    data.push_back(
        testing::RandomRuleTokens(spec, lengths[m], 50 + m,
                                  {.k_scale = KeyScaleFor(spec),
                                   .log_gate_min = members[m].log_gate_min}));
    outs.emplace_back(spec, lengths[m]);
  }
  for (const Attention& a : attentions) states.push_back(a.NewState());
  std::vector<PrefillItem> items;
  for (size_t m = 0; m < members.size(); ++m) {
    items.push_back(
        {&attentions[m], &states[m], data[m].input(), outs[m].view()});
  }
  ChunkwiseRunner runner(Chunked({.chunk_size = 64, .round_chunks = 1}));
  ASSERT_TRUE(runner.Run(items).ok());
  for (size_t m = 0; m < members.size(); ++m) {
    const AttentionSpec& spec = attentions[m].spec();
    const RuleReferenceResult ref = ReferenceRule(spec, data[m].input());
    const std::string what =
        absl::StrCat(members[m].c.name, " H=", members[m].heads, " in a mix");
    testing::ExpectRuleMatchesReference(spec, data[m], ref, outs[m], 64, what);
    testing::ExpectStateMatches(spec, data[m], ref, states[m], 64, what);
  }
}

// A value that is not finite in q, k or v is found by the chunkwise
// gather: all or nothing the Run fails naming it; in place with `refused`
// only that item is refused and the other completes, equal to a run alone.
TEST(Rules, NonFiniteInputsAreNamedByTheChunkwiseGather) {
  for (const Case& c : AllCases()) {
    const AttentionSpec spec = SpecOf(c, 2, 16, 8);
    auto attention = *Attention::Create(spec);
    const uint64_t T = 150;
    const RuleTokens good =
        testing::RandomRuleTokens(spec, T, 3, {.k_scale = KeyScaleFor(spec)});
    for (const char* field : {"q", "k", "v"}) {
      RuleTokens bad = good;
      std::vector<float>& values =
          field[0] == 'q' ? bad.q : (field[0] == 'k' ? bad.k : bad.v);
      // In the third chunk of 64: found in a later round than the first.
      const uint64_t at = values.size() * 140 / T + 5;
      values[at] = NAN;
      const std::string where = absl::StrCat("items[1].", field, "[", at, "]");
      AttentionState s_good = attention.NewState(),
                     s_bad = attention.NewState();
      Outputs o_good(spec, T), o_bad(spec, T);
      const PrefillItem items[] = {
          {&attention, &s_good, good.input(), o_good.view()},
          {&attention, &s_bad, bad.input(), o_bad.view()}};
      ChunkwiseRunner runner(Chunked({.chunk_size = 64, .round_chunks = 1}));
      const absl::Status all = runner.Run(items);
      EXPECT_EQ(all.code(), absl::StatusCode::kInvalidArgument) << c.name;
      EXPECT_NE(all.message().find(where), std::string::npos) << all.message();
      EXPECT_EQ(s_good.position(), 0u);
      EXPECT_EQ(s_bad.position(), 0u);
      std::vector<absl::Status> refused(2);
      ASSERT_TRUE(runner.Run(items, PrefillCommit::kInPlace, refused).ok());
      EXPECT_TRUE(refused[0].ok()) << refused[0];
      EXPECT_EQ(refused[1].code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(refused[1].message().find(where), std::string::npos)
          << refused[1].message();
      AttentionState alone = attention.NewState();
      Outputs o_alone(spec, T);
      ASSERT_TRUE(
          runner.Run(attention, alone, good.input(), o_alone.view()).ok());
      EXPECT_EQ(0, std::memcmp(alone.data(), s_good.data(), alone.bytes()))
          << c.name << " " << field;
      EXPECT_EQ(o_alone.output, o_good.output) << c.name << " " << field;
    }
  }
}

TEST(Rules, SpecsAreCheckedFieldByField) {
  auto message = [](AttentionSpec spec) {
    return std::string(ValidateSpec(spec).message());
  };
  AttentionSpec ok{.rule = UpdateRule::kGated,
                   .num_heads = 2,
                   .key_dim = 8,
                   .value_dim = 8,
                   .feature_map = FeatureMapKind::kIdentity,
                   .unnormalized = true};
  EXPECT_TRUE(ValidateSpec(ok).ok());
  AttentionSpec s = ok;
  s.feature_map = FeatureMapKind::kElu1;
  EXPECT_EQ(message(s).rfind("feature_map:", 0), 0u) << message(s);
  s = ok;
  s.unnormalized = false;
  EXPECT_EQ(message(s).rfind("unnormalized:", 0), 0u) << message(s);
  s = ok;
  s.decay = {0.5f, 0.5f};
  EXPECT_EQ(message(s).rfind("decay:", 0), 0u) << message(s);
  s = ok;
  s.rule = UpdateRule::kGatedDelta;
  s.gate = GateShape::kKey;
  EXPECT_EQ(message(s).rfind("gate:", 0), 0u) << message(s);
  s = ok;
  s.scale = -1;
  EXPECT_EQ(message(s).rfind("scale:", 0), 0u) << message(s);
  AttentionSpec linear{.num_heads = 1, .key_dim = 4, .value_dim = 4};
  linear.qk_l2norm = true;
  EXPECT_EQ(message(linear).rfind("qk_l2norm:", 0), 0u) << message(linear);
  EXPECT_TRUE(ParseUpdateRule("gated_delta").ok());
  EXPECT_EQ(ParseUpdateRule("mamba").status().message().rfind("rule:", 0), 0u);
  // No z: the state is S alone.
  EXPECT_EQ(StateBytes(ok), 2u * 8 * 8 * 4);
}

}  // namespace
}  // namespace linattn
