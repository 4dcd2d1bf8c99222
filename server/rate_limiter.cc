#include "server/rate_limiter.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace linattn {

TokenRateLimiter::Bucket& TokenRateLimiter::Refilled(const Tenant& tenant) {
  const double rate = tenant.quota().tokens_per_second;
  // A second's worth (at least one token, so a rate below 1/s still lets
  // one token through).
  const double burst = std::max(1.0, rate);
  const auto now = std::chrono::steady_clock::now();
  auto [it, added] = buckets_.try_emplace(tenant.name(), Bucket{burst, now});
  Bucket& b = it->second;
  if (!added) {
    const double seconds = std::chrono::duration<double>(now - b.at).count();
    b.level = std::min(burst, b.level + seconds * rate);
    b.at = now;
  }
  return b;
}

absl::Status TokenRateLimiter::Take(const Tenant& tenant, double tokens) {
  const double rate = tenant.quota().tokens_per_second;
  if (!(rate > 0)) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  Bucket& b = Refilled(tenant);
  if (b.level < 0) {
    const int64_t wait_ms =
        static_cast<int64_t>(std::ceil(-b.level / rate * 1000.0));
    absl::Status refused = absl::ResourceExhaustedError(absl::StrFormat(
        "tokens: tenant '%s' is past its rate of %g tokens/s; retry in %d ms",
        tenant.name(), rate, wait_ms));
    refused.SetPayload(kRetryAfterPayload, absl::Cord(absl::StrCat(wait_ms)));
    return refused;
  }
  b.level -= tokens;
  return absl::OkStatus();
}

void TokenRateLimiter::GiveBack(const Tenant& tenant, double tokens) {
  const double rate = tenant.quota().tokens_per_second;
  if (!(rate > 0) || !(tokens > 0)) return;
  std::lock_guard<std::mutex> lock(mu_);
  Bucket& b = Refilled(tenant);
  b.level = std::min(std::max(1.0, rate), b.level + tokens);
}

std::optional<int64_t> RetryAfterMs(const absl::Status& status) {
  const auto payload = status.GetPayload(kRetryAfterPayload);
  int64_t ms = 0;
  if (!payload || !absl::SimpleAtoi(std::string(*payload), &ms)) {
    return std::nullopt;
  }
  return ms;
}

}  // namespace linattn
