#include "server/replica/replica_gate.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "core/session/records.h"
#include "core/util/status_macros.h"

namespace linattn {

namespace {

int64_t Now() {
  return std::chrono::steady_clock::now().time_since_epoch().count();
}

}  // namespace

void ReplicaGate::Attach(SessionManager* table, DurableStore* store) {
  table_ = table;
  store_ = store;
  lease_renewed_ns_ = Now();
}

bool ReplicaGate::LeaseFresh() const {
  const int64_t lease = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            shared_->options().lease)
                            .count();
  return Now() - lease_renewed_ns_.load() < lease;
}

absl::Status ReplicaGate::Claim(absl::string_view id) {
  if (table_ == nullptr || !IsValidSessionId(id)) {
    return absl::NotFoundError("no such session");
  }
  // One takeover per id at a time: a second request waits for the first
  // and then looks at the table again.
  {
    std::unique_lock<std::mutex> lock(claims_mu_);
    if (claiming_.count(id) != 0) {
      claims_cv_.wait(lock, [&] { return claiming_.count(id) == 0; });
      return absl::OkStatus();
    }
    claiming_.insert(std::string(id));
  }
  const absl::Status s = TakeOver(id);
  {
    std::lock_guard<std::mutex> lock(claims_mu_);
    claiming_.erase(claiming_.find(id));
  }
  claims_cv_.notify_all();
  return s;
}

absl::StatusOr<SharedStore::Acquired> ReplicaGate::Acquire(
    absl::string_view id) {
  const auto lease = shared_->options().lease;
  const auto deadline = std::chrono::steady_clock::now() + 2 * lease;
  for (;;) {
    auto acquired = shared_->Acquire(id);
    if (!acquired.ok()) {
      return absl::UnavailableError(
          absl::StrCat("session_id: '", id,
                       "' is not on this replica, and the state store could "
                       "not be asked for it: ",
                       acquired.status().message()));
    }
    if (acquired->outcome == SharedStore::Acquired::Outcome::kMissing) {
      return absl::NotFoundError("no such session");
    }
    if (acquired->outcome == SharedStore::Acquired::Outcome::kTaken) {
      return acquired;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::UnavailableError(absl::StrCat(
          "session_id: '", id, "' is served by replica '", acquired->holder,
          "', which did not hand it over within ", (2 * lease).count(),
          " ms; send the request to that replica, or again later"));
    }
    // Asked to hand it over (its next heartbeat hears of it), or its lease
    // runs out.
    std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(
        acquired->held_for, std::chrono::milliseconds(20)));
    if (table_->Contains(id)) {
      return absl::AlreadyExistsError("came meanwhile");
    }
  }
}

absl::Status ReplicaGate::TakeOver(absl::string_view id) {
  if (table_->Contains(id)) return absl::OkStatus();  // came meanwhile
  absl::StatusOr<SharedStore::Acquired> got = Acquire(id);
  if (absl::IsAlreadyExists(got.status())) return absl::OkStatus();
  if (!got.ok()) return got.status();
  // Its snapshot and records, replayed as recovery would, under a new
  // incarnation; written to (under the new epoch) from the moment it is in
  // the table.
  const std::string where = absl::StrCat(shared_->url(), " la:s:{", id, "}");
  const uint64_t incarnation = store_->NewIncarnation();
  const Ownership::Key key{std::string(id), incarnation};
  ownership_->Own(key, got->epoch, got->base + got->records.size());
  std::unique_ptr<Replayer> replayer = store_->NewReplayer(where);
  absl::Status s;
  if (!got->snapshot.empty()) {
    s = replayer->Snapshot(std::string(id), got->base, got->snapshot,
                           absl::StrCat(where, ":snap"));
  }
  for (size_t i = 0; s.ok() && i < got->records.size(); ++i) {
    JournalRecord rec;
    rec.seq = got->base + i + 1;
    rec.session_id = std::string(id);
    rec.file = absl::StrCat(where, ":log");
    rec.offset = i;
    if (got->records[i].empty()) {
      s = absl::DataLossError(
          absl::StrCat("state store: ", rec.file, " entry ", i, " is empty"));
      break;
    }
    rec.type = static_cast<uint8_t>(got->records[i][0]);
    rec.payload = got->records[i].substr(1);
    s = replayer->Apply(rec);
  }
  if (s.ok()) {
    JournalScan scan;
    replayer->Finish(scan);
    s = store_
            ->Adopt(*replayer, *table_,
                    [incarnation](uint64_t) { return incarnation; })
            .status();
  }
  if (!s.ok()) {
    // Let another replica have it.
    ownership_->Forget(key);
    const std::pair<std::string, uint64_t> mine{std::string(id), got->epoch};
    (void)shared_->Release(
        std::span<const std::pair<std::string, uint64_t>>(&mine, 1));
    return absl::Status(s.code(),
                        absl::StrCat("session_id: '", id,
                                     "': taking it over from the state store "
                                     "failed: ",
                                     s.message()));
  }
  return absl::OkStatus();
}

absl::Status ReplicaGate::Confirm(const Session& session) {
  if (LeaseFresh()) return absl::OkStatus();
  // This replica's lease may have lapsed: is the session still its own?
  const auto owned = ownership_->Find({session.id(), session.incarnation()});
  if (!owned.has_value()) return absl::OkStatus();  // not written yet
  const std::string id = session.id();
  auto epochs = shared_->Epochs(std::span<const std::string>(&id, 1));
  if (!epochs.ok()) return absl::OkStatus();  // its writes are fenced anyway
  if ((*epochs)[0] == owned->epoch) return absl::OkStatus();
  (void)table_->HandOver(id, session.incarnation());
  return absl::AbortedError("taken over");
}

absl::StatusOr<std::vector<std::pair<std::string, uint64_t>>>
ReplicaGate::Beat() {
  std::vector<std::pair<std::string, uint64_t>> lost;
  const int64_t sent = Now();
  const bool gap = !LeaseFresh();
  LINATTN_RETURN_IF_ERROR(shared_->Heartbeat());
  lease_renewed_ns_ = sent;
  if (!gap) return lost;
  // The lease lapsed: sessions taken over meanwhile are not ours.
  const std::vector<Ownership::Held> held = ownership_->All();
  if (held.empty()) return lost;
  std::vector<std::string> ids;
  ids.reserve(held.size());
  for (const Ownership::Held& h : held) ids.push_back(h.session.first);
  LINATTN_ASSIGN_OR_RETURN(std::vector<uint64_t> epochs, shared_->Epochs(ids));
  for (size_t i = 0; i < held.size(); ++i) {
    if (epochs[i] != held[i].epoch) lost.push_back(held[i].session);
  }
  return lost;
}

absl::StatusOr<std::vector<std::pair<std::string, uint64_t>>>
ReplicaGate::AwaitWanted() {
  LINATTN_ASSIGN_OR_RETURN(std::vector<std::string> ids, shared_->AwaitWants());
  return ownership_->Of(ids);
}

absl::Status ReplicaGate::HandOver(
    std::span<const std::pair<std::string, uint64_t>> sessions, bool release) {
  // Released are only the sessions this replica takes out of its table: a
  // session not (or no longer, or not yet) in it — deleted with its delete
  // still to be written, or joining from a takeover — stays this replica's,
  // and its asker asks again.
  std::vector<std::pair<std::string, uint64_t>> epochs;
  for (const auto& key : sessions) {
    const auto owned = ownership_->Find(key);
    if (!table_->HandOver(key.first, key.second)) continue;
    if (owned.has_value()) epochs.push_back({key.first, owned->epoch});
  }
  if (!release) return absl::OkStatus();
  return shared_->Release(epochs);
}

}  // namespace linattn
