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
  auto owner_full = [&] {
    const auto it = held_.find(name);
    return it != held_.end() && (it->second.count >= max_count ||
                                 it->second.bytes + bytes > max_bytes_);
  };
  auto full = [&] {
    return owner_full() || entries_.size() >= max_count_ ||
           bytes_ + bytes > max_bytes_;
  };
  if (full()) {
    // Those whose sessions went (idle TTL, deleted) go first.
    for (auto it = entries_.begin(); it != entries_.end();) {
      it = engine_->sessions().Contains(it->first) ? std::next(it)
                                                   : EraseLocked(it);
    }
  }
  while (!entries_.empty() && full()) {
    // Still full: the oldest of the owner's own when it is at its bound,
    // else (the whole store is) of the tenant holding the most.
    std::string from = name;
    if (!owner_full()) {
      size_t most = 0;
      for (const auto& [tenant, h] : held_) {
        if (h.count > most) {
          most = h.count;
          from = tenant;
        }
      }
    }
    auto oldest = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->second.owner == from &&
          (oldest == entries_.end() ||
           it->second.order < oldest->second.order)) {
        oldest = it;
      }
    }
    if (oldest == entries_.end()) break;  // cannot happen: `from` holds one
    engine_->Delete(
        oldest->first, [](absl::Status) {}, CallLiveness(), Tenant::Server());
    EraseLocked(oldest);
  }
  Held& h = held_[name];
  ++h.count;
  h.bytes += bytes;
  bytes_ += bytes;
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
  bytes_ -= it->second.bytes;
  auto h = held_.find(it->second.owner);
  if (h != held_.end()) {
    --h->second.count;
    h->second.bytes -= it->second.bytes;
    if (h->second.count == 0) held_.erase(h);
  }
  return entries_.erase(it);
}

}  // namespace linattn
