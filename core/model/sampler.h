// Sampling the next token from a model's logits.
//
//   temperature 0        greedy: the highest logit (lowest id on ties)
//   temperature T > 0    softmax(logits / T), restricted to the top_k
//                        highest (0 = all) and then to the smallest set whose
//                        probability reaches top_p (1 = all)
//
// A Sampler owns its random stream, seeded from `seed`: the same seed, model
// and prompt give the same tokens. Log-probabilities reported are the
// model's own, log_softmax(logits), whatever the sampling settings.
#ifndef LINATTN_CORE_MODEL_SAMPLER_H_
#define LINATTN_CORE_MODEL_SAMPLER_H_

#include <cstdint>
#include <random>
#include <span>
#include <string>
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
  absl::StatusOr<SampledToken> Sample(std::span<const float> logits);

 private:
  // The token drawn (greedy at temperature 0), without its logprob.
  SampledToken Choose(std::span<const float> logits, float max, int32_t argmax);
  SamplingParams params_;
  std::mt19937_64 rng_;
  uint64_t draws_ = 0;
  std::vector<std::pair<float, int32_t>> order_;
};

}  // namespace linattn

#endif  // LINATTN_CORE_MODEL_SAMPLER_H_
