// Scheduler: attention sessions' requests, in rounds. Requests of many
// sessions queue here; the compute worker (ComputeExecutor, shared with the
// generation engine) takes them in rounds and runs each round as batches:
//   - decode steps of all sessions in the round (single steps and step
//     groups alike) → one StepBatch call;
//   - prefills of all sessions in the round → one chunkwise Run (every
//     (session, head, chunk) one element of the same batched matmuls);
//   - other state work (inspect, snapshot, fork) → one call each.
// A round holds at most one request per session, taken in arrival order, so
// a session's requests run strictly in order and one at a time, while
// different sessions run together. Parallelism inside a round comes from the
// kernels' OpenMP threads: the executor's one team, shared with oneDNN and
// the generation engine, so nothing is oversubscribed.
//
// Prefills share a per-round token budget: a long prefill runs a slice per
// round on a working copy of its session's state (taken from the memory
// budget) and commits when its last slice is done, so other sessions' steps
// and short prompts keep flowing meanwhile (at most one round's wait).
//
// Every request is validated once, on its own, before it joins a batch, so
// one bad request fails alone and changes nothing; `done` is called exactly
// once, on
// the compute worker (or the caller's, if the scheduler has stopped). A
// request whose caller has gone (CallLiveness) before it commits is dropped
// and changes nothing; one that committed reports OK.
//
// Thread-safe. Callers keep input and output buffers alive until `done`.
#ifndef LINATTN_CORE_SCHEDULER_SCHEDULER_H_
#define LINATTN_CORE_SCHEDULER_SCHEDULER_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "core/attention/chunkwise.h"
#include "core/scheduler/compute_executor.h"
#include "core/session/durable_store.h"
#include "core/session/session_manager.h"
#include "core/util/call_liveness.h"
#include "core/util/memory_budget.h"

namespace linattn {

struct SchedulerOptions {
  uint32_t max_round = 1024;  // requests per round
  // Prefill tokens per round over all sessions, shared evenly among the
  // prefills in the round (what one needs less of goes to the others).
  uint64_t prefill_tokens_per_round = 8192;
  // The chunkwise workspace a round's prefills may need: prefills beyond it
  // wait for the next round (one always runs, with at least one chunk per
  // head), so many short prefills at once cannot grow it without bound.
  uint64_t prefill_workspace_bytes = uint64_t{64} << 20;
  // A round's decode steps whose sessions' states total at most this many
  // bytes run on the compute worker alone, without the OpenMP team. A team
  // halves a large batch's step in process, but every parallel region
  // leaves its threads spinning for the next one, and in a server those
  // cycles are the ones gRPC's threads and co-located clients need (with
  // the client on the same cores one thread served more decode steps/s at
  // 64 sessions: docs/benchmarks.md, "Measured figures behind constants in
  // the code"; bench/serving_profile.py shows the spinning as "OpenMP
  // waits"). 0 = always the team.
  uint64_t single_thread_step_bytes = uint64_t{64} << 20;
  ChunkwiseOptions chunkwise;
  // Where prefills' working copies are taken from (the session table's
  // budget); null = an unlimited one of the scheduler's own.
  std::shared_ptr<MemoryBudget> budget;
  // The compute worker (shared with the generation engine); null = one of
  // the scheduler's own.
  std::shared_ptr<ComputeExecutor> executor;
  // Where each round's changes are recorded before they are made (steps'
  // inputs, prefills' results); null = sessions live in memory only.
  DurableStore* store = nullptr;
  // Told of every round once it ran (on the compute worker; must not
  // block): the requests in it and its length. For metrics.
  std::function<void(size_t requests, double seconds)> on_round;
};

struct SchedulerStats {
  uint64_t rounds = 0;
  uint64_t steps = 0;
  uint64_t step_batches = 0;
  uint64_t largest_step_batch = 0;
  // Step batches run on the compute worker alone (their states within
  // single_thread_step_bytes); the others ran on the worker's team.
  uint64_t single_thread_step_batches = 0;
  uint64_t prefills = 0;
  uint64_t prefill_batches = 0;
  uint64_t prefill_tokens = 0;
  uint64_t prefill_workspace_bytes = 0;  // the chunkwise workspace held now
};

class Scheduler : private ComputeExecutor::Source {
 public:
  using Done = absl::AnyInvocable<void(absl::Status) &&>;
  using StateWork = absl::AnyInvocable<absl::Status(AttentionSession&) &&>;
  // One token of one session, as part of a step group.
  struct GroupStep {
    std::shared_ptr<AttentionSession> session;
    SequenceInput in;
    SequenceOutput out;
    // The session's position the token must follow: when set and the
    // session stands elsewhere, the step (the whole group) is refused with
    // FAILED_PRECONDITION, changing nothing.
    std::optional<uint64_t> expected_position;
  };

  explicit Scheduler(SchedulerOptions options = {});
  // Returns once the queued requests have run.
  ~Scheduler() override;

  // One decode token (in.tokens == 1); `expected_position` as in GroupStep.
  void Step(std::shared_ptr<AttentionSession> session, SequenceInput in,
            SequenceOutput out, Done done, CallLiveness caller = {},
            std::optional<uint64_t> expected_position = std::nullopt);
  // One decode token for each of several distinct sessions, all or none:
  // if any step is invalid (its status names steps[i]) no session changes.
  // The group keeps each session's order with its other requests. An empty
  // group, a missing session or one session twice is refused at once.
  void StepGroup(std::vector<GroupStep> steps, Done done,
                 CallLiveness caller = {});
  // `in.tokens` tokens through the chunkwise path, in slices of the round
  // budget; all of them or (on error, or a caller gone) none.
  void Prefill(std::shared_ptr<AttentionSession> session, SequenceInput in,
               SequenceOutput out, Done done, CallLiveness caller = {});
  // Any other work on the session's state, ordered with its steps.
  void Run(std::shared_ptr<AttentionSession> session, StateWork work, Done done,
           CallLiveness caller = {});

  // Runs what is queued, then refuses new requests with UNAVAILABLE.
  void Shutdown();
  SchedulerStats stats() const;
  // Requests queued and not started (a prefill with slices left counts as
  // started), and those of the round under way.
  struct Load {
    uint64_t waiting = 0;
    uint64_t running = 0;
  };
  Load load() const;

 private:
  enum class Kind { kStep, kPrefill, kWork, kStepGroup };
  struct Request {
    Kind kind;
    std::shared_ptr<AttentionSession> session;  // unset for kStepGroup
    SequenceInput in;
    SequenceOutput out;
    StateWork work;
    Done done;
    CallLiveness caller;
    std::vector<GroupStep> group;               // kStepGroup only
    std::optional<uint64_t> expected_position;  // kStep only
    // A prefill under way: tokens done so far, the working copy its slices
    // run on (committed after the last), and that copy's memory.
    uint64_t prefilled = 0;
    std::optional<AttentionState> copy;
    MemoryLease copy_lease;
    uint64_t slice = 0;  // tokens this round
  };
  // The tenant a request counts against in a round: its session's owner
  // (a step group's first session's).
  static std::string_view OwnerOf(const Request& r);
  // The sessions a request touches.
  static void ForEachSession(
      const Request& r, const absl::FunctionRef<void(AttentionSession&)>& f);
  void Enqueue(Request request);
  // One round, if any request is queued (ComputeExecutor::Source).
  bool RunOnce() override;
  // Runs the round (scheduler_round.cc); requests not finished in it
  // (prefills with slices left, or waiting for memory) are left in
  // `unfinished`, in round order. Its steps, in order:
  struct Round;
  void RunRound(std::vector<Request>& round, std::vector<Request>& unfinished);
  // Positions and the kernels' checks of every decode step; a request with
  // a refused step fails whole.
  void CheckRoundSteps(Round& round);
  // The request's steps do not run (it failed).
  static void RefuseSteps(Round& round, size_t request);
  // This round's slice of every prefill, on its working copy.
  void RunPrefillSlices(Round& round);
  // What passed is recorded (RoundCommit) before it is made.
  void CommitRound(Round& round);
  void RunRoundSteps(Round& round);
  // Finished prefills' copies become their sessions' states.
  void ApplyPrefills(Round& round);
  void RunWork(Round& round);
  void RecordRound(const Round& round);
  void AnswerRound(Round& round, std::vector<Request>& unfinished);
  // Gives a prefill its working copy and this round's slice (at most
  // `share` tokens); false if it must wait a round for memory. Sets *result
  // when it fails.
  bool StartPrefill(Request& r, uint64_t share, absl::Status* result);

  const SchedulerOptions options_;
  // std::mutex rather than absl::Mutex: Debian's Abseil is not built for
  // ThreadSanitizer, which then could not see these locks.
  mutable std::mutex mu_;
  // queue_ and unfinished_ emptied with no round running.
  std::condition_variable drained_cv_;
  std::deque<Request> queue_ ABSL_GUARDED_BY(mu_);
  // Requests a round left unfinished (prefills with slices left, or waiting
  // for memory), in round order: the next round takes them first.
  std::vector<Request> unfinished_ ABSL_GUARDED_BY(mu_);
  // A round is running: its requests are in neither queue_ nor unfinished_.
  bool round_running_ ABSL_GUARDED_BY(mu_) = false;
  size_t round_size_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  SchedulerStats stats_ ABSL_GUARDED_BY(mu_);
  const std::shared_ptr<MemoryBudget> budget_;
  ChunkwiseRunner runner_;           // worker only
  uint64_t prefills_under_way_ = 0;  // worker only: with a copy
  std::vector<Request> round_;       // worker only
  const std::shared_ptr<ComputeExecutor> executor_;
};

}  // namespace linattn

#endif  // LINATTN_CORE_SCHEDULER_SCHEDULER_H_
