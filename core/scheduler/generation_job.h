// GenerationJob: one request of a model session, from the moment it is
// queued behind the session's earlier requests until it is answered.
//
// Control requests (Fork, Snapshot, Delete) run when they reach the head
// of their session's queue, in one step. Compute requests (Append,
// Generate) move through explicit states:
//
//   kQueued → answered      cancelled, caller gone or no memory, before it
//                           started (nothing to take back)
//   kQueued → kFeeding      it starts: working copies leased, backup taken;
//                           its tokens (prompt, then each sampled token) go
//                           through iterations
//   kFeeding → answered     an Append's last token is in; or a failure
//                           (the backup goes back)
//   kFeeding → kFinalSent   a Generate's last token sampled and its final
//                           message sent
//   kFeeding → kFinalHeld   the same, paced, while the previous message is
//                           still on its way: the final one waits its turn
//   kFinalHeld → kFinalSent its turn came
//   kFinalSent → answered   unpaced at once; paced once delivered (a cancel
//                           meanwhile still takes back what was not)
//
// Atomicity lives here: a job that started keeps a backup of its
// session's context (state and pending token) and puts it back if it
// fails or its caller goes before it commits; the forward pass under it
// keeps no copies of its own.
#ifndef LINATTN_CORE_SCHEDULER_GENERATION_JOB_H_
#define LINATTN_CORE_SCHEDULER_GENERATION_JOB_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/model/model.h"
#include "core/model/sampler.h"
#include "core/scheduler/text_stream.h"
#include "core/session/tenant.h"
#include "core/util/call_liveness.h"
#include "core/util/memory_budget.h"

namespace linattn {

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
  // SamplingParams::top_logprobs most likely (id, logprob), highest first.
  std::vector<std::pair<int32_t, float>> top_logprobs;
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
//
// All or nothing (`atomic`): a caller that delivers the whole answer at the
// end (a non-streamed HTTP completion) gets no partial context: a cancel or
// failure after tokens were sampled puts the session back as it was before
// the request, prompt included.
class GenerateControl {
 public:
  explicit GenerateControl(bool paced = false, bool atomic = false)
      : paced_(paced), atomic_(atomic) {}
  bool paced() const { return paced_; }
  bool atomic() const { return atomic_; }
  bool cancelled() const { return cancelled_.load(); }
  uint64_t delivered() const { return delivered_.load(); }

 private:
  friend class GenerationEngine;
  const bool paced_;
  const bool atomic_;
  std::atomic<bool> cancelled_{false};
  std::atomic<uint64_t> delivered_{0};  // messages that carried a token
};

using Callbacks = std::vector<std::function<void()>>;

struct GenerationJob {
  using InfoCallback = std::function<void(absl::StatusOr<ModelSessionInfo>)>;
  using EventCallback = std::function<void(const GenerateEvent&)>;
  using SnapshotCallback = std::function<void(absl::StatusOr<std::string>)>;
  using DeleteCallback = std::function<void(absl::Status)>;

  enum class Kind { kAppend, kGenerate, kFork, kSnapshot, kDelete };
  enum class State { kQueued, kFeeding, kFinalHeld, kFinalSent };

  Kind kind = Kind::kAppend;
  State state = State::kQueued;
  uint64_t seq = 0;  // arrival order over all sessions
  CallLiveness caller;
  // Whose request it is: the session must be one it sees, and a fork
  // belongs to it (core/session/tenant.h).
  Tenant tenant;

  // The one callback of its kind.
  InfoCallback on_info;          // Append, Fork
  EventCallback on_event;        // Generate
  SnapshotCallback on_snapshot;  // Snapshot
  // Snapshot for the durable store: where the journal position the blob
  // covers is written when it is taken.
  std::shared_ptr<uint64_t> covered_seq;
  DeleteCallback on_delete;  // Delete

  // Ends the request with `status` before it completed: its callback, as
  // the request's kind answers (a Generate with a final event). Adds
  // nothing for a Generate whose final message already went out.
  void Fail(const absl::Status& status, Callbacks& callbacks) const;

  bool started() const { return state != State::kQueued; }
  bool finished_sampling() const {
    return state == State::kFinalHeld || state == State::kFinalSent;
  }

  // --- Request ---
  std::vector<int32_t> input;  // Append: tokens; Generate: prompt
  SamplingParams params;
  std::shared_ptr<GenerateControl> control;  // Generate: never null
  std::string new_id;                        // Fork

  // --- Working copies (Append, Generate) ---
  // Their memory, taken from the budget when the job starts.
  struct Lease {
    MemoryLease memory;
    std::atomic<uint64_t>* held = nullptr;      // jobs holding a lease
    std::atomic<uint64_t>* returned = nullptr;  // leases given back so far
    Lease() = default;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { Return(); }
    void Return() {
      if (held == nullptr) return;
      memory.Release();
      held->fetch_sub(1);
      returned->fetch_add(1);
      held = nullptr;
    }
  };
  Lease lease;
  // The engine's count of leases given back when this job last found no
  // memory: it waits until that count moves.
  uint64_t memory_wait = ~uint64_t{0};
  // The session's context when the job started (the one rollback).
  ModelState backup;
  std::optional<int32_t> backup_pending;

  // --- Feeding ---
  std::vector<int32_t> feed;  // tokens to feed, of which `fed` are in
  uint64_t fed = 0;
  uint32_t take = 0;                     // rows in the current iteration
  std::optional<int32_t> final_pending;  // Append: its last token
  // Its change (an Append's tokens, a generated token) is being recorded
  // by the durable store; the session's requests wait for that.
  bool awaiting_commit = false;
  std::vector<float> logits;  // Generate: of the last row fed

  // --- Sampling (Generate) ---
  std::unique_ptr<Sampler> sampler;
  // The token sampled from `logits` right after the step, outside the
  // engine's lock; Finish takes it.
  std::optional<absl::StatusOr<SampledToken>> sampled;
  std::unique_ptr<TextStream> text;
  uint64_t prompt_tokens = 0;
  // What joins the context with the first generated token: the prompt (or
  // the bos token it started from).
  std::vector<int32_t> joining;
  // The session's random stream when the job started (put back with the
  // backup), and the draws of params.seed's stream it started from.
  SamplerPosition backup_sampler;
  uint64_t first_draw = 0;
  uint64_t completion_tokens = 0;  // tokens sampled (and recorded)
  // Paced (GenerateControl): of the tokens sampled, `emitted` have gone to
  // the event callback and the control says how many of those were
  // delivered. At most one emitted token waits for delivery; the next one
  // may be computed meanwhile (so compute overlaps the write) and waits in
  // `waiting` until then. A token is fed only once at most one sampled
  // token is undelivered, so a cancel has at most the last two fed tokens
  // to take back out: `rollback` holds the state from before each of the
  // last two generated tokens was fed (slot j % 2 for token j).
  uint64_t emitted = 0;
  std::function<void()> waiting;  // the next event, held for its turn
  bool waiting_counts = true;     // it carries a token (waits for delivery)
  struct Rollback {
    ModelState state;  // before generated token `index` was fed
    int32_t token = -1;
    uint64_t index = 0;  // 0 = empty
  };
  Rollback rollback[2];
};

}  // namespace linattn

#endif  // LINATTN_CORE_SCHEDULER_GENERATION_JOB_H_
