#include "core/attention/spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace linattn {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

void ExpectRejected(const AttentionSpec& spec, const std::string& field) {
  absl::Status s = ValidateSpec(spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field;
  EXPECT_THAT(std::string(s.message()), StartsWith(field + ":"));
}

TEST(Spec, DefaultsAreValid) {
  EXPECT_TRUE(ValidateSpec(AttentionSpec{}).ok());
}

TEST(Spec, RejectsBadFieldsNamingThem) {
  AttentionSpec s;
  s.num_heads = 0;
  ExpectRejected(s, "num_heads");
  s = {};
  s.key_dim = 0;
  ExpectRejected(s, "key_dim");
  s = {};
  s.value_dim = kMaxDim + 1;
  ExpectRejected(s, "value_dim");
  s = {};
  s.epsilon = -1e-3f;
  ExpectRejected(s, "epsilon");
  s.epsilon = NAN;
  ExpectRejected(s, "epsilon");
  s = {};
  s.num_heads = 2;
  s.decay = {0.5f};
  ExpectRejected(s, "decay");
  s.decay = {0.5f, 1.5f};
  ExpectRejected(s, "decay[1]");
  s.decay = {NAN, 1.0f};
  ExpectRejected(s, "decay[0]");
  s = {};
  s.feature_map = FeatureMapKind::kIdentity;
  ExpectRejected(s, "feature_map");  // identity needs unnormalized
  s.unnormalized = true;
  EXPECT_TRUE(ValidateSpec(s).ok());
  s = {};
  s.feature_map = FeatureMapKind::kCosine;
  ExpectRejected(s, "horizon");
  s.horizon = 100;
  EXPECT_TRUE(ValidateSpec(s).ok());
  s = {};
  s.horizon = 100;
  ExpectRejected(s, "horizon");  // only cosine has one
  s = {};
  s.feature_dim = 7;
  ExpectRejected(s, "feature_dim");
  s.feature_map = FeatureMapKind::kFavor;
  EXPECT_TRUE(ValidateSpec(s).ok());
}

TEST(Spec, ParsesPublicNames) {
  for (const char* name : {"elu1", "relu", "identity", "favor", "cosine"}) {
    auto kind = ParseFeatureMap(name);
    ASSERT_TRUE(kind.ok()) << name;
    EXPECT_EQ(FeatureMapName(*kind), name);
  }
  auto bad = ParseFeatureMap("softmax");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), StartsWith("feature_map:"));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("softmax"));
}

TEST(Spec, FeatureDims) {
  AttentionSpec s{.key_dim = 16};
  EXPECT_EQ(FeatureDim(s), 16u);
  s.feature_map = FeatureMapKind::kCosine;
  EXPECT_EQ(FeatureDim(s), 32u);
  s.feature_map = FeatureMapKind::kFavor;
  EXPECT_EQ(FeatureDim(s), 32u);  // default m = 2·d_k
  s.feature_dim = 100;
  EXPECT_EQ(FeatureDim(s), 100u);
}

}  // namespace
}  // namespace linattn
