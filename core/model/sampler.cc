#include "core/model/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/attention/kernels.h"
#include "core/model/row_ops.h"

namespace linattn {

absl::Status ValidateSampling(const SamplingParams& p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampling.temperature: must be finite and >= 0, got ", p.temperature));
  }
  if (!(p.top_p > 0 && p.top_p <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.top_p: must be in (0, 1], got ", p.top_p));
  }
  if (p.max_tokens == 0 || p.max_tokens > kMaxGenerateTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.max_tokens: must be in [1, ", kMaxGenerateTokens,
                     "], got ", p.max_tokens));
  }
  if (!(p.min_p >= 0 && p.min_p <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.min_p: must be in [0, 1], got ", p.min_p));
  }
  for (auto [name, v] :
       {std::pair<const char*, float>{"presence_penalty", p.presence_penalty},
        {"frequency_penalty", p.frequency_penalty}}) {
    if (!(v >= -2 && v <= 2)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling.", name, ": must be in [-2, 2], got ", v));
    }
  }
  if (!(p.repetition_penalty > 0 && p.repetition_penalty <= 10)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.repetition_penalty: must be in (0, 10], got ",
                     p.repetition_penalty));
  }
  if (p.penalty_last_n < -1 || p.penalty_last_n > kMaxPenaltyWindow) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.penalty_last_n: must be -1 (all) or in [0, ",
                     kMaxPenaltyWindow, "], got ", p.penalty_last_n));
  }
  if (p.top_logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.top_logprobs: must be in [0, ", kMaxTopLogprobs,
                     "], got ", p.top_logprobs));
  }
  if (p.stop.size() > kMaxStopStrings) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.stop: at most ", kMaxStopStrings,
                     " strings, got ", p.stop.size()));
  }
  for (size_t i = 0; i < p.stop.size(); ++i) {
    if (p.stop[i].empty() || p.stop[i].size() > kMaxStopBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling.stop[", i, "]: must be 1 to ", kMaxStopBytes,
                       " bytes, got ", p.stop[i].size()));
    }
  }
  return absl::OkStatus();
}

Sampler::Sampler(const SamplingParams& params, uint64_t skip)
    : params_(params), rng_(params.seed), draws_(skip) {
  rng_.discard(skip);
}

bool Sampler::repetition_penalized() const {
  return params_.penalty_last_n != 0 && params_.repetition_penalty != 1;
}

bool Sampler::openai_penalized() const {
  return params_.presence_penalty != 0 || params_.frequency_penalty != 0;
}

void Sampler::Push(int32_t token) {
  if (!repetition_penalized()) return;
  ++window_counts_[token];
  if (params_.penalty_last_n < 0) return;  // every token counts
  window_.push_back(token);
  if (window_.size() > static_cast<size_t>(params_.penalty_last_n)) {
    auto it = window_counts_.find(window_.front());
    if (--it->second == 0) window_counts_.erase(it);
    window_.pop_front();
  }
}

void Sampler::Observe(std::span<const int32_t> tokens) {
  for (int32_t t : tokens) Push(t);
}

absl::StatusOr<SampledToken> Sampler::Sample(std::span<const float> raw) {
  // The chosen token comes from the penalised logits; logprobs stay the
  // model's own.
  std::span<const float> logits = raw;
  if (!window_counts_.empty() || !generated_counts_.empty()) {
    penalized_.assign(raw.begin(), raw.end());
    auto in_range = [&](int32_t id) {
      return id >= 0 && static_cast<size_t>(id) < penalized_.size();
    };
    const float r = params_.repetition_penalty;
    for (const auto& [id, count] : window_counts_) {
      if (!in_range(id)) continue;
      float& l = penalized_[id];
      l = l > 0 ? l / r : l * r;
    }
    for (const auto& [id, count] : generated_counts_) {
      if (!in_range(id)) continue;
      penalized_[id] -= static_cast<float>(count) * params_.frequency_penalty +
                        params_.presence_penalty;
    }
    logits = penalized_;
  }
  absl::StatusOr<SampledToken> token = SampleFrom(logits, raw);
  if (token.ok()) {
    Push(token->id);
    if (openai_penalized()) ++generated_counts_[token->id];
  }
  return token;
}

absl::StatusOr<SampledToken> Sampler::SampleFrom(std::span<const float> logits,
                                                 std::span<const float> raw) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  float max = neg_inf;
  int32_t argmax = -1;
  for (size_t i = 0; i < logits.size(); ++i) {
    float l = logits[i];
    if (std::isfinite(l) && (argmax < 0 || l > max)) {
      max = l;
      argmax = static_cast<int32_t>(i);
    }
  }
  if (argmax < 0) {
    return absl::InternalError("the model produced no finite logit");
  }
  SampledToken result = Choose(logits, max, argmax);
  // log_softmax of the model's own logits: log Σ exp(l − max) over the
  // finite ones, each exp by the vectorised kernel (within 2 ulp, so the
  // sum within 4u relative, the log within 4u absolute: well below the
  // float the logprob is reported in) and summed in double.
  float raw_max = max;  // the same logits when nothing is penalised
  if (raw.data() != logits.data()) {
    raw_max = neg_inf;
    for (float l : raw) {
      if (std::isfinite(l) && l > raw_max) raw_max = l;
    }
  }
  exps_.resize(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    exps_[i] = std::isfinite(raw[i]) ? raw[i] : neg_inf;  // exp → 0
  }
  ActiveKernels().exp_shifted(static_cast<uint32_t>(exps_.size()), raw_max,
                              1.0f, exps_.data());
  // In independent partial sums (a vocabulary's worth of dependent double
  // adds was most of this function's time).
  const double sum = SumInDouble(exps_.data(), exps_.size());
  const double log_z = raw_max + std::log(sum);
  auto logprob = [&](int32_t id) {
    return static_cast<float>(raw[id] - log_z);
  };
  result.logprob = logprob(result.id);
  if (params_.logprobs && params_.top_logprobs > 0) {
    // The most likely tokens, apart from the sampling's own order (which
    // top_k may have cut): a heap of the best `n` over every finite logit.
    const size_t n = params_.top_logprobs;
    auto better = [&](int32_t a, int32_t b) {
      return raw[a] != raw[b] ? raw[a] > raw[b] : a < b;
    };
    std::vector<int32_t> best;
    for (size_t i = 0; i < raw.size(); ++i) {
      if (!std::isfinite(raw[i])) continue;
      const int32_t id = static_cast<int32_t>(i);
      if (best.size() < n) {
        best.push_back(id);
        std::push_heap(best.begin(), best.end(), better);
      } else if (better(id, best.front())) {
        std::pop_heap(best.begin(), best.end(), better);
        best.back() = id;
        std::push_heap(best.begin(), best.end(), better);
      }
    }
    std::sort_heap(best.begin(), best.end(), better);
    for (int32_t id : best) result.top.emplace_back(id, logprob(id));
  }
  return result;
}

SampledToken Sampler::Choose(std::span<const float> logits, float max,
                             int32_t argmax) {
  if (params_.temperature == 0.0f) {
    return SampledToken{argmax};
  }
  order_.clear();
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isfinite(logits[i])) {
      order_.emplace_back(logits[i], static_cast<int32_t>(i));
    }
  }
  // Highest logits first, lower id first on ties: a total order, so the
  // result does not depend on the sort's algorithm.
  auto before = [](const std::pair<float, int32_t>& a,
                   const std::pair<float, int32_t>& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  size_t keep = order_.size();
  if (params_.top_k > 0 && params_.top_k < keep) {
    keep = params_.top_k;
    std::partial_sort(order_.begin(), order_.begin() + keep, order_.end(),
                      before);
  } else {
    std::sort(order_.begin(), order_.end(), before);
  }
  order_.resize(keep);
  std::vector<double> p(keep);
  double total = 0;
  const double inv_t = 1.0 / params_.temperature;
  for (size_t i = 0; i < keep; ++i) {
    p[i] = std::exp((static_cast<double>(order_[i].first) - max) * inv_t);
    total += p[i];
  }
  if (params_.top_p < 1.0f) {
    double cumulative = 0;
    size_t n = 0;
    while (n < keep) {
      cumulative += p[n] / total;
      ++n;
      if (cumulative >= params_.top_p) break;
    }
    keep = n;
  }
  if (params_.min_p > 0.0f) {
    // p[0] = 1 is the most likely token's weight.
    size_t n = 1;
    while (n < keep && p[n] >= params_.min_p) ++n;
    keep = n;
  }
  if (keep < order_.size()) {
    total = 0;
    for (size_t i = 0; i < keep; ++i) total += p[i];
  }
  // u in [0, 1) from 53 random bits: the same on every platform.
  ++draws_;
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * total;
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) return SampledToken{order_[i].second};
  }
  return SampledToken{order_[keep - 1].second};
}

}  // namespace linattn
