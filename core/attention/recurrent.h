// The recurrent evaluation order: one token at a time, S and z updated in
// place (docs/design.md §1):
//   S_t = γ·S_{t−1} + φ(k_t)v_tᵀ,  z_t = γ·z_{t−1} + φ(k_t),
//   y_t = φ(q_t)ᵀS_t / (φ(q_t)ᵀz_t + ε)   (or φ(q_t)ᵀS_t, unnormalised)
//
// Every function validates all of its input before it touches any state;
// on error no state or position has changed. Each state may be updated by
// one caller at a time; distinct states may be stepped concurrently.
#ifndef LINATTN_CORE_ATTENTION_RECURRENT_H_
#define LINATTN_CORE_ATTENTION_RECURRENT_H_

#include <span>

#include "absl/status/status.h"
#include "core/attention/attention.h"

namespace linattn {

// One token (q, k: heads×d_k; v: heads×d_v) of one session.
absl::Status Step(const Attention& attention, AttentionState& state,
                  const SequenceInput& token, const SequenceOutput& out);

// One token for each of several sessions (the decode batch). Items may have
// different specs; each state may appear once. Heads of all items are spread
// over the OpenMP threads. Bit-identical to calling Step() per item.
//
// With `into` (a state of the same spec, distinct from every state and
// `into` of the batch) the step reads `state` and writes the state after
// the token to `into`, position and bound included; `state` is left as it
// was (but for its magnitude bound, which the checks may tighten). A caller
// that must be able to take a token back (a generation engine whose message may
// not reach its client) keeps the state before it this way without copying it.
struct StepItem {
  const Attention* attention = nullptr;
  AttentionState* state = nullptr;
  SequenceInput token;  // tokens must be 1
  SequenceOutput out;
  AttentionState* into = nullptr;
};
absl::Status StepBatch(std::span<const StepItem> items);
// StepBatch's checks alone: OK exactly when StepBatch(items) would run
// (barring a failed allocation); changes nothing but the states'
// magnitude bounds, which may tighten.
absl::Status CheckStepBatch(std::span<const StepItem> items);

// StepBatch in two phases, item by item, for a caller that records what
// will run between the checks and the run (the attention scheduler's
// durable round), so that every item is checked once:
//   CheckSteps checks each item as StepBatch does, on its own: results[i]
//   is OK when item i may run, else why not (its message without an
//   "items[i]." prefix); an item whose state (or `into`) is an earlier
//   item's is refused. grown[i] receives the bound of item i's state after
//   the step. Nothing changes but the states' magnitude bounds, which may
//   tighten.
//   RunCheckedSteps then runs, with no further checks, exactly the items
//   whose results are OK — the caller may have refused more since (a
//   request whose other item failed, a commit that did not take it) —
//   with the bounds CheckSteps measured. Nothing may touch the states in
//   between.
// Both spans have one entry per item.
void CheckSteps(std::span<const StepItem> items,
                std::span<absl::Status> results, std::span<double> grown);
void RunCheckedSteps(std::span<const StepItem> items,
                     std::span<const absl::Status> results,
                     std::span<const double> grown);

// `in.tokens` tokens of one session, one after another through Step's
// kernel (the token-by-token prefill).
absl::Status StepSequence(const Attention& attention, AttentionState& state,
                          const SequenceInput& in, const SequenceOutput& out);

}  // namespace linattn

#endif  // LINATTN_CORE_ATTENTION_RECURRENT_H_
