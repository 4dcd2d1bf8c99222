#include "server/openai/response_store.h"

#include <iterator>

#include "server/engine_calls.h"

namespace linattn {

ResponseStore::ResponseStore(GenerationEngine* engine, size_t max_count,
                             size_t max_bytes)
    : engine_(engine), max_count_(max_count), max_bytes_(max_bytes) {}

bool ResponseStore::Keep(const std::string& id, const json& body,
                         bool ended_at_marker, const std::string& owner,
                         std::vector<ChatMessage> conversation) {
  size_t bytes = DumpJson(body).size();
  for (const ChatMessage& m : conversation) {
    bytes += m.role.size() + m.content.size();
  }
  // One body must not push out the others.
  if (bytes > max_bytes_ / 16) return false;
  std::lock_guard<std::mutex> lock(mu_);
  auto full = [&] {
    return entries_.size() >= max_count_ || bytes_ + bytes > max_bytes_;
  };
  if (full()) {
    // Those whose sessions went (idle TTL, deleted) go first.
    for (auto it = entries_.begin(); it != entries_.end();) {
      it = engine_->sessions().Contains(it->first) ? std::next(it)
                                                   : EraseLocked(it);
    }
  }
  while (!entries_.empty() && full()) {
    // Still full: the oldest goes, with its state.
    auto oldest = entries_.begin();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->second.order < oldest->second.order) oldest = it;
    }
    engine_->Delete(
        oldest->first, [](absl::Status) {}, CallLiveness(), Tenant::Server());
    EraseLocked(oldest);
  }
  bytes_ += bytes;
  entries_[id] = Entry{body,  next_order_++,          bytes, ended_at_marker,
                       owner, std::move(conversation)};
  return true;
}

std::optional<ResponseStore::Entry> ResponseStore::Find(const std::string& id,
                                                        const Tenant& tenant) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || !tenant.Sees(it->second.owner)) {
    return std::nullopt;
  }
  if (!engine_->sessions().Contains(id)) {  // its state expired
    EraseLocked(it);
    return std::nullopt;
  }
  return it->second;
}

void ResponseStore::Forget(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  if (it != entries_.end()) EraseLocked(it);
}

ResponseStore::Map::iterator ResponseStore::EraseLocked(Map::iterator it) {
  bytes_ -= it->second.bytes;
  return entries_.erase(it);
}

}  // namespace linattn
