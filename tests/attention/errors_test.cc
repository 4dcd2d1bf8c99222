// Bad input is rejected with a message naming the field, and a failed call
// leaves every state (block and position) exactly as it was.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace linattn
