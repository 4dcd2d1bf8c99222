// Bad input is rejected with a message naming the field, and a failed call
// leaves every state (block and position) exactly as it was.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/attention/chunkwise.h"
#include "core/attention/recurrent.h"
#include "tests/attention/test_util.h"

namespace linattn {
namespace {

using ::testing::HasSubstr;

// A state after some real tokens, so "unchanged" is not just "still zero".
AttentionState Warm(const Attention& attention, uint64_t tokens) {
  AttentionState state = attention.NewState();
  testing::Tokens data = testing::RandomTokens(attention.spec(), tokens, 99);
  testing::Outputs out(attention.spec(), tokens);
  EXPECT_TRUE(StepSequence(attention, state, data.input(), out.view()).ok());
  return state;
}

void ExpectSame(const AttentionState& a, const AttentionState& b) {
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(a.position(), b.position());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

class Errors : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = {.num_heads = 2,
             .key_dim = 3,
             .value_dim = 4,
             .feature_map = FeatureMapKind::kFavor};
    attention_.emplace(*Attention::Create(spec_));
    data_ = testing::RandomTokens(spec_, 20, 1);
  }
  AttentionSpec spec_;
  std::optional<Attention> attention_;
  testing::Tokens data_;
};

TEST_F(Errors, NonFiniteInputNamesTheFieldAndChangesNothing) {
  for (int which = 0; which < 3; ++which) {
    AttentionState state = Warm(*attention_, 5);
    const AttentionState before = state.Copy();
    testing::Tokens bad = data_;
    std::vector<float>& field = which == 0 ? bad.q : which == 1 ? bad.k : bad.v;
    field[field.size() - 2] = which == 1 ? INFINITY : NAN;
    const std::string name = which == 0 ? "q[" : which == 1 ? "k[" : "v[";
    testing::Outputs out(spec_, bad.tokens);

    absl::Status s = StepSequence(*attention_, state, bad.input(), out.view());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr(name));
    ExpectSame(state, before);

    ChunkwiseRunner runner;
    s = runner.Run(*attention_, state, bad.input(), out.view());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr(name));
    ExpectSame(state, before);
  }
}

TEST_F(Errors, ABadItemFailsTheWholeBatchAndChangesNoSession) {
  AttentionState a = Warm(*attention_, 3), b = Warm(*attention_, 7);
  const AttentionState a0 = a.Copy(), b0 = b.Copy();
  testing::Tokens bad = data_;
  bad.v[5] = NAN;
  testing::Outputs out_a(spec_, 20), out_b(spec_, 20);
  std::vector<PrefillItem> items = {
      {&*attention_, &a, data_.input(), out_a.view()},
      {&*attention_, &b, bad.input(), out_b.view()}};
  ChunkwiseRunner runner;
  absl::Status s = runner.Run(items);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("items[1].v[5]"));
  ExpectSame(a, a0);
  ExpectSame(b, b0);

  std::vector<StepItem> steps = {
      {&*attention_,
       &a,
       {data_.q.data(), data_.k.data(), data_.v.data(), 1},
       out_a.view()},
      {&*attention_,
       &b,
       {bad.q.data(), bad.k.data(), bad.v.data() + 4, 1},
       out_b.view()}};
  s = StepBatch(steps);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("items[1].v[1]"));
  ExpectSame(a, a0);
  ExpectSame(b, b0);

  // The same state twice in one batch would race with itself.
  steps[1] = steps[0];
  s = StepBatch(steps);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("same state"));
  ExpectSame(a, a0);
}

TEST_F(Errors, CheckedStepsRunEveryItemThatPassedAndNoOther) {
  // Three sessions, the middle one's token not finite, a fourth item on the
  // first's state: checked item by item, the good ones run, bit for bit as
  // alone; the bad one and the repeated state change nothing.
  AttentionState a = Warm(*attention_, 3), b = Warm(*attention_, 7),
                 c = Warm(*attention_, 5);
  const AttentionState b0 = b.Copy();
  AttentionState a_alone = a.Copy(), c_alone = c.Copy();
  testing::Tokens bad = data_;
  bad.k[2] = INFINITY;
  testing::Outputs out(spec_, 4), alone(spec_, 2);
  auto token = [](const testing::Tokens& t) {
    return SequenceInput{t.q.data(), t.k.data(), t.v.data(), 1};
  };
  const uint32_t H = spec_.num_heads;
  std::vector<StepItem> steps = {
      {&*attention_, &a, token(data_), out.view(0, H, spec_.value_dim)},
      {&*attention_, &b, token(bad), out.view(1, H, spec_.value_dim)},
      {&*attention_, &c, token(data_), out.view(2, H, spec_.value_dim)},
      {&*attention_, &a, token(data_), out.view(3, H, spec_.value_dim)}};
  std::vector<absl::Status> results(steps.size());
  std::vector<double> grown(steps.size());
  CheckSteps(steps, results, grown);
  EXPECT_TRUE(results[0].ok()) << results[0];
  EXPECT_EQ(results[1].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(results[1].message()), HasSubstr("k[2]"));
  EXPECT_TRUE(results[2].ok()) << results[2];
  EXPECT_THAT(std::string(results[3].message()), HasSubstr("same state"));
  RunCheckedSteps(steps, results, grown);
  ExpectSame(b, b0);
  ASSERT_TRUE(Step(*attention_, a_alone, token(data_),
                   alone.view(0, H, spec_.value_dim))
                  .ok());
  ASSERT_TRUE(Step(*attention_, c_alone, token(data_),
                   alone.view(1, H, spec_.value_dim))
                  .ok());
  ExpectSame(a, a_alone);
  ExpectSame(c, c_alone);
  const size_t row = size_t{H} * spec_.value_dim;
  EXPECT_EQ(0, std::memcmp(out.output.data(), alone.output.data(),
                           row * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(out.output.data() + 2 * row,
                           alone.output.data() + row, row * sizeof(float)));

  // A caller may refuse more after the checks (a commit that did not take
  // an item): that item does not run.
  const AttentionState c1 = c.Copy();
  steps.resize(3);
  results.assign(3, absl::OkStatus());
  CheckSteps(steps, results, grown);
  results[2] = absl::AbortedError("not recorded");
  RunCheckedSteps(steps, results, grown);
  ExpectSame(c, c1);
  EXPECT_EQ(a.position(), a_alone.position() + 1);
}

TEST_F(Errors, WrongShapesAndArguments) {
  AttentionState state = Warm(*attention_, 2);
  const AttentionState before = state.Copy();
  testing::Outputs out(spec_, 20);
  // A state of another shape.
  AttentionSpec other = spec_;
  other.value_dim = 5;
  auto other_attention = Attention::Create(other);
  absl::Status s =
      StepSequence(*other_attention, state, data_.input(), out.view());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("state"));
  // A step of more than one token.
  StepItem item{&*attention_, &state, data_.input(), out.view()};
  s = StepBatch({&item, 1});
  EXPECT_THAT(std::string(s.message()), HasSubstr("tokens"));
  // Missing buffers.
  s = StepSequence(*attention_, state,
                   {nullptr, data_.k.data(), data_.v.data(), 3}, out.view());
  EXPECT_THAT(std::string(s.message()), HasSubstr("q: missing"));
  // A chunk size out of range.
  ChunkwiseRunner zero({.chunk_size = 0});
  s = zero.Run(*attention_, state, data_.input(), out.view());
  EXPECT_THAT(std::string(s.message()), HasSubstr("chunk_size"));
  ExpectSame(state, before);
}

TEST(ErrorsCosine, PositionsPastTheHorizonAreOutOfRange) {
  AttentionSpec spec{.num_heads = 1,
                     .key_dim = 2,
                     .value_dim = 2,
                     .feature_map = FeatureMapKind::kCosine,
                     .horizon = 10};
  auto attention = Attention::Create(spec);
  ASSERT_TRUE(attention.ok());
  AttentionState state = attention->NewState();
  testing::Tokens data = testing::RandomTokens(spec, 11, 2);
  testing::Outputs out(spec, 11);
  absl::Status s = StepSequence(*attention, state, data.input(), out.view());
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(s.message()), HasSubstr("horizon"));
  EXPECT_EQ(state.position(), 0u);
  data.tokens = 10;
  EXPECT_TRUE(StepSequence(*attention, state, data.input(), out.view()).ok());
}

// Finite but huge inputs that would take S or z past fp32's range are
// refused (OUT_OF_RANGE naming k and v) and change nothing, in every
// evaluation order; steps that stay finite, however close to the edge,
// are accepted and exact.
class Overflow : public ::testing::Test {
 protected:
  // One head, d_k = d_v = 1, ELU+1: φ(k) = k + 1, so each token of k = v =
  // 1e19 adds fl(1e19 + 1)·1e19 = 1e38 to S. Three fit below fp32's
  // 3.4e38; the fourth does not.
  const AttentionSpec spec_{
      .num_heads = 1, .key_dim = 1, .value_dim = 1, .epsilon = 1e-6f};
  const Attention attention_ = *Attention::Create(spec_);
  std::vector<float> q_ = std::vector<float>(8, 1.0f);
  std::vector<float> kv_ = std::vector<float>(8, 1e19f);
  SequenceInput Input(uint64_t tokens) const {
    return {q_.data(), kv_.data(), kv_.data(), tokens};
  }
};

TEST_F(Overflow, StepsAreRefusedOnlyWhenTheStateWouldLeaveFp32) {
  AttentionState state = attention_.NewState();
  testing::Outputs out(spec_, 1);
  for (int t = 0; t < 3; ++t) {
    ASSERT_TRUE(Step(attention_, state, Input(1), out.view()).ok()) << t;
  }
  EXPECT_FLOAT_EQ(state.s(0)[0], 3e38f);
  const AttentionState before = state.Copy();
  absl::Status s = Step(attention_, state, Input(1), out.view());
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(s.message()), HasSubstr("k, v"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("overflow"));
  ExpectSame(state, before);
  // Smaller values still go in, and the state stays finite and exact.
  std::fill(kv_.begin(), kv_.end(), 1e18f);
  ASSERT_TRUE(Step(attention_, state, Input(1), out.view()).ok());
  EXPECT_FLOAT_EQ(state.s(0)[0], 3e38f + 1e36f);
}

TEST_F(Overflow, SequencesAndChunkwiseRefuseTheSameAndChangeNothing) {
  ChunkwiseRunner runner({.chunk_size = 2});
  for (int order = 0; order < 2; ++order) {
    SCOPED_TRACE(order == 0 ? "StepSequence" : "chunkwise");
    auto run = [&](AttentionState& state, uint64_t tokens) {
      testing::Outputs out(spec_, tokens);
      return order == 0
                 ? StepSequence(attention_, state, Input(tokens), out.view())
                 : runner.Run(attention_, state, Input(tokens), out.view());
    };
    AttentionState state = attention_.NewState();
    const AttentionState before = state.Copy();
    absl::Status s = run(state, 4);
    EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
    ExpectSame(state, before);
    ASSERT_TRUE(run(state, 3).ok());
    EXPECT_EQ(state.position(), 3u);
    EXPECT_TRUE(std::isfinite(state.s(0)[0]));
    const AttentionState full = state.Copy();
    EXPECT_EQ(run(state, 1).code(), absl::StatusCode::kOutOfRange);
    ExpectSame(state, full);
  }
}

// In a batch, the item that would overflow is named and nothing changes.
TEST_F(Overflow, ABatchWithAnOverflowingItemChangesNoSession) {
  AttentionState calm = attention_.NewState();
  AttentionState hot = attention_.NewState();
  testing::Outputs out(spec_, 1);
  for (int t = 0; t < 3; ++t) {
    ASSERT_TRUE(Step(attention_, hot, Input(1), out.view()).ok());
  }
  const AttentionState calm_before = calm.Copy(), hot_before = hot.Copy();
  std::vector<float> small(1, 0.5f);
  testing::Outputs out2(spec_, 1);
  const StepItem items[] = {{&attention_,
                             &calm,
                             {small.data(), small.data(), small.data(), 1},
                             out.view()},
                            {&attention_, &hot, Input(1), out2.view()}};
  absl::Status s = StepBatch(items);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(s.message()), HasSubstr("items[1]"));
  ExpectSame(calm, calm_before);
  ExpectSame(hot, hot_before);
}

// A state written directly (as a restore does) has no trusted bound: the
// next step measures it instead of assuming it is small.
TEST_F(Overflow, AStateWrittenDirectlyIsMeasuredBeforeItIsTrusted) {
  AttentionState state = attention_.NewState();
  testing::Outputs out(spec_, 1);
  ASSERT_TRUE(Step(attention_, state, Input(1), out.view()).ok());
  state.data()[0] = 3e38f;  // S, as a snapshot could hold it
  EXPECT_EQ(state.magnitude_bound(), INFINITY);
  std::fill(kv_.begin(), kv_.end(), 1e19f);
  EXPECT_EQ(Step(attention_, state, Input(1), out.view()).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(state.s(0)[0], 3e38f);
}

// FAVOR+ computes its exponents in fp32: inputs past 2^50 would turn the
// features into NaN, so they are refused before any state changes.
TEST(OverflowFavor, InputsPastItsRangeAreRefused) {
  const AttentionSpec spec{.num_heads = 1,
                           .key_dim = 64,
                           .value_dim = 1,
                           .feature_map = FeatureMapKind::kFavor,
                           .epsilon = 1e-6f};
  const Attention attention = *Attention::Create(spec);
  AttentionState state = attention.NewState();
  const AttentionState before = state.Copy();
  std::vector<float> q(64, 0.5f), k(64, 1e19f), v(1, 1.0f);
  testing::Outputs out(spec, 1);
  absl::Status s =
      Step(attention, state, {q.data(), k.data(), v.data(), 1}, out.view());
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(s.message()), HasSubstr("k: favor"));
  ExpectSame(state, before);
  EXPECT_TRUE(std::isinf(state.key_shift(0)));
  // Through the chunkwise order the result is measured before it commits.
  ChunkwiseRunner runner;
  EXPECT_FALSE(
      runner
          .Run(attention, state, {q.data(), k.data(), v.data(), 1}, out.view())
          .ok());
  ExpectSame(state, before);
  // At the bound, the features and the state stay finite.
  std::fill(k.begin(), k.end(), kMaxFavorInput);
  ASSERT_TRUE(
      Step(attention, state, {q.data(), k.data(), v.data(), 1}, out.view())
          .ok());
  EXPECT_TRUE(std::isfinite(state.MeasureMagnitude()));
}

}  // namespace
}  // namespace linattn

namespace linattn {
namespace {

// In place with a status per item, a prefill item whose input is not finite
// is refused alone (named, with its index in that item's input), and the
// items beside it in the same batched products complete exactly.
TEST(ErrorsChunkwise, InPlaceANonFiniteItemIsRefusedAlone) {
  const AttentionSpec spec{.num_heads = 2, .key_dim = 4, .value_dim = 3};
  Attention attention = *Attention::Create(spec);
  const testing::Tokens good = testing::RandomTokens(spec, 150, 1);
  testing::Tokens bad = testing::RandomTokens(spec, 150, 2);
  bad.v[140 * 2 * 3 + 4] = INFINITY;  // token 140, the third chunk
  AttentionState s_good = attention.NewState(), s_bad = attention.NewState();
  testing::Outputs o_good(spec, 150), o_bad(spec, 150);
  const PrefillItem items[] = {
      {&attention, &s_good, good.input(), o_good.view()},
      {&attention, &s_bad, bad.input(), o_bad.view()}};
  ChunkwiseRunner runner({.chunk_size = 64, .round_chunks = 1});
  std::vector<absl::Status> refused(2);
  ASSERT_TRUE(runner.Run(items, PrefillCommit::kInPlace, refused).ok());
  EXPECT_TRUE(refused[0].ok()) << refused[0];
  EXPECT_EQ(refused[1].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused[1].message()),
              ::testing::StartsWith("items[1].v[844]"));
  EXPECT_EQ(s_good.position(), 150u);
  testing::ExpectMatchesReference(attention,
                                  ReferenceAttention(attention, good.input()),
                                  o_good, "beside a refused item");
  // All or nothing, the same batch fails whole, naming the item.
  AttentionState a = attention.NewState(), b = attention.NewState();
  const PrefillItem again[] = {{&attention, &a, good.input(), o_good.view()},
                               {&attention, &b, bad.input(), o_bad.view()}};
  const absl::Status all = runner.Run(again);
  EXPECT_THAT(std::string(all.message()), ::testing::StartsWith("items[1].v"));
  EXPECT_EQ(a.position(), 0u);
  EXPECT_EQ(0.0f, *std::max_element(a.data(), a.data() + a.size()));
}

}  // namespace
}  // namespace linattn
