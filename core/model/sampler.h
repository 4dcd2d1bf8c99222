// Sampling the next token from a model's logits.
//
//   penalties            first, on a copy of the logits, in llama.cpp's
//                        order: llama.cpp's repetition_penalty r for every
//                        token in the window (the last penalty_last_n tokens
//                        this Generate fed or made; −1: all of them):
//                        l ← l / r when l > 0, else l·r; then OpenAI's
//                        penalties for every token j this Generate has
//                        generated c_j > 0 times: l_j ← l_j −
//                        c_j·frequency_penalty − presence_penalty
//   temperature 0        greedy: the highest logit (lowest id on ties)
//   temperature T > 0    softmax(logits / T), restricted to the top_k
//                        highest (0 = all), then to the smallest set whose
//                        probability reaches top_p (1 = all), then to those
//                        at least min_p times as likely as the most likely
//                        (0 = all)
//
// A Sampler owns its random stream, seeded from `seed`: the same seed, model
// and prompt give the same tokens. Log-probabilities reported are the
// model's own, log_softmax(logits), whatever the sampling settings.
#ifndef LINATTN_CORE_MODEL_SAMPLER_H_
#define LINATTN_CORE_MODEL_SAMPLER_H_

#include <cstdint>
#include <deque>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace linattn {

struct SamplingParams {
  float temperature = 0.0f;
  uint32_t top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  uint32_t max_tokens = 16;
  float min_p = 0.0f;               // [0, 1]
  float presence_penalty = 0.0f;    // [−2, 2], on generated tokens
  float frequency_penalty = 0.0f;   // [−2, 2], on generated tokens
  float repetition_penalty = 1.0f;  // (0, 10]; 1 = none
  // repetition_penalty's window: this many most recent tokens (−1: every
  // token the Generate fed or made; 0: none).
  int32_t penalty_last_n = 64;
  std::vector<std::string> stop;  // generation ends before any of these
  bool logprobs = false;
  // With logprobs: the log-probabilities of this many most likely tokens
  // too (at most kMaxTopLogprobs), whatever was sampled.
  uint32_t top_logprobs = 0;
  // Continue the session's random stream (its last sampling Generate's seed,
  // from where that one stopped) instead of starting `seed`'s stream.
  bool resume_stream = false;
};

// Stop strings one Generate may give, and their longest (each is searched
// for in the held text at every token).
inline constexpr size_t kMaxStopStrings = 64;
inline constexpr size_t kMaxStopBytes = 1024;

// Largest top_logprobs one Generate may ask for.
inline constexpr uint32_t kMaxTopLogprobs = 20;

// Largest penalty_last_n (above it, −1 covers the whole request).
inline constexpr int32_t kMaxPenaltyWindow = 1 << 16;

// Largest max_tokens one Generate may ask for.
inline constexpr uint32_t kMaxGenerateTokens = 1u << 20;

// INVALID_ARGUMENT naming the field ("sampling.top_p: ...").
absl::Status ValidateSampling(const SamplingParams& params);

struct SampledToken {
  int32_t id = 0;
  float logprob = 0.0f;  // log_softmax(logits)[id]
  // SamplingParams::top_logprobs most likely (id, logprob), highest first
  // (lower id first on ties).
  std::vector<std::pair<int32_t, float>> top;
};

// Where a model session's random stream stands: the seed of its last
// Generate that sampled at a temperature above 0, and the draws taken from
// that seed's stream so far (one per sampled token). A Generate asking to
// resume the stream starts there (SamplingParams::resume_stream), so a
// client whose Generate was cut gets what the uncut one would have given.
struct SamplerPosition {
  uint64_t seed = 0;
  uint64_t draws = 0;
  bool set = false;  // no Generate has sampled yet
  bool operator==(const SamplerPosition&) const = default;
};

class Sampler {
 public:
  // The stream of params.seed, with its first `skip` draws taken already.
  explicit Sampler(const SamplingParams& params, uint64_t skip = 0);
  // Draws taken from the stream so far (skipped ones included): one per
  // token sampled at a temperature above 0.
  uint64_t draws() const { return draws_; }
  // INTERNAL when no logit is finite (a broken model), never otherwise.
  // The token chosen counts as generated and joins the window.
  absl::StatusOr<SampledToken> Sample(std::span<const float> logits);
  // Tokens fed before the first Sample (the prompt) join the window.
  void Observe(std::span<const int32_t> tokens);

 private:
  bool repetition_penalized() const;
  bool openai_penalized() const;
  // Sample's choice from `logits` (penalised) with logprobs from `raw`.
  absl::StatusOr<SampledToken> SampleFrom(std::span<const float> logits,
                                          std::span<const float> raw);
  void Push(int32_t token);
  // The token drawn (greedy at temperature 0), without its logprob.
  SampledToken Choose(std::span<const float> logits, float max, int32_t argmax);
  SamplingParams params_;
  std::mt19937_64 rng_;
  uint64_t draws_ = 0;
  std::vector<std::pair<float, int32_t>> order_;
  // The repetition window's tokens (oldest first) and their counts, the
  // generated tokens' counts, and the logits with the penalties applied.
  std::deque<int32_t> window_;
  std::unordered_map<int32_t, uint32_t> window_counts_;
  std::unordered_map<int32_t, uint32_t> generated_counts_;
  std::vector<float> penalized_;
  std::vector<float> exps_;  // SampleFrom's exp(l − max), reused
};

}  // namespace linattn

#endif  // LINATTN_CORE_MODEL_SAMPLER_H_
