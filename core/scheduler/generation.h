// GenerationEngine: queueing and continuous batching for model sessions.
//
// Sessions live in the session table (core/session), with every other
// session; the engine keeps, per session with requests, the queue of its
// requests (GenerationJob), and runs iterations on the compute worker
// (ComputeExecutor, shared with the attention Scheduler). In each, every
// session that is generating gets one row (its pending token) and all of
// them go through one batched forward (ForwardRunner: projections and MLP
// as GEMMs over the batch, attention as one StepBatch); prompts waiting for
// prefill fill the rest of the per-iteration token budget
// (iteration_planner.h), so running streams keep flowing while long prompts
// are consumed piece by piece.
//
// Requests of one session run in arrival order, one at a time. Input is
// validated when a request is submitted; a request that fails later (an
// internal error) puts its session back exactly as it was when the request
// started (generation_job.h). Callbacks run on the compute worker and must
// not block.
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
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/model/forward.h"
#include "core/model/model.h"
#include "core/model/sampler.h"
#include "core/scheduler/compute_executor.h"
#include "core/scheduler/generation_job.h"
#include "core/session/durable_store.h"
#include "core/session/round_commit.h"
#include "core/session/session_manager.h"
#include "core/util/call_liveness.h"

namespace linattn {

struct GenerationOptions {
  // Rows per iteration: decode rows first, then prompts (Append and
  // Generate alike) share what is left evenly, so a new short prompt is not
  // held behind a long one.
  uint32_t token_budget = 256;
  uint32_t max_batch = 128;  // generating sessions per iteration
  // The session table (a server's one, shared with the attention service);
  // null = a table of the engine's own, with max_sessions and
  // memory_budget_bytes (0 = no limit). Session state and the working
  // copies of requests under way (a backup of the state, and for a paced
  // Generate two more for cancelling) come from the table's memory budget.
  // A request whose copies do not fit waits for one under way to end, or,
  // with none under way, fails with RESOURCE_EXHAUSTED.
  SessionManager* sessions = nullptr;
  uint64_t max_sessions = 4096;
  uint64_t memory_budget_bytes = 0;
  // The compute worker (shared with the attention Scheduler); null = one of
  // the engine's own.
  std::shared_ptr<ComputeExecutor> executor;
  // Iterations of at most this many rows run on one OpenMP thread. A
  // single stream's step is a few hundred microseconds of small products;
  // on few cores, waking a second OpenMP thread two dozen times per token
  // costs more than it saves and takes the core gRPC needs to send the
  // token (measured through the server: docs/benchmarks.md, "Measured
  // figures behind constants in the code").
  uint32_t single_thread_rows = 2;
  ForwardOptions forward;
  // Where every change of a session's context is recorded before it is
  // acknowledged (an Append's tokens before its answer, each generated
  // token before its message); null = memory only.
  DurableStore* store = nullptr;
  // Told of every iteration once it ran (on the compute worker; must not
  // block): its rows and its length. For metrics.
  std::function<void(size_t rows, double seconds)> on_iteration;
};

// Work done since the engine started (for the shutdown summary and tests).
struct GenerationStats {
  uint64_t appends = 0;           // Append requests started
  uint64_t generates = 0;         // Generate requests started
  uint64_t prompt_tokens = 0;     // tokens they brought (appended, prompts)
  uint64_t generated_tokens = 0;  // tokens sampled
  uint64_t iterations = 0;        // batched forward passes
};

class GenerationEngine : private ComputeExecutor::Source {
 public:
  using InfoCallback = GenerationJob::InfoCallback;
  using EventCallback = GenerationJob::EventCallback;

  // Models must have distinct names.
  GenerationEngine(std::vector<std::shared_ptr<const Model>> models,
                   GenerationOptions options = {});
  // Leaves the compute worker; requests still queued end with UNAVAILABLE.
  ~GenerationEngine() override;
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
      const std::string& session_id, const Tenant& tenant = {}) const;

  // Every request names the tenant it comes from (core/session/tenant.h):
  // a session it may not see is NOT_FOUND, and what it creates (a session,
  // a fork, a restore) belongs to it. The default is the anonymous tenant
  // of a server without keys.

  // Empty `model` = the first model. Empty `session_id` = a random one.
  absl::StatusOr<ModelSessionInfo> CreateSession(const std::string& model,
                                                 const std::string& session_id,
                                                 const Tenant& tenant = {});
  absl::StatusOr<ModelSessionInfo> GetSession(const std::string& id,
                                              const Tenant& tenant = {}) const;
  std::vector<ModelSessionInfo> ListSessions(const Tenant& tenant = {}) const;

  // Requests but Generate take an optional CallLiveness: one whose caller
  // has gone before it commits is dropped and changes nothing
  // (docs/design.md, "Work ends with its call"). A Generate's caller going
  // is a cancel (Cancel, from its deliverer).

  // Adds tokens to the context (prefill).
  void Append(const std::string& id, std::vector<int32_t> tokens,
              InfoCallback done, CallLiveness caller = {},
              const Tenant& tenant = {});
  // Appends `prompt` (may be empty), then samples until max_tokens, a stop
  // string, or the model's eos token. Cancel(*control) may come at any
  // time: the context then keeps the prompt and the tokens whose messages
  // were delivered (none delivered: the session is as it was), and the last
  // event says "cancelled".
  void Generate(const std::string& id, std::vector<int32_t> prompt,
                SamplingParams params, EventCallback on_event,
                std::shared_ptr<GenerateControl> control = nullptr,
                const Tenant& tenant = {});
  // What a Generate's deliverer reports: the request is cancelled; one more
  // message with a token was delivered.
  void Cancel(GenerateControl& control);
  void Delivered(GenerateControl& control);
  // Ends every Generate, queued or running, with `status` (as a cancel, for
  // the context), and refuses new ones: a server at the end of its grace
  // period tells its clients why their streams end.
  void AbortGenerations(const absl::Status& status);
  // A new session with a copy of this one's context (after its queued
  // requests; right behind a Generate under way, at its next token
  // boundary, with what that Generate has delivered: HasSideRequest).
  void Fork(const std::string& id, const std::string& new_id, InfoCallback done,
            CallLiveness caller = {}, const Tenant& tenant = {});
  // The session as bytes (core/session/snapshot.h: model name and
  // fingerprint, pending token, states, random stream), ordered as Fork.
  void Snapshot(const std::string& id,
                std::function<void(absl::StatusOr<std::string>)> done,
                CallLiveness caller = {}, const Tenant& tenant = {});
  // Snapshot() for the durable store's compaction: `done` also gets the
  // journal position the blob covers (DurableStore::committed_seq() when it
  // was taken, on the worker).
  void SnapshotForStore(
      const std::string& id,
      std::function<void(absl::StatusOr<std::string>, uint64_t)> done);
  // A new session from Snapshot() bytes. FAILED_PRECONDITION when no loaded
  // model has the snapshot's name and fingerprint.
  absl::StatusOr<ModelSessionInfo> Restore(const std::string& bytes,
                                           const std::string& session_id,
                                           const Tenant& tenant = {});
  // Deletes the session after the requests queued before it; a Generate
  // among them is cancelled (its stream ends with "cancelled").
  void Delete(const std::string& id, std::function<void(absl::Status)> done,
              CallLiveness caller = {}, const Tenant& tenant = {});

  // The table the engine's sessions live in.
  SessionManager& sessions() const { return *sessions_; }

  // Iterations run so far and the rows they carried (for tests/metrics).
  uint64_t iterations() const { return iterations_.load(); }
  uint64_t max_rows_seen() const { return max_rows_seen_.load(); }
  GenerationStats stats() const;
  // Requests queued behind their sessions' heads or not yet started, and
  // those started (generating, prefilling).
  struct Load {
    uint64_t waiting = 0;
    uint64_t running = 0;
  };
  Load load() const;

 private:
  using Job = GenerationJob;
  // The requests of one session, oldest first; exists while it has any.
  struct Queue {
    std::shared_ptr<ModelSession> session;
    std::deque<std::unique_ptr<Job>> jobs;
  };
  struct Row {
    Queue* queue;
    Job* job;
  };
  // One iteration's rows, by model (each model is one batched forward).
  struct Batch {
    std::map<const Model*, std::vector<Row>> rows;
    uint32_t total = 0;
  };

  static ModelSessionInfo Describe(const ModelSession& s);
  void Enqueue(const std::string& id, std::unique_ptr<Job> job);
  // Removes the head request of `q` (answered), releasing its session and
  // giving back what it charged the session for positions not reached.
  void Pop(Queue& q);
  // One iteration, if any request can make progress (ComputeExecutor).
  bool RunOnce() override;
  // Under mu_: runs control requests at the heads of queues, starts compute
  // requests, and picks this iteration's rows.
  void Plan(Batch& batch, Callbacks& callbacks);
  // Under mu_: the head request of `q` reached (control requests run
  // here); returns the row it wants this iteration, if any, and whether the
  // queue's next request should be looked at now.
  bool Advance(Queue& q, std::vector<Row>& candidates, Callbacks& callbacks);
  // Under mu_: gives an Append or Generate its working copies and feed.
  // kWaitForMemory leaves it kQueued; kEnded means it was answered at once
  // (and popped).
  enum class StartResult { kWaitForMemory, kEnded, kStarted };
  StartResult Start(Queue& q, Job& job, Callbacks& callbacks);
  void Finish(Batch& batch, const absl::Status& status, Callbacks& callbacks);
  // Under mu_: emits one sampled token of a Generate.
  void OnToken(Queue& q, Job& job, const SampledToken& token,
               Callbacks& callbacks);
  // Under mu_: whether the head request of `q` has work the worker can do
  // now (a paced Generate waits for its last message to be delivered).
  bool Runnable(const Queue& q) const;
  // Under mu_: hands a Generate's next event to `callbacks`, or holds it
  // while the previous one is still being delivered (paced).
  // `counts`: the event carries a token, whose delivery the job then waits
  // for (a final event without one does not).
  void Emit(Job& job, std::function<void()> event, Callbacks& callbacks,
            bool counts = true);
  // Under mu_: ends the cancelled (or aborted) Generate at the head of `q`.
  void EndCancelled(Queue& q, Job& job, Callbacks& callbacks);
  // Of a started Generate's sampled tokens, those its caller has (what a
  // cancel now keeps): none when atomic; paced, the delivered ones; else
  // every one.
  static uint64_t KeptTokens(const Job& job);
  // Under mu_: the context of `q`'s session as its callers know it. With a
  // Generate under way at the head, what a cancel now would leave: the
  // prompt and the kept tokens, the last of them pending, and the random
  // stream after them (nothing kept yet: the context it started from).
  // Else the session's own.
  ModelContextRef Visible(const Queue& q) const;
  // Under mu_: a client's Fork or Snapshot waits right behind a Generate
  // under way. It does not wait for the Generate to end: it is answered at
  // the next token boundary from Visible(), so the fork (or a restore of
  // the snapshot) continues exactly as the original does from there.
  // (A snapshot for the durable store waits: its blob must cover every
  // record of the session, the undelivered tokens' too.)
  bool HasSideRequest(const Queue& q) const;
  void AnswerSideRequests(Queue& q, Callbacks& callbacks);
  // Under mu_: answers a Fork or a Snapshot from `context` (it leaves
  // `job` in the queue).
  void AnswerFork(Job& job, const ModelSession& s,
                  const ModelContextRef& context, Callbacks& callbacks);
  void AnswerSnapshot(Job& job, const ModelSession& s,
                      const ModelContextRef& context, Callbacks& callbacks);
  // Under mu_: puts the session back where `job` found it (and publishes
  // that); recorded too if the job had recorded generated tokens.
  void RestoreBackup(ModelSession& s, Job& job);

  // --- Durable store (options_.store) ---
  // A change waiting for its records to be committed: then one of the two
  // runs, under mu_.
  struct Awaiting {
    Queue* queue;
    Job* job;
    std::function<void(Callbacks&)> on_commit;
    std::function<void(const absl::Status&, Callbacks&)> on_failure;
    uint32_t request = 0;  // its records' request in the group
  };
  // Under mu_: `tokens` joined the context of `q`'s session through `job`.
  // Without a store on_commit runs at once; with one, after the commit.
  // `stream`: where the session's random stream stands after them (a
  // sampling Generate's tokens).
  void Record(Queue& q, Job& job, std::span<const int32_t> tokens,
              std::optional<SamplerPosition> stream,
              std::function<void(Callbacks&)> on_commit,
              std::function<void(const absl::Status&, Callbacks&)> on_failure,
              Callbacks& callbacks);
  // Under mu_: the session's context went back (a rollback): recorded whole.
  void RecordContext(ModelSession& s);
  // Under mu_: an Append's tokens are in; it answers once recorded.
  void CommitAppend(Queue& q, Job& job, Callbacks& callbacks);
  // Under mu_: the token just sampled could not be recorded: the Generate
  // ends with `status`, its context keeping what was recorded before.
  void EndUnrecorded(Queue& q, Job& job, const absl::Status& status,
                     Callbacks& callbacks);
  // Without mu_: commits what was recorded (and what the table staged),
  // then settles what waited for it.
  void CommitRecords(Callbacks& callbacks);

  const std::vector<std::shared_ptr<const Model>> models_;
  const GenerationOptions options_;
  // The engine's own table and worker, when none is shared.
  std::unique_ptr<SessionManager> own_sessions_;
  SessionManager* const sessions_;
  const std::shared_ptr<ComputeExecutor> executor_;
  std::map<const Model*, std::unique_ptr<ForwardRunner>> runners_;

  mutable std::mutex mu_;
  absl::Status abort_;  // set by AbortGenerations
  bool stopping_ = false;
  std::map<std::string, Queue, std::less<>> queues_;
  RoundCommit records_;             // under mu_
  std::vector<Awaiting> awaiting_;  // under mu_
  // Under mu_: sessions (id, incarnation) whose context RecordContext
  // recorded in records_.
  std::vector<std::pair<std::string, uint64_t>> rewound_;
  // Jobs holding working copies, and how many have given theirs back (a job
  // waiting for memory is runnable again once this moves).
  std::atomic<uint64_t> leased_jobs_{0};
  std::atomic<uint64_t> leases_returned_{0};
  std::atomic<uint64_t> next_seq_{0};
  std::atomic<uint64_t> iterations_{0};
  std::atomic<uint64_t> appends_{0}, generates_{0}, prompt_tokens_{0},
      generated_tokens_{0};
  std::atomic<uint64_t> max_rows_seen_{0};
};

}  // namespace linattn

#endif  // LINATTN_CORE_SCHEDULER_GENERATION_H_
