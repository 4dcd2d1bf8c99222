// PlanIteration: which requests feed how many tokens in one generation
// iteration. Pure: no threads, no sessions, so tests drive it directly.
//
// Each candidate is the running request at the head of one session's
// queue, with `left` tokens still to feed (1 for a request that is
// decoding: its last sampled token). Decode rows go first, oldest request
// first, up to max_batch of them and the token budget; prompts (Append and
// a Generate's prompt alike) share what is left evenly, the shortest first
// so that what one leaves goes to the longer ones; with more prompts than
// tokens left, the oldest get one token each. So running streams keep
// flowing while long prompts are consumed piece by piece, and a new short
// prompt is not held behind a long one.
//
// Candidates belong to groups (tenants, core/session/tenant.h). Where not
// every candidate fits — more decode rows than max_batch, more prompts
// than tokens — the groups take turns, each its oldest first, so a tenant
// with many requests cannot hold another's out of the iteration: each of
// g groups gets at least ⌊max_batch / g⌋ decode rows when it has them.
#ifndef LINATTN_CORE_SCHEDULER_ITERATION_PLANNER_H_
#define LINATTN_CORE_SCHEDULER_ITERATION_PLANNER_H_

#include <cstdint>
#include <span>
#include <vector>

namespace linattn {

struct PlanCandidate {
  uint64_t seq = 0;    // arrival order of the request (smaller = older)
  uint64_t left = 0;   // tokens left to feed, at least 1
  uint32_t group = 0;  // whose request (groups take turns)
};

struct PlanLimits {
  uint32_t token_budget = 256;  // rows per iteration (at least 1 is used)
  uint32_t max_batch = 128;     // decode rows per iteration
};

// Tokens each candidate feeds this iteration (0: not in this one), in the
// candidates' order.
std::vector<uint32_t> PlanIteration(std::span<const PlanCandidate> candidates,
                                    PlanLimits limits);

}  // namespace linattn

#endif  // LINATTN_CORE_SCHEDULER_ITERATION_PLANNER_H_
