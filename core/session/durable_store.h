// DurableStore: what makes sessions survive a crash or a restart
// (docs/design.md §4, "Durable sessions"). It listens to the session table
// (SessionObserver), has every change of every session written to its
// RecordLog (core/session/record_log.h: a state directory, or the store
// replicas share) before the change is acknowledged, folds each session's
// records into a snapshot once they outgrow its state, and rebuilds the
// table from what the log holds at start (core/session/replayer.h).
//
// The records (core/session/records.h), and when each is written, so that
// replay reproduces what clients were told:
//   - creates (of any kind) and deletes are staged by the table's
//     callbacks, under its lock, so their order against every other record
//     of the session is the table's; a staged create is serialized when it
//     is committed (its session cannot change before: the compute worker
//     commits before it changes a session), and the request that created
//     it waits for that commit (SyncThrough);
//   - attention steps are written ahead: a round's steps are checked, and
//     the records of those that passed are committed before the kernels
//     run (core/session/round_commit.h). A refused step that was recorded
//     all the same (older journals) is refused again on replay (same input,
//     same state), so the log needs no undo. Replay runs the recurrent
//     step, whose result per session does not depend on the batch it ran
//     in;
//   - a prefill records its result (a state record), committed before the
//     working copy it ran on replaces the session's state;
//   - a model session records the tokens that join its context (tokens), or
//     its whole context after a rollback (model state).
//
// Commit(group) writes everything staged, then the group, as one commit. A
// commit that fails keeps nothing of what it carried: the caller fails the
// group's requests, a create's request removes its session, and a delete
// is staged again (the session is already gone from memory; its deletion
// is retried with the next commit).
//
// Compaction: a session whose records since its last snapshot exceed
// max(snapshot_tail_factor × its state bytes, min_snapshot_tail_bytes), or
// whose records keep old parts of the log alive (RecordLog::Pinned), is due
// (DueForSnapshot). Its owner serializes it on the compute worker, noting
// CoveredPosition() there, and hands the blob to WriteSnapshots; Maintain
// then has the log remove what nothing needs. Disk use per session is then
// its state plus at most that tail, and recovery reads a snapshot and
// replays at most that tail.
//
// Threads: Commit, SyncThrough and the observer callbacks are safe from any
// thread. DueForSnapshot, WriteSnapshots, Maintain and Tick are for one
// maintenance thread; Recover runs once, before anything else.
#ifndef LINATTN_CORE_SESSION_DURABLE_STORE_H_
#define LINATTN_CORE_SESSION_DURABLE_STORE_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/model/forward.h"
#include "core/model/model.h"
#include "core/session/journal.h"
#include "core/session/record_log.h"
#include "core/session/records.h"
#include "core/session/replayer.h"
#include "core/session/session_manager.h"

namespace linattn {

struct DurableStoreOptions {
  // The local directory (a LocalRecordLog opened on it); or, with `log`,
  // none: records and snapshots go there instead (the shared store of
  // replicas, docs/design.md §4, "Replicas and the shared store").
  std::string dir;
  std::shared_ptr<RecordLog> log;
  Durability durability = Durability::kAlways;
  std::chrono::milliseconds sync_interval{100};  // Durability::kBatch
  uint64_t segment_bytes = uint64_t{64} << 20;
  // A session is due for a snapshot once its records since the last one
  // exceed max(snapshot_tail_factor × its state bytes,
  // min_snapshot_tail_bytes): its disk use stays below (1 + factor) × its
  // state (plus a journal segment shared by all), and the snapshots written
  // are 1/factor of the bytes logged.
  uint64_t snapshot_tail_factor = 4;
  uint64_t min_snapshot_tail_bytes = uint64_t{64} << 10;
  // Told, from the committing thread, how many sessions a commit found
  // taken over by another replica (they leave this replica's table); must
  // not block. For the operator's log.
  std::function<void(size_t sessions)> on_taken_over;
  // How model sessions' recorded tokens are run again at recovery and
  // takeover: the options their live forward ran with (the chunkwise
  // products' precision among them), so a rebuilt state is the one the
  // session had.
  ForwardOptions forward;
  // Told of every commit's length (write and, per durability, sync; or the
  // shared store's round trip), from the committing thread; must not
  // block. For metrics.
  std::function<void(double seconds)> on_commit;
};

class DurableStore final : public SessionObserver {
 public:
  // Opens the log (for a directory: takes its lock and creates what is
  // missing); reads nothing yet.
  static absl::StatusOr<std::unique_ptr<DurableStore>> Open(
      DurableStoreOptions options);
  ~DurableStore() override;
  DurableStore(const DurableStore&) = delete;
  DurableStore& operator=(const DurableStore&) = delete;

  // Rebuilds every recorded session into `table` (whose observer this store
  // must be) from what the log holds, and opens the log for writing.
  // `models`: the loaded models, for model sessions (FAILED_PRECONDITION
  // naming one whose model is not loaded). A damaged file or a damaged
  // record before the journal's end is DATA_LOSS naming the file and
  // offset; a torn write at the end is dropped (and reported).
  absl::StatusOr<RecoveryReport> Recover(
      SessionManager& table,
      std::span<const std::shared_ptr<const Model>> models);

  // The records of one scheduler round or generation iteration.
  using Group = RecordGroup;

  // Writes what is staged, then `group`, as one commit. A request whose
  // session the log must refuse (handed over to another replica): with
  // `refused`, left out whole and listed there while the rest commits;
  // without it, nothing commits (ABORTED).
  absl::Status Commit(Group group, std::vector<uint32_t>* refused = nullptr);
  // OK once every record staged with a ticket in [first, last] is
  // committed (committing what is staged if need be); the status of the
  // commit that failed otherwise. A session's create has the ticket
  // session.incarnation(); last_ticket() bounds the tickets staged so far.
  absl::Status SyncThrough(uint64_t first, uint64_t last);
  uint64_t last_ticket() const;
  // Whether the table staged records not yet committed.
  bool has_staged() const;

  // For the request that created `session` (in `table`): OK once its
  // create is committed; otherwise the session is taken out of the table
  // again and the commit's error returned, so the request fails having
  // changed nothing.
  absl::Status AwaitCreate(SessionManager& table, const Session& session);
  // Deletes session `id` of `kind` from `table` and waits for its delete
  // record. If that commit fails the session is gone from memory but not
  // from the log: the error says so, and the deletion goes with the next
  // commit.
  absl::Status Delete(SessionManager& table, absl::string_view id,
                      SessionKind kind, const Tenant& tenant = {});

  // SessionObserver.
  void OnCreated(const std::shared_ptr<Session>& session) override;
  // Keeps the session's state size (a hybrid's grows with its context),
  // against which its journal tail is weighed for a snapshot.
  void OnStepped(const Session& session) override;
  void OnRemoved(const Session& session, Removal why) override;

  // --- Sessions rebuilt from the log (recovery, a replica's takeover) ---
  // A fresh incarnation for a session about to join.
  uint64_t NewIncarnation();
  // A replayer of the loaded models (Recover's), reading `where`.
  std::unique_ptr<Replayer> NewReplayer(std::string where) const;
  // Adds the sessions `replayer` rebuilt to the table, each under
  // `incarnation_of` its recorded incarnation, as recorded sessions (no
  // create is staged for them).
  absl::StatusOr<std::map<std::string, RebuiltSession, std::less<>>> Adopt(
      Replayer& replayer, SessionManager& table,
      const std::function<uint64_t(uint64_t recorded)>& incarnation_of);

  // --- Maintenance (one thread) ---
  struct Due {
    std::string id;
    uint64_t incarnation = 0;
    SessionKind kind = SessionKind::kAttention;
    uint64_t state_bytes = 0;  // about the size of its snapshot
  };
  // Up to `max` sessions to snapshot, most overdue first. A session listed
  // is not listed again until WriteSnapshots or SnapshotAbandoned.
  std::vector<Due> DueForSnapshot(size_t max);
  // The session's context differs from what its records say (a rollback
  // whose record failed): it is due for a snapshot before any other.
  void SnapshotSoon(absl::string_view id, uint64_t incarnation);
  // Every recorded session (for a snapshot of all of them at shutdown).
  std::vector<Due> AllSessions();
  // The recorded sessions among (id, incarnation) pairs (a replica's
  // hand-over), listed as AllSessions lists them.
  std::vector<Due> DueOf(
      std::span<const std::pair<std::string, uint64_t>> sessions);
  // The position a blob of `session` taken now (on the compute worker)
  // covers (RecordLog::CoveredPosition).
  uint64_t CoveredPosition(const Session& session) const;
  // The snapshots taken of due sessions, written with one sync for all
  // (those of sessions gone meanwhile are dropped).
  struct Taken {
    Due due;
    uint64_t seq = 0;  // its CoveredPosition when taken
    std::string blob;
  };
  absl::Status WriteSnapshots(std::span<const Taken> snapshots);
  absl::Status WriteSnapshot(const Due& session, uint64_t seq,
                             absl::string_view blob);
  // The snapshot of a due session could not be taken (it went, or its
  // request failed): it may be listed again.
  void SnapshotAbandoned(const Due& session);
  // Has the log remove what nothing needs.
  absl::Status Maintain() { return log_->Maintain(); }
  // Syncs a Durability::kBatch journal whose interval has passed (an empty
  // commit).
  absl::Status Tick();

  // The log's replica side (a shared store), or null.
  Replica* replica() { return log_->replica(); }
  bool shared() const { return log_->replica() != nullptr; }
  // "state store" or "state dir", for messages.
  const char* label() const { return log_->label(); }

  const DurableStoreOptions& options() const { return options_; }
  uint64_t journal_disk_bytes() const { return log_->journal_disk_bytes(); }
  uint64_t snapshot_disk_bytes() const { return log_->snapshot_disk_bytes(); }
  // The local journal's last committed seq (what a snapshot taken now
  // covers; 0 for a shared store).
  uint64_t committed_seq() const { return log_->committed_position(); }

  struct Stats {
    uint64_t commits = 0;
    uint64_t records = 0;
    uint64_t bytes = 0;
    uint64_t failed_commits = 0;
    uint64_t snapshots_written = 0;
    uint64_t files_removed = 0;
    uint64_t segments_removed = 0;
  };
  Stats stats() const;

 private:
  DurableStore(DurableStoreOptions options, std::shared_ptr<RecordLog> log);

  // What the store knows of a live session.
  struct Entry {
    uint64_t incarnation = 0;
    std::string owner;  // its tenant (core/session/tenant.h)
    SessionKind kind = SessionKind::kAttention;
    uint64_t state_bytes = 0;
    bool recorded = false;    // its create is committed
    uint64_t tail_bytes = 0;  // records since its snapshot
    bool snapshot_requested = false;
    uint64_t tail_at_request = 0;  // tail_bytes when its snapshot was asked
    bool dirty = false;            // SnapshotSoon
  };
  struct FailedRange {
    uint64_t first = 0, last = 0;
    absl::Status status;
  };

  absl::Status CommitLocked(Group group, std::vector<uint32_t>* refused)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // Records the outcome of a commit of tickets [first, last]: failed, the
  // deletes it carried are staged again.
  void Resolve(uint64_t first, uint64_t last, const absl::Status& status,
               std::vector<StagedChange>& staged)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NoteFailed(uint64_t first, uint64_t last, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Due of a live entry.
  static Due DueOf(const std::string& id, const Entry& e) {
    return Due{id, e.incarnation, e.kind, e.state_bytes};
  }

  const DurableStoreOptions options_;
  const std::shared_ptr<RecordLog> log_;
  // Set by Recover.
  SessionManager* table_ = nullptr;
  std::vector<std::shared_ptr<const Model>> models_;

  // Held across a commit: commits reach the log one at a time, in order.
  std::mutex write_mu_;

  // A leaf lock (taken under the table's): staging and bookkeeping.
  mutable std::mutex mu_;
  bool recovering_ ABSL_GUARDED_BY(mu_) = false;
  // Sessions joining from the log, and the incarnation each joins as.
  std::map<std::string, uint64_t, std::less<>> joining_ ABSL_GUARDED_BY(mu_);
  std::vector<StagedChange> staged_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t committed_ticket_ ABSL_GUARDED_BY(mu_) = 0;  // resolved through
  std::deque<FailedRange> failed_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Entry, std::less<>> entries_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace linattn

#endif  // LINATTN_CORE_SESSION_DURABLE_STORE_H_
