// PrefillShares: a round's prefill budget, shortest first, and among tenants
// before within them.
#include "core/scheduler/prefill_shares.h"

#include <gtest/gtest.h>

namespace linattn {
namespace {

TEST(PrefillShares, OneTenantsPrefillsShareEvenlyWhatTheShorterLeave) {
  // 1000 tokens for prefills of 100, 500 and 2000 tokens left (shortest
  // first): a third each; what the first needs less of goes to the rest.
  PrefillShares shares(1000);
  for (uint64_t demand : {100, 500, 2000}) shares.Add("", demand);
  shares.Split();
  EXPECT_EQ(shares.Next(""), 333u);
  shares.Took("", 100);
  EXPECT_EQ(shares.Next(""), 450u);  // (1000 − 100) / 2
  shares.Took("", 450);
  EXPECT_EQ(shares.Next(""), 450u);
  shares.Took("", 450);
}

TEST(PrefillShares, APrefillThatWaitsLeavesItsShareToTheOthers) {
  PrefillShares shares(900);
  for (int i = 0; i < 3; ++i) shares.Add("", 1000);
  shares.Split();
  EXPECT_EQ(shares.Next(""), 300u);  // waits a round: takes nothing
  EXPECT_EQ(shares.Next(""), 450u);
  shares.Took("", 450);
  EXPECT_EQ(shares.Next(""), 450u);
}

TEST(PrefillShares, TenantsShareFirstSoManyPrefillsDoNotCrowdOutOne) {
  // Tenant b has 100 prefills of 1000 tokens, tenant a one of 1000: each
  // tenant gets half of 2000, and b's half is split among its hundred.
  PrefillShares shares(2000);
  shares.Add("a", 1000);
  for (int i = 0; i < 100; ++i) shares.Add("b", 1000);
  shares.Split();
  EXPECT_EQ(shares.Next("a"), 1000u);
  shares.Took("a", 1000);
  EXPECT_EQ(shares.Next("b"), 10u);  // 1000 / 100
  shares.Took("b", 10);
  EXPECT_EQ(shares.Next("b"), 10u);  // 990 / 99
}

TEST(PrefillShares, ATenantNeedingLessLeavesTheRestToTheOthers) {
  PrefillShares shares(3000);
  shares.Add("small", 100);
  shares.Add("big", 5000);
  shares.Add("bigger", 9000);
  shares.Split();
  EXPECT_EQ(shares.Next("small"), 100u);
  EXPECT_EQ(shares.Next("big"), 1450u);  // (3000 − 100) / 2
  EXPECT_EQ(shares.Next("bigger"), 1450u);
  // Every share is at least one token.
  PrefillShares empty(1);
  empty.Add("x", 10);
  empty.Add("y", 10);
  empty.Split();
  EXPECT_EQ(empty.Next("x"), 1u);
  EXPECT_EQ(empty.Next("y"), 1u);
}

}  // namespace
}  // namespace linattn
