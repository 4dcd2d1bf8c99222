#include "core/scheduler/iteration_planner.h"

#include <algorithm>
#include <numeric>

namespace linattn {

std::vector<uint32_t> PlanIteration(std::span<const PlanCandidate> candidates,
                                    PlanLimits limits) {
  std::vector<uint32_t> take(candidates.size(), 0);
  std::vector<size_t> order(candidates.size());
  std::iota(order.begin(), order.end(), 0);
  auto older = [&](size_t a, size_t b) {
    return candidates[a].seq < candidates[b].seq;
  };
  std::stable_sort(order.begin(), order.end(), older);
  uint64_t budget = std::max<uint32_t>(limits.token_budget, 1);
  uint32_t decode_rows = 0;
  std::vector<size_t> prompts;
  for (size_t i : order) {
    if (candidates[i].left != 1) {
      prompts.push_back(i);
      continue;
    }
    if (budget == 0 || decode_rows == limits.max_batch) continue;
    ++decode_rows;
    take[i] = 1;
    budget -= 1;
  }
  // With more prompts than tokens left, the oldest get one each (`prompts`
  // is oldest first here).
  if (prompts.size() > budget) prompts.resize(budget);
  std::stable_sort(prompts.begin(), prompts.end(), [&](size_t a, size_t b) {
    return candidates[a].left < candidates[b].left;
  });
  for (size_t n = 0; n < prompts.size(); ++n) {
    const size_t i = prompts[n];
    const uint64_t share = std::max<uint64_t>(1, budget / (prompts.size() - n));
    take[i] = static_cast<uint32_t>(std::min(candidates[i].left, share));
    budget -= take[i];
  }
  return take;
}

}  // namespace linattn
