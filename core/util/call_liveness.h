// CallLiveness: whether the caller of a request is still waiting for it.
//
// Work is committed only while its caller waits: a request whose deadline
// has passed, or whose caller cancelled, before it commits is dropped and
// changes nothing; one that commits is reported as done (docs/design.md,
// "Work ends with its call"). Core code asks; the server says how to tell
// (gRPC's deadline and cancellation), so core/ knows nothing of gRPC.
//
// Copyable; Check() is thread-safe if `cancelled` is.
#ifndef LINATTN_CORE_UTIL_CALL_LIVENESS_H_
#define LINATTN_CORE_UTIL_CALL_LIVENESS_H_

#include <chrono>
#include <functional>
#include <utility>

#include "absl/status/status.h"

namespace linattn {

class CallLiveness {
 public:
  using Clock = std::chrono::steady_clock;

  // A caller that waits for ever (in-process use, tests).
  CallLiveness() = default;
  // `deadline` Clock::time_point::max() = none; `cancelled` may be empty.
  CallLiveness(Clock::time_point deadline, std::function<bool()> cancelled)
      : deadline_(deadline), cancelled_(std::move(cancelled)) {}

  // OK while the caller waits; else DEADLINE_EXCEEDED or CANCELLED, saying
  // that nothing was applied.
  absl::Status Check() const {
    if (deadline_ != Clock::time_point::max() && Clock::now() >= deadline_) {
      return absl::DeadlineExceededError(
          "the deadline passed before the request was applied; nothing "
          "changed");
    }
    if (cancelled_ && cancelled_()) {
      return absl::CancelledError(
          "the call was cancelled before the request was applied; nothing "
          "changed");
    }
    return absl::OkStatus();
  }

 private:
  Clock::time_point deadline_ = Clock::time_point::max();
  std::function<bool()> cancelled_;
};

}  // namespace linattn

#endif  // LINATTN_CORE_UTIL_CALL_LIVENESS_H_
