// GenerationEngine: model sessions and continuous batching.
//
// A model session is a model, its ModelState (S and z per layer and head)
// and at most one pending token: the last token of the context, which is in
// the context but not yet in the state. Feeding it is what produces the
// logits for the next token, so a session keeps no logits and nothing that
// grows with its context.
//
// One worker thread runs iterations. In each, every session that is
// generating gets one row (its pending token) and all of them go through one
// batched forward (ForwardRunner: projections and MLP as GEMMs over the
// batch, attention as one StepBatch); prompts waiting for prefill fill the
// rest of the per-iteration token budget, so running streams keep flowing
// while long prompts are consumed piece by piece.
//
// Requests of one session run in arrival order, one at a time. Input is
// validated when a request is submitted; a request that fails later (an
// internal error) puts its session back exactly as it was when the request
// started. Callbacks run on the worker thread and must not block.
#ifndef LINATTN_CORE_SCHEDULER_GENERATION_H_
#define LINATTN_CORE_SCHEDULER_GENERATION_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/model/forward.h"
#include "core/model/model.h"
#include "core/model/sampler.h"
#include "core/util/call_liveness.h"
#include "core/util/memory_budget.h"

namespace linattn {

struct GenerationOptions {
  // Rows per iteration: decode rows first, then prompts (Append and
  // Generate alike) share what is left evenly, so a new short prompt is not
  // held behind a long one.
  uint32_t token_budget = 256;
  uint32_t max_batch = 128;  // generating sessions per iteration
  uint64_t max_sessions = 4096;
  // Session state and the working copies of requests under way (a backup
  // of the state, and for a paced Generate two more for cancelling) come
  // from `budget` (shared with the attention service's table), else from a
  // budget of memory_budget_bytes of the engine's own (0 = no limit). A
  // request whose copies do not fit waits for one under way to end, or,
  // with none under way, fails with RESOURCE_EXHAUSTED.
  uint64_t memory_budget_bytes = 0;
  std::shared_ptr<MemoryBudget> budget;
  // Iterations of at most this many rows run on one OpenMP thread. A
  // single stream's step is a few hundred microseconds of small products;
  // on few cores, waking a second OpenMP thread two dozen times per token
  // costs more than it saves and takes the core gRPC needs to send the
  // token (measured through the server: 1 thread ~2.4× the tokens/s of 2).
  uint32_t single_thread_rows = 2;
  ForwardOptions forward;
};

// Work done since the engine started (for the shutdown summary and tests).
struct GenerationStats {
  uint64_t appends = 0;           // Append requests started
  uint64_t generates = 0;         // Generate requests started
  uint64_t prompt_tokens = 0;     // tokens they brought (appended, prompts)
  uint64_t generated_tokens = 0;  // tokens sampled
  uint64_t iterations = 0;        // batched forward passes
};

struct ModelSessionInfo {
  std::string session_id;
  std::string model;
  uint64_t position = 0;  // tokens in the context (state + pending)
  uint64_t state_bytes = 0;
};

// One message of a Generate stream: a token, or the end.
struct GenerateEvent {
  bool finished = false;
  int32_t token_id = -1;  // -1 on a final event that carries no token
  std::string text;       // complete UTF-8 (stop strings withheld)
  float logprob = 0.0f;   // when SamplingParams::logprobs
  std::string
      finish_reason;    // on the final event: length, stop, eos, cancelled
  absl::Status status;  // on the final event: OK or why it failed
  uint64_t prompt_tokens = 0;
  uint64_t completion_tokens = 0;
  uint64_t position = 0;  // session position after this event
};

// Shared by one Generate request and whoever delivers its messages (the
// gRPC stream). Thread-safe; the engine is told of changes through
// GenerationEngine::Cancel and ::Delivered.
//
// Paced delivery: a generated token joins the context only once its message
// has been delivered. At most one message is on its way at a time, and the
// engine computes at most one token beyond it meanwhile (so compute overlaps
// the write) and holds it until its turn. A cancel then leaves exactly the
// delivered tokens in the context, whatever the moment it arrives.
// Unpaced (in-process callers), a message counts as delivered when the
// event callback returns.
class GenerateControl {
 public:
  explicit GenerateControl(bool paced = false) : paced_(paced) {}
  bool paced() const { return paced_; }
  bool cancelled() const { return cancelled_.load(); }
  uint64_t delivered() const { return delivered_.load(); }

 private:
  friend class GenerationEngine;
  const bool paced_;
  std::atomic<bool> cancelled_{false};
  std::atomic<uint64_t> delivered_{0};  // messages that carried a token
};

class GenerationEngine {
 public:
  using InfoCallback = std::function<void(absl::StatusOr<ModelSessionInfo>)>;
  using EventCallback = std::function<void(const GenerateEvent&)>;

  // Models must have distinct names. Starts the worker thread.
  GenerationEngine(std::vector<std::shared_ptr<const Model>> models,
                   GenerationOptions options = {});
  // Stops the worker; requests still queued end with UNAVAILABLE.
  ~GenerationEngine();
  GenerationEngine(const GenerationEngine&) = delete;
  GenerationEngine& operator=(const GenerationEngine&) = delete;

  const std::vector<std::shared_ptr<const Model>>& models() const {
    return models_;
  }
  // NOT_FOUND naming `model` when there is no such model.
  absl::StatusOr<std::shared_ptr<const Model>> FindModel(
      const std::string& name) const;
  // The model a session runs (NOT_FOUND naming session_id).
  absl::StatusOr<std::shared_ptr<const Model>> ModelOf(
      const std::string& session_id) const;

  // Empty `model` = the first model. Empty `session_id` = a random one.
  absl::StatusOr<ModelSessionInfo> CreateSession(const std::string& model,
                                                 const std::string& session_id);
  absl::StatusOr<ModelSessionInfo> GetSession(const std::string& id) const;
  std::vector<ModelSessionInfo> ListSessions() const;

  // Requests but Generate take an optional CallLiveness: one whose caller
  // has gone before it commits is dropped and changes nothing
  // (docs/design.md, "Work ends with its call"). A Generate's caller going
  // is a cancel (Cancel, from its deliverer).

  // Adds tokens to the context (prefill).
  void Append(const std::string& id, std::vector<int32_t> tokens,
              InfoCallback done, CallLiveness caller = {});
  // Appends `prompt` (may be empty), then samples until max_tokens, a stop
  // string, or the model's eos token. Cancel(*control) may come at any
  // time: the context then keeps the prompt and the tokens whose messages
  // were delivered (none delivered: the session is as it was), and the last
  // event says "cancelled".
  void Generate(const std::string& id, std::vector<int32_t> prompt,
                SamplingParams params, EventCallback on_event,
                std::shared_ptr<GenerateControl> control = nullptr);
  // What a Generate's deliverer reports: the request is cancelled; one more
  // message with a token was delivered.
  void Cancel(GenerateControl& control);
  void Delivered(GenerateControl& control);
  // Ends every Generate, queued or running, with `status` (as a cancel, for
  // the context), and refuses new ones: a server at the end of its grace
  // period tells its clients why their streams end.
  void AbortGenerations(const absl::Status& status);
  // A new session with a copy of this one's context (after its queued
  // requests).
  void Fork(const std::string& id, const std::string& new_id, InfoCallback done,
            CallLiveness caller = {});
  // The session as bytes (LNATMSNP v1: model name and fingerprint, pending
  // token, states, CRC-32).
  void Snapshot(const std::string& id,
                std::function<void(absl::StatusOr<std::string>)> done,
                CallLiveness caller = {});
  // The size of Snapshot()'s bytes for a session of `model`.
  static uint64_t SnapshotBytes(const Model& model);
  // A new session from Snapshot() bytes. FAILED_PRECONDITION when no loaded
  // model has the snapshot's name and fingerprint.
  absl::StatusOr<ModelSessionInfo> Restore(const std::string& bytes,
                                           const std::string& session_id);
  // Deletes the session after the requests queued before it; a Generate
  // among them is cancelled (its stream ends with "cancelled").
  void Delete(const std::string& id, std::function<void(absl::Status)> done,
              CallLiveness caller = {});

  // Deletes every session that has no request queued or running and has
  // not been used for `ttl`; returns how many.
  size_t EvictIdle(std::chrono::milliseconds ttl);

  // Iterations run so far and the rows they carried (for tests/metrics).
  uint64_t iterations() const { return iterations_.load(); }
  uint64_t max_rows_seen() const { return max_rows_seen_.load(); }
  GenerationStats stats() const;

 private:
  struct Job;
  struct Session;
  struct Batch;

  absl::StatusOr<std::string> NewId(
      const std::string& requested,
      absl::string_view field = "session_id") const;
  // Under mu_: checks the session limit and takes the state's bytes from
  // the budget (given back by Remove).
  absl::Status Admit(const Model& model);
  void Remove(std::map<std::string, std::unique_ptr<Session>,
                       std::less<>>::iterator it);
  // Under mu_: takes the working copies of an Append or Generate becoming
  // active; false when it must wait for memory (*failed set when it must
  // fail instead).
  bool LeaseWorkingCopies(Session& s, Job& job, absl::Status* failed);
  ModelSessionInfo Describe(const Session& s) const;
  void Enqueue(const std::string& id, std::unique_ptr<Job> job,
               const std::function<void(absl::Status)>& fail);
  void WorkerLoop();
  // Under mu_: runs control requests at the heads of queues, activates
  // compute requests, and picks this iteration's rows.
  void Plan(Batch& batch, std::vector<std::function<void()>>& callbacks);
  void Finish(Batch& batch, const absl::Status& status,
              std::vector<std::function<void()>>& callbacks);
  // Under mu_: emits one sampled token of a Generate.
  void OnToken(Session& s, Job& job, const SampledToken& token,
               std::vector<std::function<void()>>& callbacks);
  // Under mu_: whether the head request of `s` has work the worker can do
  // now (a paced Generate waits for its last message to be delivered).
  bool Runnable(const Session& s) const;
  // Under mu_: hands a Generate's next event to `callbacks`, or holds it
  // while the previous one is still being delivered (paced).
  void Emit(Job& job, std::function<void()> event,
            std::vector<std::function<void()>>& callbacks);
  // Under mu_: ends the cancelled (or aborted) Generate at the head of `s`.
  void EndCancelled(Session& s, Job& job,
                    std::vector<std::function<void()>>& callbacks);

  const std::vector<std::shared_ptr<const Model>> models_;
  const GenerationOptions options_;
  std::map<const Model*, std::unique_ptr<ForwardRunner>> runners_;

  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  absl::Status abort_;  // set by AbortGenerations
  std::map<std::string, std::unique_ptr<Session>, std::less<>> sessions_;
  std::shared_ptr<MemoryBudget> budget_;
  // Jobs holding working copies, and how many have given theirs back (a job
  // waiting for memory is runnable again once this moves).
  std::atomic<uint64_t> leased_jobs_{0};
  std::atomic<uint64_t> leases_returned_{0};
  std::atomic<uint64_t> iterations_{0};
  std::atomic<uint64_t> appends_{0}, generates_{0}, prompt_tokens_{0},
      generated_tokens_{0};
  std::atomic<uint64_t> max_rows_seen_{0};
  std::thread worker_;
};

}  // namespace linattn

#endif  // LINATTN_CORE_SCHEDULER_GENERATION_H_
