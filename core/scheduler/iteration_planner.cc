#include "core/scheduler/iteration_planner.h"

#include <algorithm>
#include <numeric>
#include <unordered_map>

namespace linattn {

namespace {

// `order` (oldest first) rearranged so that groups take turns: the oldest
// of every group (groups in the order of their oldest), then the second
// oldest of each, and so on. One group: `order` as it was.
std::vector<size_t> TakingTurns(std::span<const PlanCandidate> candidates,
                                const std::vector<size_t>& order) {
  std::vector<std::vector<size_t>> groups;
  std::unordered_map<uint32_t, size_t> index;
  for (size_t i : order) {
    auto [it, added] = index.emplace(candidates[i].group, groups.size());
    if (added) groups.emplace_back();
    groups[it->second].push_back(i);
  }
  if (groups.size() <= 1) return order;
  std::vector<size_t> out;
  out.reserve(order.size());
  for (size_t turn = 0; out.size() < order.size(); ++turn) {
    for (const std::vector<size_t>& g : groups) {
      if (turn < g.size()) out.push_back(g[turn]);
    }
  }
  return out;
}

}  // namespace

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
  std::vector<size_t> decodes, prompts;
  for (size_t i : order) {
    (candidates[i].left == 1 ? decodes : prompts).push_back(i);
  }
  for (size_t i : TakingTurns(candidates, decodes)) {
    if (budget == 0 || decode_rows == limits.max_batch) break;
    ++decode_rows;
    take[i] = 1;
    budget -= 1;
  }
  // With more prompts than tokens left, the oldest of each group in turn
  // get one each.
  if (prompts.size() > budget) {
    prompts = TakingTurns(candidates, prompts);
    prompts.resize(budget);
  }
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
