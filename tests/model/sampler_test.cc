#include "core/model/sampler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/model/tokenizer.h"

namespace linattn {
namespace {

using ::testing::HasSubstr;

TEST(SamplerTest, GreedyIsTheHighestLogitLowestIdOnTies) {
  Sampler s(SamplingParams{});
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  auto t = s.Sample(logits);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->id, 1);
  // log_softmax: 2 − log(e^0.5 + 2e^2 + e^−1)
  const double z = std::log(std::exp(0.5) + 2 * std::exp(2.0) + std::exp(-1.0));
  EXPECT_NEAR(t->logprob, 2.0 - z, 1e-6);
}

// The alternatives are the most likely tokens whatever top_k cut from the
// draw, highest first and lower id first on ties; asking for them changes
// no draw.
TEST(SamplerTest, TopLogprobsAreTheMostLikelyTokensAndChangeNoDraw) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f, NAN};
  const double z = std::log(std::exp(0.5) + 2 * std::exp(2.0) + std::exp(-1.0) +
                            std::exp(1.0));
  SamplingParams p{.temperature = 0.7f, .top_k = 1, .seed = 5};
  p.logprobs = true;
  p.top_logprobs = 3;
  Sampler with(p);
  SamplingParams plain = p;
  plain.top_logprobs = 0;
  Sampler without(plain);
  for (int i = 0; i < 20; ++i) {
    auto a = with.Sample(logits);
    auto b = without.Sample(logits);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->id, b->id);
    EXPECT_TRUE(b->top.empty());
    ASSERT_EQ(a->top.size(), 3u);
    EXPECT_EQ(a->top[0].first, 1);
    EXPECT_EQ(a->top[1].first, 3);
    EXPECT_EQ(a->top[2].first, 4);
    EXPECT_NEAR(a->top[0].second, 2.0 - z, 1e-6);
    EXPECT_NEAR(a->top[2].second, 1.0 - z, 1e-6);
  }
  // More than there are finite logits: all of them.
  p.top_logprobs = 20;
  Sampler all(p);
  EXPECT_EQ(all.Sample(logits)->top.size(), 5u);
  p.top_logprobs = kMaxTopLogprobs + 1;
  EXPECT_THAT(std::string(ValidateSampling(p).message()),
              HasSubstr("top_logprobs"));
}

TEST(SamplerTest, SameSeedSameTokensOtherSeedOtherTokens) {
  std::vector<float> logits(50);
  for (int i = 0; i < 50; ++i) logits[i] = 0.1f * (i % 7);
  SamplingParams p{.temperature = 1.0f, .seed = 42};
  auto draw = [&](uint64_t seed) {
    p.seed = seed;
    Sampler s(p);
    std::vector<int32_t> ids;
    for (int i = 0; i < 64; ++i) ids.push_back(s.Sample(logits)->id);
    return ids;
  };
  EXPECT_EQ(draw(42), draw(42));
  EXPECT_NE(draw(42), draw(43));
}

TEST(SamplerTest, TopKAndTopPRestrictTheCandidates) {
  // Probabilities ∝ e^logit: id 3 ≈ 0.64, id 1 ≈ 0.24, the rest small.
  const std::vector<float> logits = {0.0f, 2.0f, -3.0f, 3.0f, 0.5f};
  std::map<int32_t, int> seen_k, seen_p;
  Sampler k(SamplingParams{.temperature = 1.0f, .top_k = 2, .seed = 1});
  Sampler p(SamplingParams{.temperature = 1.0f, .top_p = 0.6f, .seed = 1});
  for (int i = 0; i < 2000; ++i) {
    seen_k[k.Sample(logits)->id]++;
    seen_p[p.Sample(logits)->id]++;
  }
  EXPECT_EQ(seen_k.size(), 2u);
  EXPECT_TRUE(seen_k.count(3) && seen_k.count(1));
  // top_p 0.6: id 3 alone already has 0.64.
  EXPECT_EQ(seen_p.size(), 1u);
  EXPECT_EQ(seen_p.begin()->first, 3);
  // The top-2 split follows the renormalised probabilities
  // (e³ / (e³ + e²) ≈ 0.731): 2000 draws put it within ±0.05 with
  // probability > 0.999 (5 standard deviations).
  EXPECT_NEAR(seen_k[3] / 2000.0,
              std::exp(3.0) / (std::exp(3.0) + std::exp(2.0)), 0.05);
}

TEST(SamplerTest, LowTemperatureApproachesGreedy) {
  const std::vector<float> logits = {1.0f, 1.5f, 0.2f};
  Sampler s(SamplingParams{.temperature = 0.01f, .seed = 9});
  for (int i = 0; i < 100; ++i) EXPECT_EQ(s.Sample(logits)->id, 1);
}

TEST(SamplerTest, NonFiniteLogitsAreSkippedAndAllNonFiniteIsAnError) {
  Sampler s(SamplingParams{});
  const float nan = std::nanf("");
  EXPECT_EQ(s.Sample(std::vector<float>{nan, 1.0f, INFINITY})->id, 1);
  EXPECT_EQ(s.Sample(std::vector<float>{nan, nan}).status().code(),
            absl::StatusCode::kInternal);
}

TEST(SamplerTest, ValidationNamesTheField) {
  EXPECT_TRUE(ValidateSampling(SamplingParams{}).ok());
  EXPECT_THAT(ValidateSampling(SamplingParams{.temperature = -1}).message(),
              HasSubstr("sampling.temperature"));
  EXPECT_THAT(ValidateSampling(SamplingParams{.top_p = 0}).message(),
              HasSubstr("sampling.top_p"));
  EXPECT_THAT(ValidateSampling(SamplingParams{.max_tokens = 0}).message(),
              HasSubstr("sampling.max_tokens"));
  EXPECT_THAT(ValidateSampling(SamplingParams{.stop = {"a", ""}}).message(),
              HasSubstr("sampling.stop[1]"));
  // Each stop string is searched for at every token: bounded in count and
  // length.
  SamplingParams many{.stop =
                          std::vector<std::string>(kMaxStopStrings + 1, "a")};
  EXPECT_THAT(ValidateSampling(many).message(), HasSubstr("sampling.stop:"));
  SamplingParams lengthy{.stop = {"a", std::string(kMaxStopBytes + 1, 'b')}};
  EXPECT_THAT(ValidateSampling(lengthy).message(),
              HasSubstr("sampling.stop[1]"));
  lengthy.stop[1].resize(kMaxStopBytes);
  EXPECT_TRUE(ValidateSampling(lengthy).ok());
  EXPECT_THAT(ValidateSampling(SamplingParams{.min_p = 1.5f}).message(),
              HasSubstr("sampling.min_p"));
  EXPECT_THAT(ValidateSampling(SamplingParams{.min_p = NAN}).message(),
              HasSubstr("sampling.min_p"));
  EXPECT_THAT(
      ValidateSampling(SamplingParams{.presence_penalty = 2.5f}).message(),
      HasSubstr("sampling.presence_penalty"));
  EXPECT_THAT(
      ValidateSampling(SamplingParams{.frequency_penalty = -3}).message(),
      HasSubstr("sampling.frequency_penalty"));
  EXPECT_THAT(
      ValidateSampling(SamplingParams{.repetition_penalty = 0}).message(),
      HasSubstr("sampling.repetition_penalty"));
  EXPECT_THAT(ValidateSampling(SamplingParams{.penalty_last_n = -2}).message(),
              HasSubstr("sampling.penalty_last_n"));
  EXPECT_THAT(
      ValidateSampling(SamplingParams{.penalty_last_n = kMaxPenaltyWindow + 1})
          .message(),
      HasSubstr("sampling.penalty_last_n"));
}

// llama.cpp's repetition penalty on the tokens of its window (prompt
// included): positive logits divided, negative ones multiplied.
TEST(SamplerTest, RepetitionPenaltyActsOnTheWindow) {
  const std::vector<float> logits = {3.0f, 2.9f, 0.0f};
  auto greedy_after = [&](SamplingParams p, std::vector<int32_t> seen) {
    Sampler s(p);
    s.Observe(seen);
    return s.Sample(logits).value().id;
  };
  // 3 / 1.1 = 2.73 < 2.9, once or many times.
  EXPECT_EQ(greedy_after({.repetition_penalty = 1.1f}, {0}), 1);
  EXPECT_EQ(greedy_after({.repetition_penalty = 1.1f}, {0, 0, 0}), 1);
  EXPECT_EQ(greedy_after({.repetition_penalty = 1.02f}, {0}), 0);
  {  // −1·1.1 < −1.05
    Sampler s(SamplingParams{.repetition_penalty = 1.1f});
    s.Observe(std::vector<int32_t>{0});
    EXPECT_EQ(s.Sample(std::vector<float>{-1.0f, -1.05f}).value().id, 1);
  }
  // The window is the last penalty_last_n tokens; −1 is all; 0 none.
  EXPECT_EQ(greedy_after({.repetition_penalty = 1.1f, .penalty_last_n = 2},
                         {0, 5, 6}),
            0);
  EXPECT_EQ(greedy_after({.repetition_penalty = 1.1f, .penalty_last_n = 3},
                         {0, 5, 6}),
            1);
  std::vector<int32_t> long_prompt(5000, 7);
  long_prompt[0] = 0;
  EXPECT_EQ(greedy_after({.repetition_penalty = 1.1f, .penalty_last_n = -1},
                         long_prompt),
            1);
  EXPECT_EQ(
      greedy_after({.repetition_penalty = 1.1f, .penalty_last_n = 0}, {0}), 0);
  // The prompt does not count for OpenAI's penalties.
  EXPECT_EQ(greedy_after({.presence_penalty = 2.0f}, {0}), 0);
}

// OpenAI's penalties count the tokens generated so far: presence once,
// frequency per occurrence; negative values favour them.
TEST(SamplerTest, PresenceAndFrequencyPenalizeGeneratedTokens) {
  auto run = [](SamplingParams p, std::vector<float> logits, int n) {
    Sampler s(p);
    std::vector<int32_t> ids;
    for (int i = 0; i < n; ++i) ids.push_back(s.Sample(logits).value().id);
    return ids;
  };
  // 3 − 0.2 = 2.8 < 2.9 after the first 0; then 2.9 − 0.2 = 2.7 < 2.8.
  EXPECT_EQ(run({.presence_penalty = 0.2f}, {3.0f, 2.9f, 0.0f}, 3),
            (std::vector<int32_t>{0, 1, 0}));
  // 3 − 0.06 = 2.94 > 2.9; 3 − 0.12 = 2.88 < 2.9.
  EXPECT_EQ(run({.frequency_penalty = 0.06f}, {3.0f, 2.9f, 0.0f}, 3),
            (std::vector<int32_t>{0, 0, 1}));
  EXPECT_EQ(run({.presence_penalty = -1.0f}, {2.9f, 3.0f, 0.0f}, 3),
            (std::vector<int32_t>{1, 1, 1}));
  // With the repetition penalty, in llama.cpp's order: 3/1.5 − 0.2 = 1.8
  // against 2.9, then 2.9/1.5 − 0.2 = 1.73 against 1.8.
  EXPECT_EQ(run({.presence_penalty = 0.2f, .repetition_penalty = 1.5f},
                {3.0f, 2.9f, 0.0f}, 3),
            (std::vector<int32_t>{0, 1, 0}));
}

// Each token sampled counts; the logprobs reported stay the model's own.
TEST(SamplerTest, SampledTokensCountAndLogprobsStayRaw) {
  const std::vector<float> logits = {1.0f, 1.0f, 1.0f, 0.0f};
  Sampler s(SamplingParams{.presence_penalty = 2.0f});
  std::vector<int32_t> ids;
  for (int i = 0; i < 4; ++i) {
    auto t = s.Sample(logits).value();
    ids.push_back(t.id);
    const double z = std::log(3 * std::exp(1.0) + 1);
    EXPECT_NEAR(t.logprob, logits[t.id] - z, 1e-6);
  }
  // 0, 1, 2 each once (penalised to −1), then 3 (0 > −1).
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1, 2, 3}));
  Sampler r(SamplingParams{.repetition_penalty = 4.0f});
  EXPECT_EQ(r.Sample(logits).value().id, 0);
  EXPECT_EQ(r.Sample(logits).value().id, 1);  // 1/4 < 1
}

// min_p keeps the tokens at least min_p times as likely as the most
// likely one, at the sampling temperature.
TEST(SamplerTest, MinPDropsTheUnlikelyTail) {
  // Relative probabilities at T = 1: 1, 0.5, 0.04.
  const std::vector<float> logits = {0.0f, std::log(0.5f), std::log(0.04f)};
  std::map<int32_t, int> with, without;
  Sampler cut(SamplingParams{.temperature = 1, .seed = 3, .min_p = 0.1f});
  Sampler all(SamplingParams{.temperature = 1, .seed = 3});
  for (int i = 0; i < 3000; ++i) {
    ++with[cut.Sample(logits).value().id];
    ++without[all.Sample(logits).value().id];
  }
  EXPECT_EQ(with[2], 0);
  EXPECT_GT(with[1], 700);    // 0.5 / 1.5 of 3000 = 1000
  EXPECT_GT(without[2], 30);  // 0.04 / 1.54 of 3000 ≈ 78
  // At T = 2 the relative probabilities are square roots (0.2 for the
  // last), which min_p 0.1 keeps.
  Sampler hot(SamplingParams{.temperature = 2, .seed = 3, .min_p = 0.1f});
  int last = 0;
  for (int i = 0; i < 3000; ++i) last += hot.Sample(logits).value().id == 2;
  EXPECT_GT(last, 100);
}

TEST(TokenizerTest, BytesRoundTrip) {
  auto t = NewByteTokenizer();
  const std::string text = "Héllo ✓\n";
  auto ids = t->Encode(text);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->size(), text.size());
  EXPECT_EQ(t->Decode(*ids), text);
  EXPECT_EQ(t->TokenBytes(300), "");  // specials decode to nothing
}

}  // namespace
}  // namespace linattn
