#include "core/engine/attention_sessions.h"

#include <utility>

#include "core/session/snapshot.h"
#include "core/util/status_macros.h"

namespace linattn {

AttentionSessions::AttentionSessions(SessionManager* table,
                                     Scheduler* scheduler, DurableStore* store)
    : table_(table), scheduler_(scheduler), store_(store) {}

absl::StatusOr<SessionInfo> AttentionSessions::Recorded(
    const AttentionSession& session) {
  if (store_ != nullptr) {
    LINATTN_RETURN_IF_ERROR(store_->AwaitCreate(*table_, session));
  }
  return DescribeSession(session);
}

absl::StatusOr<SessionInfo> AttentionSessions::Create(
    const AttentionSpec& spec, std::optional<float> epsilon,
    absl::string_view id, const Tenant& tenant) {
  LINATTN_ASSIGN_OR_RETURN(auto session,
                           table_->CreateSession(spec, epsilon, id, tenant));
  return Recorded(*session);
}

absl::StatusOr<SessionInfo> AttentionSessions::Restore(
    absl::string_view snapshot, absl::string_view id, const Tenant& tenant) {
  LINATTN_ASSIGN_OR_RETURN(ParsedSnapshot parsed, ParseSnapshot(snapshot));
  LINATTN_ASSIGN_OR_RETURN(
      auto session, table_->AdoptSession(parsed.spec, std::move(parsed.state),
                                         id, "session_id", tenant));
  return Recorded(*session);
}

absl::StatusOr<SessionInfo> AttentionSessions::Get(absl::string_view id,
                                                   const Tenant& tenant) const {
  LINATTN_ASSIGN_OR_RETURN(auto session, table_->FindAttention(id, tenant));
  return DescribeSession(*session);
}

std::vector<SessionInfo> AttentionSessions::List(const Tenant& tenant) const {
  std::vector<SessionInfo> out;
  for (const auto& session : table_->List(SessionKind::kAttention, tenant)) {
    out.push_back(
        DescribeSession(static_cast<const AttentionSession&>(*session)));
  }
  return out;
}

absl::Status AttentionSessions::Delete(absl::string_view id,
                                       const Tenant& tenant) {
  if (store_ != nullptr) {
    return store_->Delete(*table_, id, SessionKind::kAttention, tenant);
  }
  return table_->Delete(id, SessionKind::kAttention, tenant);
}

absl::StatusOr<std::shared_ptr<AttentionSession>> AttentionSessions::Find(
    absl::string_view id, const Tenant& tenant) const {
  return table_->FindAttention(id, tenant);
}

void AttentionSessions::Prefill(std::shared_ptr<AttentionSession> session,
                                SequenceInput in, SequenceOutput out, Done done,
                                CallLiveness caller) {
  scheduler_->Prefill(std::move(session), in, out, std::move(done),
                      std::move(caller));
}

void AttentionSessions::Step(std::shared_ptr<AttentionSession> session,
                             SequenceInput in, SequenceOutput out, Done done,
                             CallLiveness caller,
                             std::optional<uint64_t> expected_position) {
  scheduler_->Step(std::move(session), in, out, std::move(done),
                   std::move(caller), expected_position);
}

void AttentionSessions::Step(StepGroup group, Done done, CallLiveness caller) {
  scheduler_->StepGroup(std::move(group), std::move(done), std::move(caller));
}

void AttentionSessions::Fork(std::shared_ptr<AttentionSession> parent,
                             std::string new_id, const Tenant& tenant,
                             InfoDone done, CallLiveness caller) {
  // The child is made on the worker, where the parent's state may be read;
  // its description waits there for the answer.
  auto child = std::make_shared<absl::StatusOr<SessionInfo>>(
      absl::UnknownError("not run"));
  scheduler_->Run(
      std::move(parent),
      [this, child, new_id = std::move(new_id),
       tenant](AttentionSession& from) -> absl::Status {
        // O(state): one copy of the block, then the two evolve on their
        // own.
        auto made = table_->ForkSession(from, new_id, "new_session_id", tenant);
        if (!made.ok()) return made.status();
        *child = Recorded(**made);
        return child->status();
      },
      [child, done = std::move(done)](absl::Status status) mutable {
        if (!status.ok()) return std::move(done)(status);
        std::move(done)(std::move(*child));
      },
      std::move(caller));
}

void AttentionSessions::Snapshot(std::shared_ptr<AttentionSession> session,
                                 BlobDone done, CallLiveness caller) {
  auto blob = std::make_shared<std::string>();
  scheduler_->Run(
      std::move(session),
      [blob](AttentionSession& s) {
        *blob = SerializeSnapshot(s.spec(), s.state());
        return absl::OkStatus();
      },
      [blob, done = std::move(done)](absl::Status status) mutable {
        if (!status.ok()) return std::move(done)(status);
        std::move(done)(std::move(*blob));
      },
      std::move(caller));
}

void AttentionSessions::Read(std::shared_ptr<AttentionSession> session,
                             Reader read, Done done, CallLiveness caller) {
  scheduler_->Run(
      std::move(session),
      [read = std::move(read)](AttentionSession& s) mutable {
        std::move(read)(s);
        return absl::OkStatus();
      },
      std::move(done), std::move(caller));
}

void AttentionSessions::SnapshotForStore(
    const DurableStore::Due& due,
    std::function<void(absl::StatusOr<std::string>, uint64_t)> done) {
  auto found = table_->FindAttention(due.id, Tenant::Server());
  if (!found.ok() || (*found)->incarnation() != due.incarnation) {
    return done(absl::NotFoundError("gone"), 0);
  }
  struct Taken {
    std::string blob;
    uint64_t covered = 0;
  };
  auto taken = std::make_shared<Taken>();
  DurableStore* const store = store_;
  scheduler_->Run(
      *std::move(found),
      [store, taken](AttentionSession& s) {
        taken->blob = SerializeSnapshot(s.spec(), s.state());
        taken->covered = store != nullptr ? store->CoveredPosition(s) : 0;
        return absl::OkStatus();
      },
      [taken, done = std::move(done)](absl::Status status) {
        if (!status.ok()) return done(status, 0);
        done(std::move(taken->blob), taken->covered);
      });
}

}  // namespace linattn
