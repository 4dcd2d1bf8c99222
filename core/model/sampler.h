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
};

// Largest max_tokens one Generate may ask for.
inline constexpr uint32_t kMaxGenerateTokens = 1u << 20;

// INVALID_ARGUMENT naming the field ("sampling.top_p: ...").
absl::Status ValidateSampling(const SamplingParams& params);

struct SampledToken {
  int32_t id = 0;
  float logprob = 0.0f;  // log_softmax(logits)[id]
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // INTERNAL when no logit is finite (a broken model), never otherwise.
  absl::StatusOr<SampledToken> Sample(std::span<const float> logits);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> order_;
};

}  // namespace linattn

#endif  // LINATTN_CORE_MODEL_SAMPLER_H_
