// AttentionService's request reading without a process: specs from their
// proto (server/convert.h), and the tensors of Prefill and Decode in both
// of their forms (server/attention_tensors.h) — read in place, refused
// naming the field and the shape, and answered in the form they came in.
#include "server/attention_tensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "server/convert.h"

namespace linattn {
namespace {

using ::testing::HasSubstr;

AttentionSpec Spec(UpdateRule rule = UpdateRule::kLinear) {
  v1::AttentionSpec proto;
  proto.set_num_heads(2);
  proto.set_key_dim(3);
  proto.set_value_dim(4);
  if (rule != UpdateRule::kLinear) {
    proto.set_rule(std::string(UpdateRuleName(rule)));
  }
  return FromProto(proto).value().spec;
}

std::string Bytes(const std::vector<float>& values) {
  std::string out(values.size() * sizeof(float), '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

void Fill(google::protobuf::RepeatedField<float>* field, size_t n,
          float first) {
  for (size_t i = 0; i < n; ++i) field->Add(first + static_cast<float>(i));
}

TEST(SpecFromProto, NamesTheFieldOfAnUnknownName) {
  v1::AttentionSpec proto;
  proto.set_num_heads(1);
  proto.set_feature_map("softmax");
  auto spec = FromProto(proto);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("spec.feature_map"));
  proto.set_feature_map("");
  proto.set_rule("lstm");
  EXPECT_THAT(FromProto(proto).status().message(), HasSubstr("spec.rule"));
}

TEST(SpecFromProto, AnUnsetEpsilonIsLeftToTheServerAndRulesAreUnnormalised) {
  v1::AttentionSpec proto;
  proto.set_num_heads(1);
  EXPECT_FALSE(FromProto(proto)->epsilon.has_value());
  proto.set_epsilon(0.0f);
  EXPECT_EQ(FromProto(proto)->epsilon, 0.0f);
  const AttentionSpec delta = Spec(UpdateRule::kDelta);
  EXPECT_EQ(delta.feature_map, FeatureMapKind::kIdentity);
  EXPECT_TRUE(delta.unnormalized);
}

TEST(AttentionTensors, FloatsAndBytesAreReadInPlace) {
  const AttentionSpec spec = Spec();
  v1::PrefillRequest r;
  Fill(r.mutable_q(), 3 * 2 * 3, 0);
  r.set_k_bytes(Bytes(std::vector<float>(3 * 2 * 3, 1.5f)));
  Fill(r.mutable_v(), 3 * 2 * 4, 100);
  auto in = InputOf(spec, 3, r);
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->tokens, 3u);
  EXPECT_EQ(in->q, r.q().data());
  EXPECT_EQ(reinterpret_cast<const char*>(in->k), r.k_bytes().data());
  EXPECT_EQ(in->k[17], 1.5f);
  EXPECT_EQ(in->v[23], 123.0f);
  EXPECT_EQ(in->g, nullptr);
  EXPECT_EQ(in->beta, nullptr);
}

TEST(AttentionTensors, AWrongLengthNamesTheTensorAndItsShape) {
  const AttentionSpec spec = Spec();
  v1::DecodeRequest r;
  Fill(r.mutable_q(), 6, 0);
  Fill(r.mutable_k(), 5, 0);  // one short
  Fill(r.mutable_v(), 8, 0);
  auto in = InputOf(spec, 1, r);
  ASSERT_FALSE(in.ok());
  EXPECT_EQ(in.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(in.status().message(),
              HasSubstr("k: expected 6 floats (tokens 1 × num_heads 2 × "
                        "key_dim), got 5"));
  r.clear_k();
  r.set_k_bytes(std::string(23, '\0'));
  EXPECT_THAT(InputOf(spec, 1, r).status().message(),
              HasSubstr("k_bytes: expected 24 bytes"));
  Fill(r.mutable_k(), 6, 0);
  EXPECT_THAT(InputOf(spec, 1, r).status().message(),
              HasSubstr("k, k_bytes: one tensor given twice"));
}

TEST(AttentionTensors, GatesAndBetaExactlyWhenTheRuleTakesThem) {
  v1::DecodeRequest r;
  Fill(r.mutable_q(), 6, 0);
  Fill(r.mutable_k(), 6, 0);
  Fill(r.mutable_v(), 8, 0);
  r.add_beta(0.5f);
  EXPECT_THAT(InputOf(Spec(), 1, r).status().message(),
              HasSubstr("beta: rule linear takes no beta"));
  const AttentionSpec delta = Spec(UpdateRule::kGatedDelta);
  EXPECT_THAT(InputOf(delta, 1, r).status().message(),
              HasSubstr("g: expected 2 floats"));
  r.add_g(-0.1f);
  r.add_g(-0.2f);
  EXPECT_THAT(InputOf(delta, 1, r).status().message(),
              HasSubstr("beta: expected 2 floats"));
  r.add_beta(1.0f);
  auto in = InputOf(delta, 1, r);
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->g[1], -0.2f);
  EXPECT_EQ(in->beta[1], 1.0f);
}

TEST(AttentionTensors, TokensBeyondAnyMessageAreRefusedBeforeSizes) {
  // 2^31 tokens × 2 heads × 4 values would overflow nothing here, but no
  // message carries them: refused before any size is formed from them.
  v1::PrefillRequest r;
  auto in = InputOf(Spec(), uint64_t{1} << 31, r);
  ASSERT_FALSE(in.ok());
  EXPECT_THAT(in.status().message(),
              HasSubstr("more than any message carries"));
}

TEST(AttentionTensors, OutputsComeInTheRequestsForm) {
  v1::PrefillResponse floats;
  auto [y, den] = OutputOf(false, 6, 4, &floats);
  EXPECT_EQ(floats.output_size(), 24);
  EXPECT_EQ(floats.denominator_size(), 6);
  EXPECT_EQ(y, floats.output().data());
  EXPECT_EQ(den, floats.denominator().data());
  v1::DecodeResponse bytes;
  auto [by, bden] = OutputOf(true, 2, 4, &bytes);
  EXPECT_EQ(bytes.output_bytes().size(), 2 * 4 * sizeof(float));
  EXPECT_EQ(bytes.denominator_bytes().size(), 2 * sizeof(float));
  EXPECT_EQ(reinterpret_cast<char*>(by), bytes.output_bytes().data());
  EXPECT_EQ(bytes.output_size(), 0);
  (void)bden;
  google::protobuf::RepeatedField<bool> available;
  CopyAvailable({1, 0, 1}, &available);
  ASSERT_EQ(available.size(), 3);
  EXPECT_TRUE(available.Get(0));
  EXPECT_FALSE(available.Get(1));
}

}  // namespace
}  // namespace linattn
