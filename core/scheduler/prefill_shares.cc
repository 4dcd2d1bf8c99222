#include "core/scheduler/prefill_shares.h"

#include <algorithm>
#include <vector>

namespace linattn {

void PrefillShares::Add(std::string_view tenant, uint64_t demand) {
  Tenant& t = tenants_[tenant];
  t.demand += demand;
  ++t.waiting;
  ++added_;
}

void PrefillShares::Split() {
  if (tenants_.size() < 2) return;
  std::vector<Tenant*> by_demand;
  for (auto& [name, t] : tenants_) by_demand.push_back(&t);
  std::sort(
      by_demand.begin(), by_demand.end(),
      [](const Tenant* a, const Tenant* b) { return a->demand < b->demand; });
  uint64_t left = budget_;
  for (size_t n = 0; n < by_demand.size(); ++n) {
    Tenant& t = *by_demand[n];
    t.left = std::min(t.demand, left / (by_demand.size() - n));
    left -= t.left;
  }
}

uint64_t PrefillShares::Next(std::string_view tenant) {
  const uint64_t served = served_++;
  if (tenants_.size() < 2) {
    return budget_ / std::max<uint64_t>(1, added_ - served);
  }
  Tenant& t = tenants_[tenant];
  const uint64_t waiting = std::max<uint64_t>(1, t.waiting);
  if (t.waiting > 0) --t.waiting;
  return std::max<uint64_t>(1, t.left / waiting);
}

void PrefillShares::Took(std::string_view tenant, uint64_t tokens) {
  budget_ -= std::min(budget_, tokens);
  if (tenants_.size() < 2) return;
  Tenant& t = tenants_[tenant];
  t.left -= std::min(t.left, tokens);
}

}  // namespace linattn
