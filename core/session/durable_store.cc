#include "core/session/durable_store.h"

#include <algorithm>
#include <filesystem>
#include <optional>

#include "absl/strings/str_cat.h"
#include "core/session/local_record_log.h"
#include "core/util/status_macros.h"

namespace linattn {
namespace {
constexpr size_t kMaxFailedRanges = 256;
}  // namespace

DurableStore::DurableStore(DurableStoreOptions options,
                           std::shared_ptr<RecordLog> log)
    : options_(std::move(options)), log_(std::move(log)) {}

DurableStore::~DurableStore() = default;

absl::StatusOr<std::unique_ptr<DurableStore>> DurableStore::Open(
    DurableStoreOptions options) {
  std::shared_ptr<RecordLog> log = options.log;
  if (log == nullptr) {
    LINATTN_ASSIGN_OR_RETURN(
        log, LocalRecordLog::Open({.dir = options.dir,
                                   .durability = options.durability,
                                   .sync_interval = options.sync_interval,
                                   .segment_bytes = options.segment_bytes}));
  }
  return std::unique_ptr<DurableStore>(
      new DurableStore(std::move(options), std::move(log)));
}

// --- The table's changes ----------------------------------------------------

void DurableStore::OnStepped(const Session& session) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(session.id());
  if (it != entries_.end() && it->second.incarnation == session.incarnation()) {
    it->second.state_bytes = session.state_bytes();
  }
}

void DurableStore::OnCreated(const std::shared_ptr<Session>& session) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry e;
  e.owner = session->owner();
  e.kind = session->kind();
  e.state_bytes = session->state_bytes();
  // A session rebuilt from the log (recovery, a takeover): recorded
  // already, and written to from the moment it is in the table.
  if (auto it = joining_.find(session->id()); it != joining_.end()) {
    session->set_incarnation(it->second);
    e.incarnation = it->second;
    e.recorded = true;
    entries_[session->id()] = std::move(e);
    return;
  }
  if (recovering_) return;
  const uint64_t ticket = next_ticket_++;
  session->set_incarnation(ticket);
  e.incarnation = ticket;
  entries_[session->id()] = std::move(e);
  staged_.push_back(StagedChange{ticket, true, session->id(), ticket, session});
}

void DurableStore::OnRemoved(const Session& session, Removal why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (recovering_) return;
  auto it = entries_.find(session.id());
  if (it != entries_.end() && it->second.incarnation == session.incarnation()) {
    entries_.erase(it);
  }
  log_->OnRemoved(session.id(), session.incarnation(), why);
  // Another replica serves it now: it is not deleted.
  if (why == Removal::kHandedOver) return;
  staged_.push_back(StagedChange{next_ticket_++, false, session.id(),
                                 session.incarnation(), nullptr});
}

uint64_t DurableStore::last_ticket() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_ticket_ - 1;
}

bool DurableStore::has_staged() const {
  std::lock_guard<std::mutex> lock(mu_);
  // Staged, or taken by a commit still under way (whose serialization of a
  // new session must finish before anyone changes that session).
  return committed_ticket_ < next_ticket_ - 1;
}

uint64_t DurableStore::NewIncarnation() {
  std::lock_guard<std::mutex> lock(mu_);
  return next_ticket_++;
}

std::unique_ptr<Replayer> DurableStore::NewReplayer(std::string where) const {
  return std::make_unique<Replayer>(models_, options_.forward,
                                    std::move(where));
}

// --- Commits ----------------------------------------------------------------

absl::Status DurableStore::Commit(Group group, std::vector<uint32_t>* refused) {
  std::lock_guard<std::mutex> lock(write_mu_);
  return CommitLocked(std::move(group), refused);
}

absl::Status DurableStore::Tick() {
  std::lock_guard<std::mutex> lock(write_mu_);
  return CommitLocked(Group(), nullptr);
}

absl::Status DurableStore::CommitLocked(Group group,
                                        std::vector<uint32_t>* refused) {
  if (table_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(label(), ": the store has not recovered yet"));
  }
  std::vector<StagedChange> staged;
  uint64_t first_ticket = 0, last_ticket = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    staged.swap(staged_);
    first_ticket = committed_ticket_ + 1;
    last_ticket = next_ticket_ - 1;
  }
  const std::vector<Record> records = group.Take();
  const auto started = std::chrono::steady_clock::now();
  RecordLog::CommitResult result =
      log_->Commit(staged, records, refused != nullptr);
  if (options_.on_commit && result.writes > 0) {
    options_.on_commit(std::chrono::duration<double>(
                           std::chrono::steady_clock::now() - started)
                           .count());
  }
  // Sessions another replica took over leave the table (not deleted): their
  // next request claims them from their owner.
  for (const auto& [id, incarnation] : result.leave) {
    (void)table_->HandOver(id, incarnation);
  }
  if (result.taken_over && !result.leave.empty() && options_.on_taken_over) {
    options_.on_taken_over(result.leave.size());
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [ticket, why] : result.refused_creates) {
    NoteFailed(ticket, ticket, why);
  }
  if (refused != nullptr) *refused = std::move(result.refused);
  Resolve(first_ticket, last_ticket, result.status, staged);
  if (result.status.ok() && result.writes > 0) ++stats_.commits;
  // What landed is accounted for, even when a later batch of a shared
  // commit failed.
  for (const RecordLog::Written& w : result.written) {
    stats_.records += w.records;
    stats_.bytes += w.bytes;
    auto it = entries_.find(w.id);
    if (it == entries_.end() || it->second.incarnation != w.incarnation) {
      continue;
    }
    it->second.recorded |= w.create;
    it->second.tail_bytes += w.bytes;
  }
  return result.status;
}

void DurableStore::NoteFailed(uint64_t first, uint64_t last,
                              const absl::Status& status) {
  failed_.push_back({first, last, status});
  if (failed_.size() > kMaxFailedRanges) failed_.pop_front();
}

void DurableStore::Resolve(uint64_t first, uint64_t last,
                           const absl::Status& status,
                           std::vector<StagedChange>& staged) {
  committed_ticket_ = std::max(committed_ticket_, last);
  if (status.ok()) return;
  if (first <= last) NoteFailed(first, last, status);
  ++stats_.failed_commits;
  // Deletes already happened in memory: they go with the next commit,
  // ahead of anything staged since.
  std::vector<StagedChange> again;
  for (StagedChange& s : staged) {
    if (!s.create) {
      s.ticket = next_ticket_++;
      again.push_back(std::move(s));
    }
  }
  staged_.insert(staged_.begin(), std::make_move_iterator(again.begin()),
                 std::make_move_iterator(again.end()));
}

absl::Status DurableStore::SyncThrough(uint64_t first, uint64_t last) {
  auto resolved = [&]() -> std::optional<absl::Status> {
    std::lock_guard<std::mutex> lock(mu_);
    if (committed_ticket_ < last) return std::nullopt;
    for (const FailedRange& f : failed_) {
      if (f.first <= last && first <= f.last) return f.status;
    }
    return absl::OkStatus();
  };
  if (auto s = resolved()) return *s;
  {
    std::lock_guard<std::mutex> lock(write_mu_);
    if (!resolved().has_value()) (void)CommitLocked(Group(), nullptr);
  }
  if (auto s = resolved()) return *s;
  return absl::InternalError(
      absl::StrCat(label(), ": a record was not committed"));
}

absl::Status DurableStore::AwaitCreate(SessionManager& table,
                                       const Session& session) {
  const absl::Status s =
      SyncThrough(session.incarnation(), session.incarnation());
  if (s.ok()) return s;
  std::shared_ptr<Session> found;
  if (session.kind() == SessionKind::kAttention) {
    auto a = table.FindAttention(session.id(), Tenant::Server());
    if (a.ok()) found = *a;
  } else {
    auto m = table.FindModel(session.id(), Tenant::Server());
    if (m.ok()) found = *m;
  }
  if (found != nullptr && found->incarnation() == session.incarnation()) {
    (void)table.Delete(session.id(), session.kind(), Tenant::Server());
  }
  // An id another replica's session holds: the request's own error.
  if (absl::IsAlreadyExists(s)) return s;
  return absl::Status(s.code(), absl::StrCat(label(),
                                             ": recording the new "
                                             "session failed: ",
                                             s.message()));
}

absl::Status DurableStore::Delete(SessionManager& table, absl::string_view id,
                                  SessionKind kind, const Tenant& tenant) {
  const uint64_t before = last_ticket();
  LINATTN_RETURN_IF_ERROR(table.Delete(id, kind, tenant));
  const absl::Status s = SyncThrough(before + 1, last_ticket());
  if (s.ok()) return s;
  return absl::Status(s.code(),
                      absl::StrCat(label(),
                                   ": the session is deleted, but recording "
                                   "its deletion failed (",
                                   s.message(),
                                   "); it is recorded with the next write that "
                                   "succeeds"));
}

// --- Recovery and takeovers -------------------------------------------------

absl::StatusOr<RecoveryReport> DurableStore::Recover(
    SessionManager& table,
    std::span<const std::shared_ptr<const Model>> models) {
  const auto start = std::chrono::steady_clock::now();
  table_ = &table;
  models_.assign(models.begin(), models.end());
  {
    std::lock_guard<std::mutex> lock(mu_);
    recovering_ = true;
  }
  Replayer replayer(
      models, options_.forward,
      options_.dir.empty()
          ? std::string(label())
          : (std::filesystem::path(options_.dir) / "journal").string());
  const absl::Status read = log_->Recover(replayer, table, *this);
  absl::StatusOr<std::map<std::string, RebuiltSession, std::less<>>> adopted =
      read.ok()
          ? Adopt(replayer, table, [](uint64_t recorded) { return recorded; })
          : read;
  {
    std::lock_guard<std::mutex> lock(mu_);
    recovering_ = false;
  }
  if (!adopted.ok()) return adopted.status();
  LINATTN_RETURN_IF_ERROR(log_->StartWriting(*adopted));
  {
    std::lock_guard<std::mutex> lock(mu_);
    next_ticket_ = std::max(next_ticket_, log_->next_incarnation());
    committed_ticket_ = next_ticket_ - 1;
  }
  RecoveryReport report = replayer.report();
  report.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return report;
}

absl::StatusOr<std::map<std::string, RebuiltSession, std::less<>>>
DurableStore::Adopt(
    Replayer& replayer, SessionManager& table,
    const std::function<uint64_t(uint64_t recorded)>& incarnation_of) {
  std::vector<std::string> joined;
  auto rebuilt = replayer.Adopt(
      table, incarnation_of, [&](const std::string& id, uint64_t incarnation) {
        std::lock_guard<std::mutex> lock(mu_);
        joining_[id] = incarnation;
        joined.push_back(id);
      });
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& id : joined) joining_.erase(id);
  if (!rebuilt.ok()) return rebuilt.status();
  for (const auto& [id, r] : *rebuilt) {
    auto it = entries_.find(id);
    if (it != entries_.end() && it->second.incarnation == r.incarnation) {
      it->second.tail_bytes += r.tail_bytes;
    }
  }
  return rebuilt;
}

// --- Compaction -------------------------------------------------------------

std::vector<DurableStore::Due> DurableStore::DueForSnapshot(size_t max) {
  std::lock_guard<std::mutex> lock(mu_);
  struct Candidate {
    bool pins;
    uint64_t excess;
    Due due;
  };
  std::vector<Candidate> candidates;
  for (auto& [id, e] : entries_) {
    if (e.snapshot_requested || !e.recorded) continue;
    const uint64_t limit =
        std::max(e.state_bytes * options_.snapshot_tail_factor,
                 options_.min_snapshot_tail_bytes);
    const bool pins = e.dirty || log_->Pinned(id, e.incarnation);
    if (!pins && e.tail_bytes <= limit) continue;
    candidates.push_back(
        {pins, e.tail_bytes > limit ? e.tail_bytes - limit : 0, DueOf(id, e)});
  }
  std::sort(candidates.begin(), candidates.end(),
            [](const Candidate& a, const Candidate& b) {
              if (a.pins != b.pins) return a.pins;
              return a.excess > b.excess;
            });
  std::vector<Due> out;
  for (size_t i = 0; i < candidates.size() && out.size() < max; ++i) {
    Entry& e = entries_[candidates[i].due.id];
    e.snapshot_requested = true;
    e.tail_at_request = e.tail_bytes;
    out.push_back(candidates[i].due);
  }
  return out;
}

std::vector<DurableStore::Due> DurableStore::AllSessions() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Due> out;
  out.reserve(entries_.size());
  for (auto& [id, e] : entries_) {
    if (!e.recorded) continue;
    e.snapshot_requested = true;
    e.tail_at_request = e.tail_bytes;
    out.push_back(DueOf(id, e));
  }
  return out;
}

std::vector<DurableStore::Due> DurableStore::DueOf(
    std::span<const std::pair<std::string, uint64_t>> sessions) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Due> out;
  for (const auto& [id, incarnation] : sessions) {
    auto it = entries_.find(id);
    if (it == entries_.end() || it->second.incarnation != incarnation ||
        !it->second.recorded) {
      continue;
    }
    // Unless a snapshot of it is under way already (whose tail stays).
    if (!it->second.snapshot_requested) {
      it->second.snapshot_requested = true;
      it->second.tail_at_request = it->second.tail_bytes;
    }
    out.push_back(DueOf(id, it->second));
  }
  return out;
}

void DurableStore::SnapshotSoon(absl::string_view id, uint64_t incarnation) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  if (it != entries_.end() && it->second.incarnation == incarnation) {
    it->second.dirty = true;
  }
}

void DurableStore::SnapshotAbandoned(const Due& due) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(due.id);
  if (it != entries_.end() && it->second.incarnation == due.incarnation) {
    it->second.snapshot_requested = false;
  }
}

uint64_t DurableStore::CoveredPosition(const Session& session) const {
  return log_->CoveredPosition(session.id(), session.incarnation());
}

absl::Status DurableStore::WriteSnapshot(const Due& due, uint64_t seq,
                                         absl::string_view blob) {
  const Taken taken{due, seq, std::string(blob)};
  return WriteSnapshots(std::span<const Taken>(&taken, 1));
}

absl::Status DurableStore::WriteSnapshots(std::span<const Taken> snapshots) {
  // Sessions gone meanwhile keep nothing.
  std::vector<SnapshotToStore> live;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Taken& t : snapshots) {
      auto it = entries_.find(t.due.id);
      if (it != entries_.end() && it->second.incarnation == t.due.incarnation &&
          it->second.recorded) {
        live.push_back(
            {t.due.id, t.due.incarnation, it->second.owner, t.seq, t.blob});
      }
    }
  }
  std::vector<bool> written;
  const absl::Status status =
      live.empty() ? absl::OkStatus() : log_->WriteSnapshots(live, written);
  std::lock_guard<std::mutex> lock(mu_);
  for (const Taken& t : snapshots) {
    auto it = entries_.find(t.due.id);
    if (it != entries_.end() && it->second.incarnation == t.due.incarnation) {
      it->second.snapshot_requested = false;
    }
  }
  for (size_t i = 0; status.ok() && i < live.size(); ++i) {
    if (!written[i]) continue;
    ++stats_.snapshots_written;
    auto it = entries_.find(live[i].id);
    if (it == entries_.end() || it->second.incarnation != live[i].incarnation) {
      continue;
    }
    Entry& e = it->second;
    e.tail_bytes -= std::min(e.tail_bytes, e.tail_at_request);
    e.dirty = false;
  }
  return status;
}

DurableStore::Stats DurableStore::stats() const {
  const RecordLog::Stats log = log_->stats();
  std::lock_guard<std::mutex> lock(mu_);
  Stats s = stats_;
  s.files_removed = log.files_removed;
  s.segments_removed = log.segments_removed;
  return s;
}

}  // namespace linattn
