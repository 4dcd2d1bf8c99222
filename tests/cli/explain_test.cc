#include "clients/cli/explain.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "absl/strings/str_cat.h"

namespace linattn {
namespace {

using ::testing::HasSubstr;

// The seed's worked example, exactly.
TEST(Explain, GeneralPresetElu1PrefixOne) {
  auto r = Explain({.preset = "general", .feature_map = "elu1", .prefix = 1});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->phi_q, (std::vector<float>{1.5f, 2.0f}));
  EXPECT_EQ(r->z, (std::vector<float>{2.0f, 1.0f}));
  EXPECT_EQ(r->s, (std::vector<float>{2.0f, 1.0f}));
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
  EXPECT_THAT(
      std::string(Explain({.feature_map = "softmax"}).status().message()),
      HasSubstr("feature_map"));
}

// Every map the explainer takes, every preset and prefix: the recurrent
// output is the numerator over the denominator it reports, the weights sum
// to one, and the quadratic-order reference agrees. With d_φ ≤ 4 and at
// most 4 keys every sum has at most 16 terms of magnitude ≲ 10, so fp32
// rounding stays below 16·2⁻²⁴·(Σ|terms|) relative: 1e-4 absolute bounds it
// with room, while any misreading of φ (a position, a FAVOR+ scale) moves
// the output by O(1).
TEST(Explain, EveryFeatureMapAgreesWithItsReference) {
  for (const std::string& map : ExplainFeatureMaps()) {
    for (const ExplainPresetInfo& preset : ExplainPresets()) {
      for (int prefix = 1; prefix <= preset.keys; ++prefix) {
        SCOPED_TRACE(absl::StrCat(map, " ", preset.name, " ", prefix));
        auto r = Explain(
            {.preset = preset.name, .feature_map = map, .prefix = prefix});
        ASSERT_TRUE(r.ok()) << r.status();
        ASSERT_EQ(r->phi_q.size(), r->z.size());
        ASSERT_EQ(r->phi_keys.size(), size_t(preset.keys));
        float z_check = 0, den_check = 0;
        for (size_t j = 0; j < r->z.size(); ++j) {
          float zj = 0;
          for (int i = 0; i < prefix; ++i) zj += r->phi_keys[i][j];
          EXPECT_NEAR(r->z[j], zj, 1e-4 * (1 + std::fabs(zj)));
          z_check += zj;
          den_check += r->phi_q[j] * zj;
        }
        (void)z_check;
        EXPECT_NEAR(r->denominator, den_check,
                    1e-4 * (1 + std::fabs(den_check)));
        if (!r->available) {
          EXPECT_EQ(r->denominator, 0.0f);
          EXPECT_FALSE(r->reference_available);
          continue;
        }
        EXPECT_NEAR(r->output, r->numerator / r->denominator,
                    1e-4 * (1 + std::fabs(r->output)));
        ASSERT_TRUE(r->reference_available);
        EXPECT_NEAR(r->output, r->reference, 1e-4 * (1 + std::fabs(r->output)));
        double sum = 0;
        for (float w : r->weights) sum += w;
        EXPECT_NEAR(sum, 1.0, 1e-4);
      }
    }
  }
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
