#include "core/util/memory_budget.h"

#include "absl/strings/str_cat.h"

namespace linattn {

MemoryLease& MemoryLease::operator=(MemoryLease&& other) noexcept {
  if (this != &other) {
    Release();
    budget_ = std::exchange(other.budget_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void MemoryLease::Release() {
  if (budget_ != nullptr) budget_->Give(bytes_);
  budget_ = nullptr;
  bytes_ = 0;
}

absl::Status MemoryBudget::Take(uint64_t bytes, absl::string_view what) {
  std::lock_guard<std::mutex> lock(mu_);
  if (limit_ != 0) {
    const uint64_t remain = in_use_ >= limit_ ? 0 : limit_ - in_use_;
    if (bytes > remain) {
      return absl::ResourceExhaustedError(
          absl::StrCat(what, "; ", remain, " of the state memory limit ",
                       limit_, " bytes remain"));
    }
  }
  in_use_ += bytes;
  return absl::OkStatus();
}

void MemoryBudget::Give(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  in_use_ -= bytes;
}

absl::StatusOr<MemoryLease> MemoryBudget::Lease(uint64_t bytes,
                                                absl::string_view what) {
  if (absl::Status s = Take(bytes, what); !s.ok()) return s;
  return MemoryLease(this, bytes);
}

uint64_t MemoryBudget::in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}

}  // namespace linattn
