#include "clients/cli/explain.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace linattn {
namespace {

using ::testing::HasSubstr;

// The seed's worked example, exactly.
TEST(Explain, GeneralPresetElu1PrefixOne) {
  auto r = Explain({.preset = "general", .feature_map = "elu1", .prefix = 1});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->phi_q, (std::array<float, 2>{1.5f, 2.0f}));
  EXPECT_EQ(r->z, (std::array<float, 2>{2.0f, 1.0f}));
  EXPECT_EQ(r->s, (std::array<float, 2>{2.0f, 1.0f}));
  EXPECT_EQ(r->numerator, 5.0f);
  EXPECT_EQ(r->denominator, 5.0f);
  EXPECT_TRUE(r->available);
  EXPECT_EQ(r->output, 1.0f);
  EXPECT_EQ(r->reference, 1.0f);

  const std::string text = FormatExplainText(*r);
  EXPECT_THAT(text, HasSubstr("φ(q)     = [1.5, 2]"));
  EXPECT_THAT(text, HasSubstr("z = Σ φ(k_i)      = [2, 1]"));
  EXPECT_THAT(text, HasSubstr("numerator    φ(q)·S = 5\n"));
  EXPECT_THAT(text, HasSubstr("denominator  φ(q)·z = 5\n"));
  EXPECT_THAT(text, HasSubstr("numerator / denominator = 1\n"));

  const nlohmann::json j = ExplainJson(*r);
  EXPECT_EQ(j["numerator"], 5.0);
  EXPECT_EQ(j["denominator"], 5.0);
  EXPECT_EQ(j["output"], 1.0);
  EXPECT_EQ(j["available"], true);
  EXPECT_EQ(j["reference"], 1.0);
  EXPECT_EQ(j["z"], nlohmann::json({2.0, 1.0}));
  EXPECT_EQ(j["s"], nlohmann::json({2.0, 1.0}));
}

TEST(Explain, NegativePresetReluIsUnavailable) {
  auto r = Explain({.preset = "negative", .feature_map = "relu"});
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->available);
  EXPECT_EQ(r->denominator, 0.0f);
  EXPECT_THAT(FormatExplainText(*r), HasSubstr("output       unavailable"));
  const nlohmann::json j = ExplainJson(*r);
  EXPECT_TRUE(j["output"].is_null());
  EXPECT_EQ(j["available"], false);
  EXPECT_TRUE(j["reference"].is_null());
}

TEST(Explain, NegativePresetElu1MatchesReference) {
  auto r = Explain({.preset = "negative", .feature_map = "elu1"});
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->available);
  EXPECT_NEAR(r->output, r->reference, 1e-6);
  EXPECT_NEAR(r->output, 0.560868, 1e-6);
  double sum = 0;
  for (float w : r->weights) sum += w;
  EXPECT_NEAR(sum, 1.0, 1e-6);
}

TEST(Explain, RejectsBadArguments) {
  EXPECT_THAT(std::string(Explain({.preset = "x"}).status().message()),
              HasSubstr("preset"));
  EXPECT_THAT(std::string(Explain({.prefix = 5}).status().message()),
              HasSubstr("prefix"));
  EXPECT_THAT(std::string(Explain({.prefix = 0}).status().message()),
              HasSubstr("prefix"));
  EXPECT_THAT(std::string(Explain({.feature_map = "favor"}).status().message()),
              HasSubstr("feature_map"));
}

TEST(Explain, FormatsShortestRoundTrip) {
  EXPECT_EQ(FormatFloat(5.0f), "5");
  EXPECT_EQ(FormatFloat(1.5f), "1.5");
  EXPECT_EQ(std::strtof(FormatFloat(0.1f).c_str(), nullptr), 0.1f);
  EXPECT_EQ(FormatFloat(0.1f), "0.1");
  // Whole numbers and ordinary magnitudes in positional notation.
  EXPECT_EQ(FormatFloat(10.0f), "10");
  EXPECT_EQ(FormatFloat(-1200.0f), "-1200");
  EXPECT_EQ(FormatFloat(0.0001f), "0.0001");
  EXPECT_EQ(FormatFloat(0.0f), "0");
  // Far outside them, scientific; always the same float when read back.
  EXPECT_EQ(FormatFloat(1e20f), "1e+20");
  for (float x : {0.60653067f, 10.303266f, 3.4e38f, 1.4e-45f, 7e-5f}) {
    EXPECT_EQ(std::strtof(FormatFloat(x).c_str(), nullptr), x) << x;
  }
}

TEST(Explain, TheGeneralPresetAtPrefixThreePrintsPlainNumbers) {
  auto r = Explain({.prefix = 3});
  ASSERT_TRUE(r.ok());
  const std::string text = FormatExplainText(*r);
  EXPECT_THAT(text, HasSubstr("S = Σ φ(k_i)·v_i  = [10, 11]"));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("e+")));
}

}  // namespace
}  // namespace linattn
