// MemoryBudget: the one limit on the memory clients make the server hold
// (--max-state-memory): the state of every session of both services, their
// feature maps' parameters, and the working copies of requests in progress.
//
// Everything is taken from the budget before it is allocated, so a request
// that does not fit is refused with RESOURCE_EXHAUSTED naming the limit
// (or waits, where the caller says so) instead of allocating first.
//
// Thread-safe.
//
//   auto budget = std::make_shared<MemoryBudget>(uint64_t{4} << 30);
//   LINATTN_ASSIGN_OR_RETURN(MemoryLease lease,
//                            budget->Lease(state_bytes, "prefill"));
#ifndef LINATTN_CORE_UTIL_MEMORY_BUDGET_H_
#define LINATTN_CORE_UTIL_MEMORY_BUDGET_H_

#include <cstdint>
#include <mutex>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace linattn {

class MemoryBudget;

// Bytes held from a MemoryBudget until the lease is destroyed.
class MemoryLease {
 public:
  MemoryLease() = default;
  MemoryLease(MemoryLease&& other) noexcept
      : budget_(std::exchange(other.budget_, nullptr)),
        bytes_(std::exchange(other.bytes_, 0)) {}
  MemoryLease& operator=(MemoryLease&& other) noexcept;
  ~MemoryLease() { Release(); }

  uint64_t bytes() const { return bytes_; }
  void Release();

 private:
  friend class MemoryBudget;
  MemoryLease(MemoryBudget* budget, uint64_t bytes)
      : budget_(budget), bytes_(bytes) {}
  MemoryBudget* budget_ = nullptr;
  uint64_t bytes_ = 0;
};

class MemoryBudget {
 public:
  // `limit` 0 = no limit.
  explicit MemoryBudget(uint64_t limit) : limit_(limit) {}

  // Takes `bytes`, or RESOURCE_EXHAUSTED: "<what>; R of the state memory
  // limit L bytes remain" (`what` names the field and says what needs how
  // much).
  absl::Status Take(uint64_t bytes, absl::string_view what);
  void Give(uint64_t bytes);
  // Take(), returned when the lease ends.
  absl::StatusOr<MemoryLease> Lease(uint64_t bytes, absl::string_view what);

  uint64_t limit() const { return limit_; }
  uint64_t in_use() const;
  // Whether `bytes` could ever be taken (the limit is at least that).
  bool CouldFit(uint64_t bytes) const { return limit_ == 0 || bytes <= limit_; }

 private:
  const uint64_t limit_;
  mutable std::mutex mu_;
  uint64_t in_use_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace linattn

#endif  // LINATTN_CORE_UTIL_MEMORY_BUDGET_H_
