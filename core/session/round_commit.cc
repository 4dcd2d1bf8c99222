#include "core/session/round_commit.h"

#include <algorithm>

namespace linattn {

absl::Status HandedOverError() {
  return absl::AbortedError(
      "session_id: the session was handed over to another replica while this "
      "request was under way; nothing of it from then on is kept here (send "
      "it again: the session's owner serves it)");
}

uint32_t RoundCommit::Begin() {
  group_.BeginRequest();
  return requests_++;
}

bool RoundCommit::HasWork() const {
  return store_ != nullptr && (!group_.empty() || store_->has_staged());
}

void RoundCommit::Commit() {
  if (store_ == nullptr) return;
  status_ = store_->Commit(std::move(group_), &refused_);
  group_ = DurableStore::Group();
  std::sort(refused_.begin(), refused_.end());
}

absl::Status RoundCommit::Outcome(uint32_t request) const {
  if (!status_.ok()) return status_;
  if (std::binary_search(refused_.begin(), refused_.end(), request)) {
    return HandedOverError();
  }
  return absl::OkStatus();
}

}  // namespace linattn
