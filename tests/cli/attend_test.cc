// `linattn attend` end to end through real .npy files in a temp directory,
// and the installed binary once through a shell.
#include "clients/cli/attend.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "clients/cli/npy.h"
#include "core/attention/reference.h"
#include "tests/attention/rule_bounds.h"
#include "tests/util/temp_dir.h"

namespace linattn {
namespace {

using ::testing::HasSubstr;

class AttendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937_64 rng(9);
    std::uniform_real_distribution<float> dist(-1, 1);
    q_.resize(T * H * D);
    k_.resize(T * H * D);
    v_.resize(T * H * D);
    for (auto* vec : {&q_, &k_, &v_}) {
      for (float& x : *vec) x = dist(rng);
    }
    ASSERT_TRUE(WriteNpy(Path("q.npy"), {T, H, D}, q_.data()).ok());
    ASSERT_TRUE(WriteNpy(Path("k.npy"), {T, H, D}, k_.data()).ok());
    ASSERT_TRUE(WriteNpy(Path("v.npy"), {T, H, D}, v_.data()).ok());
  }
  std::string Path(const std::string& name) const { return dir_.Path(name); }
  AttendOptions Options(const std::string& mode, const std::string& out) const {
    AttendOptions o;
    o.q_path = Path("q.npy");
    o.k_path = Path("k.npy");
    o.v_path = Path("v.npy");
    o.out_path = Path(out);
    o.mode = mode;
    o.chunk = 16;
    return o;
  }

  static constexpr int64_t T = 50, H = 3, D = 4;
  testing::TempDir dir_;
  std::vector<float> q_, k_, v_;
};

TEST_F(AttendTest, OrdersAgreeThroughFiles) {
  for (const std::string map : {"elu1", "favor", "cosine"}) {
    std::vector<std::vector<float>> results;
    for (const std::string mode : {"recurrent", "chunkwise", "quadratic"}) {
      AttendOptions o = Options(mode, mode + ".npy");
      o.feature_map = map;
      o.decay = {0.95f};
      ASSERT_TRUE(linattn::Attend(o).ok()) << mode;
      auto y = ReadNpy(o.out_path);
      ASSERT_TRUE(y.ok());
      EXPECT_EQ(y->shape, (std::vector<int64_t>{T, H, D}));
      results.push_back(y->data);
    }
    for (size_t i = 0; i < results[0].size(); ++i) {
      // cosine is relu-based: an all-negative query is unavailable (NaN) in
      // every order.
      ASSERT_EQ(std::isnan(results[0][i]), std::isnan(results[1][i])) << map;
      ASSERT_EQ(std::isnan(results[0][i]), std::isnan(results[2][i])) << map;
      if (std::isnan(results[0][i])) continue;
      // Weighted means of |v| ≤ 1 over ≤ 50 terms: (3·50 + 2·d_φ + 16)·u bounds
      // each difference.
      EXPECT_NEAR(results[0][i], results[1][i], 2e-5) << map;
      EXPECT_NEAR(results[0][i], results[2][i], 2e-5) << map;
    }
  }
}

// The gated and delta rules through files (--rule, --g, --beta): the
// recurrent and chunkwise orders each within the bound of the float64
// reference.
TEST_F(AttendTest, TheGatedAndDeltaRulesThroughFiles) {
  struct RuleRun {
    std::string rule, gate;
    bool l2norm;
  };
  for (const RuleRun& run :
       {RuleRun{"gated", "key", false}, RuleRun{"gated", "head", true},
        RuleRun{"delta", "", true}, RuleRun{"gated_delta", "", true}}) {
    AttentionSpec spec{.rule = *ParseUpdateRule(run.rule),
                       .num_heads = H,
                       .key_dim = D,
                       .value_dim = D,
                       .feature_map = FeatureMapKind::kIdentity,
                       .unnormalized = true};
    if (!run.gate.empty()) spec.gate = *ParseGateShape(run.gate);
    spec.qk_l2norm = run.l2norm;
    spec.scale = 0.5f;
    testing::RuleTokens data = testing::RandomRuleTokens(spec, T, 3, {});
    data.q = q_;
    data.k = k_;
    data.v = v_;
    if (!data.g.empty()) {
      std::vector<int64_t> shape = {T, H};
      if (GatesPerHead(spec) > 1) shape.push_back(D);
      ASSERT_TRUE(WriteNpy(Path("g.npy"), shape, data.g.data()).ok());
    }
    if (!data.beta.empty()) {
      ASSERT_TRUE(WriteNpy(Path("beta.npy"), {T, H}, data.beta.data()).ok());
    }
    const RuleReferenceResult ref = ReferenceRule(spec, data.input());
    for (const std::string mode : {"recurrent", "chunkwise"}) {
      AttendOptions o = Options(mode, "y.npy");
      o.rule = run.rule;
      o.gate = run.gate;
      o.qk_l2norm = run.l2norm;
      o.scale = 0.5f;
      if (!data.g.empty()) o.g_path = Path("g.npy");
      if (!data.beta.empty()) o.beta_path = Path("beta.npy");
      const absl::Status s = linattn::Attend(o);
      ASSERT_TRUE(s.ok()) << run.rule << " " << mode << ": " << s;
      auto y = ReadNpy(o.out_path);
      ASSERT_TRUE(y.ok());
      testing::Outputs got(spec, T);
      got.output = y->data;
      std::fill(got.available.begin(), got.available.end(), 1);
      testing::ExpectRuleMatchesReference(spec, data, ref, got, o.chunk,
                                          run.rule + " " + mode);
    }
  }
  // What a rule does not take, or lacks, is named.
  AttendOptions o = Options("recurrent", "y.npy");
  o.rule = "delta";
  EXPECT_THAT(std::string(linattn::Attend(o).message()), HasSubstr("--beta"));
  o.beta_path = Path("beta.npy");
  o.g_path = Path("g.npy");
  EXPECT_THAT(std::string(linattn::Attend(o).message()),
              HasSubstr("--g: this rule takes no such input"));
  o = Options("recurrent", "y.npy");
  o.rule = "gated";
  o.gate = "key";
  o.g_path = Path("beta.npy");  // (T, H), not (T, H, d_k)
  EXPECT_THAT(std::string(linattn::Attend(o).message()),
              HasSubstr("--g: expected shape"));
  o = Options("quadratic", "y.npy");
  o.rule = "gated";
  o.g_path = Path("beta.npy");
  EXPECT_THAT(std::string(linattn::Attend(o).message()),
              HasSubstr("--mode quadratic"));
}

TEST_F(AttendTest, UnavailableIsNaN) {
  std::vector<float> negative(q_.size(), -1.0f);
  ASSERT_TRUE(WriteNpy(Path("q.npy"), {T, H, D}, negative.data()).ok());
  AttendOptions o = Options("chunkwise", "y.npy");
  o.feature_map = "relu";
  ASSERT_TRUE(linattn::Attend(o).ok());
  auto y = ReadNpy(o.out_path);
  ASSERT_TRUE(y.ok());
  for (float x : y->data) EXPECT_TRUE(std::isnan(x));
}

TEST_F(AttendTest, RejectsBadInputs) {
  AttendOptions o = Options("recurrent", "y.npy");
  ASSERT_TRUE(WriteNpy(Path("v2.npy"), {T + 1, H, D},
                       std::vector<float>((T + 1) * H * D).data())
                  .ok());
  o.v_path = Path("v2.npy");
  EXPECT_THAT(std::string(linattn::Attend(o).message()), HasSubstr("--v"));
  o = Options("recurrent", "y.npy");
  ASSERT_TRUE(WriteNpy(Path("k2.npy"), {T * H * D}, k_.data()).ok());
  o.k_path = Path("k2.npy");
  EXPECT_THAT(std::string(linattn::Attend(o).message()),
              HasSubstr("--k: expected shape (T, H, d)"));
  o = Options("recurrent", "y.npy");
  o.decay = {0.5f, 0.5f};  // H = 3
  EXPECT_THAT(std::string(linattn::Attend(o).message()), HasSubstr("decay"));
  o = Options("sideways", "y.npy");
  EXPECT_THAT(std::string(linattn::Attend(o).message()), HasSubstr("--mode"));
  EXPECT_FALSE(std::filesystem::exists(Path("y.npy")));
}

TEST_F(AttendTest, BinaryPrintsTheSeedExampleAndFailsCleanly) {
  const std::string bin = LINATTN_BINARY;
  const std::string out = Path("explain.txt");
  ASSERT_EQ(
      0,
      std::system(
          (bin + " explain --preset general --feature-map elu1 --prefix 1 > " +
           out)
              .c_str()));
  std::ifstream in(out);
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("denominator  φ(q)·z = 5\n"));
  EXPECT_THAT(text, HasSubstr("numerator / denominator = 1\n"));
  const std::string err = Path("err.txt");
  const int rc = std::system((bin + " attend --q " + Path("missing.npy") +
                              " --k x --v y --out z 2> " + err)
                                 .c_str());
  EXPECT_NE(rc, 0);
  std::ifstream ein(err);
  std::string etext((std::istreambuf_iterator<char>(ein)),
                    std::istreambuf_iterator<char>());
  EXPECT_THAT(etext, HasSubstr("missing.npy: cannot open"));
}

}  // namespace
}  // namespace linattn
