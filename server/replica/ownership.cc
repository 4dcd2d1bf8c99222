#include "server/replica/ownership.h"

namespace linattn {

void Ownership::Own(const Key& session, uint64_t epoch, uint64_t appended) {
  std::lock_guard<std::mutex> lock(mu_);
  owned_[session] = Owned{epoch, appended};
}

void Ownership::Appended(const Key& session, uint64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = owned_.find(session);
  if (it != owned_.end()) it->second.appended += n;
}

std::optional<Ownership::Owned> Ownership::Find(const Key& session) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = owned_.find(session);
  if (it == owned_.end()) return std::nullopt;
  return it->second;
}

void Ownership::Forget(const Key& session) {
  std::lock_guard<std::mutex> lock(mu_);
  owned_.erase(session);
}

void Ownership::HandedOver(const Key& session) {
  std::lock_guard<std::mutex> lock(mu_);
  owned_.erase(session);
  if (handed_over_.insert(session).second) {
    handed_over_order_.push_back(session);
    if (handed_over_order_.size() > kMaxHandedOver) {
      handed_over_.erase(handed_over_order_.front());
      handed_over_order_.pop_front();
    }
  }
}

Ownership::View Ownership::Look(std::span<const Key> sessions) const {
  std::lock_guard<std::mutex> lock(mu_);
  View view;
  for (const Key& key : sessions) {
    if (auto it = owned_.find(key); it != owned_.end()) {
      view.held.emplace(key, it->second);
    } else if (handed_over_.count(key) != 0) {
      view.handed_over.insert(key);
    }
  }
  return view;
}

std::vector<Ownership::Held> Ownership::All() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Held> out;
  out.reserve(owned_.size());
  for (const auto& [key, owned] : owned_) out.push_back({key, owned.epoch});
  return out;
}

std::vector<Ownership::Key> Ownership::Of(
    std::span<const std::string> ids) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Key> out;
  for (const std::string& id : ids) {
    for (auto it = owned_.lower_bound({id, 0});
         it != owned_.end() && it->first.first == id; ++it) {
      out.push_back(it->first);
    }
  }
  return out;
}

}  // namespace linattn
