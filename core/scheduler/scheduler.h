// Scheduler: the one place session state is computed on. Requests of many
// sessions queue here; a worker thread takes them in rounds and runs each
// round as batches:
//   - decode steps of all sessions in the round (single steps and step
//     groups alike) → one StepBatch call;
//   - prefills of all sessions in the round → one chunkwise Run (every
//     (session, head, chunk) one element of the same batched matmuls);
//   - other state work (inspect, snapshot, fork) → one call each.
// A round holds at most one request per session, taken in arrival order, so
// a session's requests run strictly in order and one at a time, while
// different sessions run together. Parallelism inside a round comes from the
// kernels' OpenMP threads (one pool: no oversubscription with oneDNN).
//
// Every request is validated on its own before it joins a batch, so one bad
// request fails alone and changes nothing; `done` is called exactly once, on
// the worker thread (or the caller's, if the scheduler has stopped).
//
// Thread-safe. Callers keep input and output buffers alive until `done`.
#ifndef LINATTN_CORE_SCHEDULER_SCHEDULER_H_
#define LINATTN_CORE_SCHEDULER_SCHEDULER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "core/attention/chunkwise.h"
#include "core/session/session_manager.h"

namespace linattn {

struct SchedulerOptions {
  uint32_t max_round = 1024;  // requests per round
  ChunkwiseOptions chunkwise;
};

struct SchedulerStats {
  uint64_t rounds = 0;
  uint64_t steps = 0;
  uint64_t step_batches = 0;
  uint64_t largest_step_batch = 0;
  uint64_t prefills = 0;
  uint64_t prefill_batches = 0;
  uint64_t prefill_tokens = 0;
};

class Scheduler {
 public:
  using Done = absl::AnyInvocable<void(absl::Status) &&>;
  using StateWork = absl::AnyInvocable<absl::Status(Session&) &&>;
  // One token of one session, as part of a step group.
  struct GroupStep {
    std::shared_ptr<Session> session;
    SequenceInput in;
    SequenceOutput out;
  };

  explicit Scheduler(SchedulerOptions options = {});
  // Stops the worker after the queued requests have run.
  ~Scheduler();

  // One decode token (in.tokens == 1).
  void Step(std::shared_ptr<Session> session, SequenceInput in,
            SequenceOutput out, Done done);
  // One decode token for each of several distinct sessions, all or none:
  // if any step is invalid (its status names steps[i]) no session changes.
  // The group keeps each session's order with its other requests. An empty
  // group, a missing session or one session twice is refused at once.
  void StepGroup(std::vector<GroupStep> steps, Done done);
  // `in.tokens` tokens through the chunkwise path.
  void Prefill(std::shared_ptr<Session> session, SequenceInput in,
               SequenceOutput out, Done done);
  // Any other work on the session's state, ordered with its steps.
  void Run(std::shared_ptr<Session> session, StateWork work, Done done);

  // Runs what is queued, then refuses new requests with UNAVAILABLE.
  void Shutdown();
  SchedulerStats stats() const;

 private:
  enum class Kind { kStep, kPrefill, kWork, kStepGroup };
  struct Request {
    Kind kind;
    std::shared_ptr<Session> session;  // unset for kStepGroup
    SequenceInput in;
    SequenceOutput out;
    StateWork work;
    Done done;
    std::vector<GroupStep> group;  // kStepGroup only
  };
  // The sessions a request touches.
  static void ForEachSession(const Request& r,
                             const absl::FunctionRef<void(Session&)>& f);
  void Enqueue(Request request);
  void WorkerLoop();
  void RunRound(std::vector<Request>& round);

  const SchedulerOptions options_;
  // std::mutex rather than absl::Mutex: Debian's Abseil is not built for
  // ThreadSanitizer, which then could not see these locks.
  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // queue_ gained work, or stopping_
  std::deque<Request> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  SchedulerStats stats_ ABSL_GUARDED_BY(mu_);
  ChunkwiseRunner runner_;  // worker thread only
  std::thread worker_;
};

}  // namespace linattn

#endif  // LINATTN_CORE_SCHEDULER_SCHEDULER_H_
