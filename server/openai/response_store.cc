#include "server/openai/response_store.h"

#include <algorithm>
#include <iterator>

#include "server/engine_calls.h"

namespace linattn {

ResponseStore::ResponseStore(GenerationEngine* engine, size_t max_count,
                             size_t max_bytes)
    : engine_(engine), max_count_(max_count), max_bytes_(max_bytes) {}

bool ResponseStore::Keep(const std::string& id, const json& body,
                         bool ended_at_marker, const Tenant& owner,
                         std::vector<ChatMessage> conversation) {
  size_t bytes = DumpJson(body).size();
  for (const ChatMessage& m : conversation) {
    bytes += m.role.size() + m.content.size();
  }
  // One body must not push out the others.
  if (bytes > max_bytes_ / 16) return false;
  size_t max_count = max_count_;
  if (const uint64_t quota = owner.quota().max_sessions; quota != 0) {
    max_count = std::min<size_t>(max_count, std::max<uint64_t>(1, quota / 4));
  }
  const std::string& name = owner.name();
  std::lock_guard<std::mutex> lock(mu_);
  auto full = [&] {
    const Held& h = held_[name];
    return h.count >= max_count || h.bytes + bytes > max_bytes_;
  };
  if (full()) {
    // Those whose sessions went (idle TTL, deleted) go first.
    for (auto it = entries_.begin(); it != entries_.end();) {
      it = engine_->sessions().Contains(it->first) ? std::next(it)
                                                   : EraseLocked(it);
    }
  }
  while (full()) {
    // Still full: the owner's own oldest goes, with its state.
    auto oldest = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->second.owner == name &&
          (oldest == entries_.end() ||
           it->second.order < oldest->second.order)) {
        oldest = it;
      }
    }
    if (oldest == entries_.end()) break;  // holds none: cannot happen
    engine_->Delete(
        oldest->first, [](absl::Status) {}, CallLiveness(), Tenant::Server());
    EraseLocked(oldest);
  }
  Held& h = held_[name];
  ++h.count;
  h.bytes += bytes;
  entries_[id] = Entry{body, next_order_++,          bytes, ended_at_marker,
                       name, std::move(conversation)};
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
  auto h = held_.find(it->second.owner);
  if (h != held_.end()) {
    --h->second.count;
    h->second.bytes -= it->second.bytes;
    if (h->second.count == 0) held_.erase(h);
  }
  return entries_.erase(it);
}

}  // namespace linattn
