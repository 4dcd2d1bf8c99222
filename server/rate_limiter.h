// TokenRateLimiter: each tenant's `tokens_per_second` (server/api_keys.h),
// as a token bucket holding one second's worth (docs/design.md, "Tenants
// and keys").
//
// A request is charged the tokens it brings when it is admitted — a
// prefill its tokens, a decode step one, a generation its prompt and its
// max_tokens (what it did not generate is given back at its end). It is
// admitted while the tenant's bucket is not in debt, so one request may
// take it below zero; the next then waits until the rate has paid that
// back: RESOURCE_EXHAUSTED saying after how long (`retry-after-ms`
// trailing metadata on gRPC, Retry-After on HTTP). Refusing costs a hash
// lookup: a tenant past its rate takes nothing from the compute worker.
#ifndef LINATTN_SERVER_RATE_LIMITER_H_
#define LINATTN_SERVER_RATE_LIMITER_H_

#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/session/tenant.h"

namespace linattn {

// The payload key of a refusal's wait, in milliseconds (decimal text).
inline constexpr char kRetryAfterPayload[] =
    "type.googleapis.com/linattn.RetryAfterMs";

class TokenRateLimiter {
 public:
  // Charges `tokens` to `tenant` (no rate: OK, nothing kept).
  absl::Status Take(const Tenant& tenant, double tokens);
  // Gives back tokens charged but not used (a generation that ended early).
  void GiveBack(const Tenant& tenant, double tokens);

 private:
  struct Bucket {
    double level = 0;
    std::chrono::steady_clock::time_point at;
  };
  // Under mu_: `tenant`'s bucket refilled to now.
  Bucket& Refilled(const Tenant& tenant);

  std::mutex mu_;
  std::unordered_map<std::string, Bucket> buckets_;
};

// The wait a refusal carries, if it is one of the limiter's.
std::optional<int64_t> RetryAfterMs(const absl::Status& status);

}  // namespace linattn

#endif  // LINATTN_SERVER_RATE_LIMITER_H_
