// AttentionSessions: what a client can do with attention sessions (a spec
// and its S/z state, bring-your-own q/k/v), as GenerationEngine is for
// model sessions. The session table, the attention Scheduler and the
// durable store sit behind it: a request that creates or deletes a session
// answers once that is recorded, and compute goes through the Scheduler's
// rounds, whose group commit records it (docs/design.md §4, "Durable
// sessions"). Front ends (the gRPC service, tests) translate their
// messages into these calls and convert the status back; none of them
// touches the table, the scheduler or the store.
//
// Every call names the tenant it comes from (core/session/tenant.h): a
// session it may not see is NOT_FOUND, and what it creates belongs to it.
// Compute calls take the session a Find returned (its spec tells the
// caller the shapes of the tensors it must hand in), run on the compute
// worker in the session's order, and call `done` exactly once; buffers
// stay alive until then. A request whose caller has gone (CallLiveness)
// before it commits changes nothing.
//
// Thread-safe.
#ifndef LINATTN_CORE_ENGINE_ATTENTION_SESSIONS_H_
#define LINATTN_CORE_ENGINE_ATTENTION_SESSIONS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/scheduler/scheduler.h"
#include "core/session/durable_store.h"
#include "core/session/session_manager.h"
#include "core/util/call_liveness.h"

namespace linattn {

class AttentionSessions {
 public:
  using Done = Scheduler::Done;
  using InfoDone = absl::AnyInvocable<void(absl::StatusOr<SessionInfo>) &&>;
  using BlobDone = absl::AnyInvocable<void(absl::StatusOr<std::string>) &&>;
  using Reader = absl::AnyInvocable<void(const AttentionSession&) &&>;
  using StepGroup = std::vector<Scheduler::GroupStep>;

  // All three outlive this; `store` is null for sessions in memory only.
  AttentionSessions(SessionManager* table, Scheduler* scheduler,
                    DurableStore* store);

  // --- Answered at once ---
  // A new zero session (`id` empty: a generated one); `epsilon` unset =
  // the table's default.
  absl::StatusOr<SessionInfo> Create(const AttentionSpec& spec,
                                     std::optional<float> epsilon,
                                     absl::string_view id,
                                     const Tenant& tenant);
  // A new session holding a snapshot's state (core/session/snapshot.h).
  absl::StatusOr<SessionInfo> Restore(absl::string_view snapshot,
                                      absl::string_view id,
                                      const Tenant& tenant);
  absl::StatusOr<SessionInfo> Get(absl::string_view id,
                                  const Tenant& tenant) const;
  std::vector<SessionInfo> List(const Tenant& tenant) const;
  // Removes the session; with a store, answers once that is recorded (or
  // says that it is gone from memory but its deletion is not yet on disk).
  absl::Status Delete(absl::string_view id, const Tenant& tenant);
  // The session a compute call below is about.
  absl::StatusOr<std::shared_ptr<AttentionSession>> Find(
      absl::string_view id, const Tenant& tenant) const;

  // --- Compute, in the session's order ---
  // `in.tokens` tokens through the chunkwise path: all of them or none.
  void Prefill(std::shared_ptr<AttentionSession> session, SequenceInput in,
               SequenceOutput out, Done done, CallLiveness caller = {});
  // One decode token; with `expected_position`, refused (changing nothing)
  // unless the session stands there when the step runs.
  void Step(std::shared_ptr<AttentionSession> session, SequenceInput in,
            SequenceOutput out, Done done, CallLiveness caller = {},
            std::optional<uint64_t> expected_position = std::nullopt);
  // One token for each of several distinct sessions, all or none.
  void Step(StepGroup group, Done done, CallLiveness caller = {});
  // A new session with a copy of the state (O(state)), owned by `tenant`.
  void Fork(std::shared_ptr<AttentionSession> parent, std::string new_id,
            const Tenant& tenant, InfoDone done, CallLiveness caller = {});
  // The session's spec and state as bytes (core/session/snapshot.h).
  void Snapshot(std::shared_ptr<AttentionSession> session, BlobDone done,
                CallLiveness caller = {});
  // `read` sees the session's state on the worker, between its requests
  // (Inspect: S, z and position without a copy of them first).
  void Read(std::shared_ptr<AttentionSession> session, Reader read, Done done,
            CallLiveness caller = {});

  // For the durable store's compaction: the blob of session (id,
  // incarnation) and the journal position it covers, taken in its order.
  void SnapshotForStore(
      const DurableStore::Due& due,
      std::function<void(absl::StatusOr<std::string>, uint64_t)> done);

 private:
  // A new session's answer: recorded first (with a store), else taken out
  // of the table again and the error returned.
  absl::StatusOr<SessionInfo> Recorded(const AttentionSession& session);

  SessionManager* const table_;
  Scheduler* const scheduler_;
  DurableStore* const store_;
};

}  // namespace linattn

#endif  // LINATTN_CORE_ENGINE_ATTENTION_SESSIONS_H_
