#include "core/scheduler/iteration_planner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>
#include <random>

namespace linattn {
namespace {

using ::testing::ElementsAre;

uint64_t Total(const std::vector<uint32_t>& take) {
  return std::accumulate(take.begin(), take.end(), uint64_t{0});
}

TEST(IterationPlanner, DecodeRowsGoFirstOldestFirstUpToMaxBatch) {
  // Three decoding (left 1) and one prompt; max_batch 2 leaves the newest
  // decode row out, and the prompt gets the rest of the budget.
  const PlanCandidate c[] = {{.seq = 5, .left = 1},
                             {.seq = 1, .left = 1},
                             {.seq = 3, .left = 100},
                             {.seq = 2, .left = 1}};
  EXPECT_THAT(PlanIteration(c, {.token_budget = 10, .max_batch = 2}),
              ElementsAre(0, 1, 8, 1));
}

TEST(IterationPlanner, PromptsShareEvenlyAndTheShortLeaveTheRestToTheLong) {
  // 30 tokens over prompts of 4, 100 and 100: the short one takes its 4,
  // the others 13 each.
  const PlanCandidate c[] = {
      {.seq = 0, .left = 100}, {.seq = 1, .left = 4}, {.seq = 2, .left = 100}};
  const auto take = PlanIteration(c, {.token_budget = 30, .max_batch = 8});
  EXPECT_THAT(take, ElementsAre(13, 4, 13));
  EXPECT_EQ(Total(take), 30u);
}

TEST(IterationPlanner, WithMorePromptsThanTokensTheOldestGetOneEach) {
  const PlanCandidate c[] = {{.seq = 9, .left = 50},
                             {.seq = 4, .left = 2},
                             {.seq = 7, .left = 9},
                             {.seq = 1, .left = 30}};
  EXPECT_THAT(PlanIteration(c, {.token_budget = 2, .max_batch = 8}),
              ElementsAre(0, 1, 0, 1));
}

TEST(IterationPlanner, TenantsTakeTurnsWhereNotEveryRowFits) {
  // Tenant 0 has six decode rows older than tenant 1's two; max_batch 4
  // gives each tenant two (oldest first within each), where arrival order
  // alone would give tenant 0 all four.
  const PlanCandidate c[] = {
      {.seq = 0, .left = 1, .group = 0}, {.seq = 1, .left = 1, .group = 0},
      {.seq = 2, .left = 1, .group = 0}, {.seq = 3, .left = 1, .group = 0},
      {.seq = 4, .left = 1, .group = 0}, {.seq = 5, .left = 1, .group = 0},
      {.seq = 6, .left = 1, .group = 1}, {.seq = 7, .left = 1, .group = 1}};
  EXPECT_THAT(PlanIteration(c, {.token_budget = 64, .max_batch = 4}),
              ElementsAre(1, 1, 0, 0, 0, 0, 1, 1));
  // More prompts than tokens: one each, tenants in turn, oldest first.
  const PlanCandidate p[] = {{.seq = 0, .left = 50, .group = 3},
                             {.seq = 1, .left = 50, .group = 3},
                             {.seq = 2, .left = 50, .group = 3},
                             {.seq = 3, .left = 50, .group = 8}};
  EXPECT_THAT(PlanIteration(p, {.token_budget = 2, .max_batch = 8}),
              ElementsAre(1, 0, 0, 1));
  // One tenant: arrival order, as before tenants.
  const PlanCandidate one[] = {{.seq = 2, .left = 1, .group = 5},
                               {.seq = 1, .left = 1, .group = 5},
                               {.seq = 0, .left = 1, .group = 5}};
  EXPECT_THAT(PlanIteration(one, {.token_budget = 64, .max_batch = 2}),
              ElementsAre(0, 1, 1));
}

TEST(IterationPlanner, DecodeRowsCanTakeTheWholeBudget) {
  const PlanCandidate c[] = {
      {.seq = 0, .left = 1}, {.seq = 1, .left = 1}, {.seq = 2, .left = 5}};
  EXPECT_THAT(PlanIteration(c, {.token_budget = 2, .max_batch = 8}),
              ElementsAre(1, 1, 0));
  // A budget of 0 is taken as 1.
  EXPECT_THAT(PlanIteration(c, {.token_budget = 0, .max_batch = 8}),
              ElementsAre(1, 0, 0));
}

// Over many random inputs: never more than the budget or a candidate's
// need, never more decode rows than max_batch, and no token left unused
// while some prompt still needs one.
TEST(IterationPlanner, RandomPlansRespectEveryLimit) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<PlanCandidate> c(rng() % 12);
    for (size_t i = 0; i < c.size(); ++i) {
      c[i].seq = rng() % 100;
      c[i].left = 1 + (rng() % 3 == 0 ? 0 : rng() % 64);
    }
    const PlanLimits limits{
        .token_budget = 1 + static_cast<uint32_t>(rng() % 80),
        .max_batch = static_cast<uint32_t>(rng() % 6)};
    const auto take = PlanIteration(c, limits);
    ASSERT_EQ(take.size(), c.size());
    EXPECT_LE(Total(take), limits.token_budget);
    uint32_t decode = 0;
    bool prompt_wants_more = false;
    for (size_t i = 0; i < c.size(); ++i) {
      EXPECT_LE(take[i], c[i].left);
      if (c[i].left == 1) decode += take[i];
      if (c[i].left > 1 && take[i] < c[i].left) prompt_wants_more = true;
    }
    EXPECT_LE(decode, limits.max_batch);
    if (prompt_wants_more) {
      EXPECT_EQ(Total(take), limits.token_budget) << "trial " << trial;
    }
  }
}

}  // namespace
}  // namespace linattn
