// PrefillShares: how one attention round's prefill token budget is shared
// among the prefills in it. Prefills are served shortest first and each
// takes an even share of what is left, so what a short one needs less of
// goes to the longer ones. With several tenants prefilling, the budget is
// first shared among the tenants the same way (the tenant that needs least
// first), then within each: a tenant with hundreds of prefills takes its
// share of the round, not hundreds of shares.
//
//   PrefillShares shares(8192);
//   for (prefill p : shortest first) shares.Add(p.tenant, p.tokens_left);
//   shares.Split();
//   for (prefill p : same order) {
//     const uint64_t share = shares.Next(p.tenant);  // at most this now
//     ... run a slice of n ≤ share tokens ...;  shares.Took(p.tenant, n);
//   }
//
// Not thread-safe (one round's).
#ifndef LINATTN_CORE_SCHEDULER_PREFILL_SHARES_H_
#define LINATTN_CORE_SCHEDULER_PREFILL_SHARES_H_

#include <cstdint>
#include <string_view>
#include <unordered_map>

namespace linattn {

class PrefillShares {
 public:
  explicit PrefillShares(uint64_t budget) : budget_(budget) {}

  // One prefill of `tenant` that has `demand` tokens left.
  void Add(std::string_view tenant, uint64_t demand);
  // After the last Add: each tenant's part of the budget.
  void Split();
  // The share of the next prefill (in the order they were added), of
  // `tenant`: at least 1 token.
  uint64_t Next(std::string_view tenant);
  // That prefill ran `tokens` of them (a prefill that waits takes none).
  void Took(std::string_view tenant, uint64_t tokens);

 private:
  struct Tenant {
    uint64_t demand = 0;   // tokens its prefills have left
    uint64_t left = 0;     // of its part of the budget
    uint64_t waiting = 0;  // its prefills not yet served
  };
  uint64_t budget_;
  uint64_t added_ = 0, served_ = 0;
  std::unordered_map<std::string_view, Tenant> tenants_;
};

}  // namespace linattn

#endif  // LINATTN_CORE_SCHEDULER_PREFILL_SHARES_H_
