// DurableStore: what makes sessions survive a crash or a restart
// (docs/design.md §4, "Durable sessions"). It listens to the session table
// (SessionObserver), writes every change of every session to the journal
// (journal.h) before the change is acknowledged, folds each session's
// records into a snapshot file (snapshot_files.h) once they outgrow its
// state, and rebuilds the table from both at start.
//
// Directory layout: DIR/journal/journal-<seq>.log and
// DIR/sessions/session-<id>.snap.
//
// Records (journal record type; every payload starts with the session's
// incarnation, u64, so that records of a deleted session are never applied
// to a later session of the same id):
//   1 create              attention session, zero state: SerializeSpec
//   2 create with state   attention session (a restore, a fork):
//                         SerializeSnapshot
//   3 state               an attention session's state is replaced (the
//                         result of a prefill): SerializeSnapshot
//   4 delete              deleted or evicted
//   5 step                one decode token: steps u32 (the number of steps
//                         of its request: 1, or a DecodeBatch's count on its
//                         first step and 0 on the others, which follow it),
//                         then q, k and v as float32 (heads × key_dim,
//                         heads × key_dim, heads × value_dim)
//   6 model create        model session, empty context: fingerprint u64,
//                         model name
//   7 model create with   model session (a restore, a fork):
//     state               SerializeModelSnapshot
//   8 model state         a model session's context is replaced (after a
//                         rollback): SerializeModelSnapshot
//   9 tokens              tokens that joined a model session's context, i32
//                         each (the pending token, if any, and all but the
//                         last are fed; the last becomes pending)
//  10 sampler             where a model session's random stream stands after
//                         a sampled token: seed u64, draws u64
// Records of a session that is not live (or is live as another incarnation)
// are skipped; only creates bring a session in.
//
// When each is written, so that replay reproduces what clients were told:
//   - creates (of any kind) and deletes are staged by the table's callbacks,
//     under its lock, so their order against every other record of the
//     session is the table's; a staged create is serialized when it is
//     committed (its session cannot change before: the compute worker
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
// Commit(group) writes everything staged, then the group, with one write
// and (Durability::kAlways) one fdatasync. A commit that fails keeps
// nothing of what it carried: the caller fails the group's requests, a
// create's request removes its session, and a delete is staged again (the
// session is already gone from memory; its deletion is retried with the
// next commit).
//
// Compaction: a session whose records since its last snapshot file exceed
// max(snapshot_tail_factor × its state bytes, min_snapshot_tail_bytes), or
// whose oldest needed record keeps more than two journal segments alive, is due
// (DueForSnapshot). Its owner serializes it on the compute worker, noting
// committed_seq() there, and hands the blob to WriteSnapshot; Maintain then
// removes the files of deleted sessions and the journal segments nothing
// needs. Disk use per session is then its state plus at most that tail
// (plus the journal segments shared by all), and recovery reads a file and
// replays at most that tail.
//
// Threads: Commit, SyncThrough and the observer callbacks are safe from any
// thread. DueForSnapshot, WriteSnapshot, Maintain and Tick are for one
// maintenance thread; Recover runs once, before anything else.
#ifndef LINATTN_CORE_SESSION_DURABLE_STORE_H_
#define LINATTN_CORE_SESSION_DURABLE_STORE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/attention/attention.h"
#include "core/model/forward.h"
#include "core/model/model.h"
#include "core/session/journal.h"
#include "core/session/session_manager.h"
#include "core/session/shared_store.h"
#include "core/session/snapshot_files.h"
#include "core/session/state_dir_lock.h"

namespace linattn {

enum class DurableRecord : uint8_t {
  kCreate = 1,
  kCreateWithState = 2,
  kState = 3,
  kDelete = 4,
  kStep = 5,
  kModelCreate = 6,
  kModelCreateWithState = 7,
  kModelState = 8,
  kTokens = 9,
  kSampler = 10,
  // The tenant a session belongs to (after its create, when not "").
  kOwner = 11,
};

struct DurableStoreOptions {
  // The local directory; or, with `shared`, none: records and snapshots go
  // to the shared store (Redis) instead, each session's on its own
  // (docs/design.md §4, "Replicas and the shared store").
  std::string dir;
  std::shared_ptr<SharedStore> shared;
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

struct RecoveryReport {
  uint64_t attention_sessions = 0;
  uint64_t model_sessions = 0;
  uint64_t snapshot_files = 0;
  uint64_t records = 0;   // journal records read
  uint64_t replayed = 0;  // records applied (the rest were covered by a
                          // snapshot file or were of deleted sessions)
  // A torn write dropped from the end of the journal (a crash mid-write).
  uint64_t dropped_tail_bytes = 0;
  std::string dropped_tail_file;
  uint64_t dropped_tail_offset = 0;
  double seconds = 0;
};

class DurableStore final : public SessionObserver, public SessionGate {
 public:
  // Creates the directories if missing; reads nothing yet.
  static absl::StatusOr<std::unique_ptr<DurableStore>> Open(
      DurableStoreOptions options);
  ~DurableStore() override;
  DurableStore(const DurableStore&) = delete;
  DurableStore& operator=(const DurableStore&) = delete;

  // Rebuilds every recorded session into `table` (whose observer this store
  // must be), from its snapshot file and the journal records after it, and
  // opens the journal for writing. `models`: the loaded models, for model
  // sessions (FAILED_PRECONDITION naming one whose model is not loaded). A
  // damaged file or a damaged record before the journal's end is
  // DATA_LOSS naming the file and offset; a torn write at the end is
  // dropped (and reported).
  absl::StatusOr<RecoveryReport> Recover(
      SessionManager& table,
      std::span<const std::shared_ptr<const Model>> models);

  // The records of one scheduler round or generation iteration.
  class Group {
   public:
    // One decode token of `session` (in.tokens == 1); `steps`: see the file
    // comment.
    void AddStep(const AttentionSession& session, const SequenceInput& in,
                 uint32_t steps);
    // `state` is what the session's state is about to become.
    void AddState(const AttentionSession& session, const AttentionState& state);
    void AddTokens(const ModelSession& session,
                   std::span<const int32_t> tokens);
    // The session's context as it is now.
    void AddModelState(const ModelSession& session);
    void AddSampler(const ModelSession& session,
                    const SamplerPosition& position);
    // The records added next belong to the next request (numbered from 0),
    // for Commit's `refused`.
    void BeginRequest() { ++request_; }
    // The number of the request BeginRequest opened last.
    uint32_t request() const { return request_; }
    bool empty() const { return records_.empty(); }
    size_t size() const { return records_.size(); }

   private:
    friend class DurableStore;
    struct Record {
      DurableRecord type;
      std::string id;
      uint64_t incarnation;
      std::string body;  // the incarnation, then the payload
      uint32_t request;
    };
    uint32_t request_ = UINT32_MAX;  // BeginRequest makes the first 0
    void Add(DurableRecord type, const Session& session, std::string payload);
    std::vector<Record> records_;
  };

  // Writes what is staged, then `group`, as one group commit. With a
  // shared store, the records of a session this replica handed over (to
  // the replica that owns it now) cannot be written: with `refused`, the
  // requests they belong to are left out whole and listed there, and the
  // rest commits; without it, nothing does (ABORTED).
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
  // from disk: the error says so, and the deletion goes with the next
  // commit.
  absl::Status Delete(SessionManager& table, absl::string_view id,
                      SessionKind kind, const Tenant& tenant = {});

  // SessionObserver.
  void OnCreated(const std::shared_ptr<Session>& session) override;
  void OnStepped(const Session&) override {}
  void OnRemoved(const Session& session, Removal why) override;

  // --- Maintenance (one thread) ---
  struct Due {
    std::string id;
    uint64_t incarnation = 0;
    SessionKind kind = SessionKind::kAttention;
    uint64_t state_bytes = 0;  // about the size of its snapshot
  };
  // Up to `max` sessions to snapshot, most overdue first. A session listed
  // is not listed again until WriteSnapshot or SnapshotAbandoned.
  std::vector<Due> DueForSnapshot(size_t max);
  // The session's context differs from what its records say (a rollback
  // whose record failed): it is due for a snapshot before any other.
  void SnapshotSoon(absl::string_view id, uint64_t incarnation);
  // Every live session (for a snapshot of all of them at shutdown).
  std::vector<Due> AllSessions();
  // The sequence number of the last committed record; read on the compute
  // worker when a session's blob is taken, it is the position the blob
  // covers.
  uint64_t committed_seq() const;
  // The position a blob of `session` taken now (on the compute worker)
  // covers: committed_seq(), or with a shared store the number of the
  // session's records committed.
  uint64_t CoveredPosition(const Session& session) const;
  // Writes the snapshot file of session (id, incarnation) taken at `seq`,
  // unless the session has gone meanwhile.
  absl::Status WriteSnapshot(const Due& session, uint64_t seq,
                             absl::string_view blob);
  // The same for several sessions, with one sync for all of them
  // (SnapshotFiles::WriteMany).
  struct Taken {
    Due due;
    uint64_t seq = 0;
    std::string blob;
  };
  absl::Status WriteSnapshots(std::span<const Taken> snapshots);
  // The snapshot of a due session could not be taken (it went, or its
  // request failed): it may be listed again.
  void SnapshotAbandoned(const Due& session);
  // Removes the files of deleted sessions whose deletion is committed, and
  // the journal segments no live session needs.
  absl::Status Maintain();
  // Syncs a Durability::kBatch journal whose interval has passed.
  absl::Status Tick();

  // --- With a shared store ---
  bool shared() const { return options_.shared != nullptr; }
  // "state store" or "state dir", for messages.
  const char* label() const { return shared() ? "state store" : "state dir"; }
  // SessionGate: a session another replica holds (or held) is taken over:
  // once its holder's lease lapsed or it handed the session over (it is
  // asked to), its snapshot and records are loaded and replayed, and it
  // joins the table under a new epoch. UNAVAILABLE if the holder keeps it
  // past twice the lease time.
  absl::Status Claim(absl::string_view id) override;
  // OK while this replica's lease is fresh; after a gap (a pause, a cut-off
  // store) the session's epoch is read first, and a session taken over
  // meanwhile leaves the table.
  absl::Status Confirm(const Session& session) override;
  // Renews this replica's lease; after a gap longer than the lease (a
  // pause, a store out of reach), returns the sessions other replicas took
  // over meanwhile, for HandOver(…, false).
  absl::StatusOr<std::vector<Due>> Beat();
  // The sessions other replicas asked for (to snapshot and then HandOver),
  // once there are any, or none after about a second (one thread).
  absl::StatusOr<std::vector<Due>> AwaitWanted();
  // Takes `sessions` out of the table without deleting them, and marks
  // them released in the store (if `release`) so their next owner takes
  // them at once.
  absl::Status HandOver(std::span<const Due> sessions, bool release);
  // Shutdown: gives up this replica's lease (after the snapshots).
  absl::Status DropLease();

  const DurableStoreOptions& options() const { return options_; }
  uint64_t journal_disk_bytes() const;
  uint64_t snapshot_disk_bytes() const;

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
  explicit DurableStore(DurableStoreOptions options);

  // A record staged by the table's callbacks.
  struct Staged {
    uint64_t ticket = 0;
    DurableRecord type = DurableRecord::kDelete;
    std::string id;
    uint64_t incarnation = 0;
    std::shared_ptr<Session> session;  // creates: serialized at commit
    uint64_t epoch = 0;  // deletes, shared store: the session's epoch
  };
  // What the store knows of a live session.
  struct Entry {
    uint64_t incarnation = 0;
    std::string owner;  // its tenant (core/session/tenant.h)
    SessionKind kind = SessionKind::kAttention;
    uint64_t state_bytes = 0;
    // The first journal record recovery needs (UINT64_MAX until the
    // session's create is committed).
    uint64_t first_needed = UINT64_MAX;
    uint64_t tail_bytes = 0;  // records since its snapshot file
    bool snapshot_requested = false;
    uint64_t tail_at_request = 0;  // tail_bytes when its snapshot was asked
    bool dirty = false;            // SnapshotSoon
    // Shared store: the session's epoch (0 until its create is committed)
    // and the number of its records the store holds.
    uint64_t epoch = 0;
    uint64_t appended = 0;
  };
  struct PendingRemoval {
    std::string id;
    uint64_t incarnation = 0;
    uint64_t seq = 0;  // of its committed delete record
  };
  struct FailedRange {
    uint64_t first = 0, last = 0;
    absl::Status status;
  };

  absl::Status CommitLocked(Group group,
                            std::vector<uint32_t>* refused = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // CommitLocked with a shared store: what was staged, then `group`.
  // (tickets [first, last] staged).
  absl::Status CommitSharedLocked(std::vector<Staged> staged, Group group,
                                  uint64_t first, uint64_t last,
                                  std::vector<uint32_t>* refused)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // Records the outcome of a commit of tickets [first, last]: failed, the
  // deletes it carried are staged again.
  void Resolve(uint64_t first, uint64_t last, const absl::Status& status,
               std::vector<Staged>& staged) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Sessions rebuilt from snapshots and records (recovery, a takeover)
  // join `table` through this: each under the incarnation `incarnation`
  // gives it.
  struct Sources {
    // Every snapshot, one at a time.
    std::function<absl::Status(
        const std::function<absl::Status(SnapshotFiles::Entry&)>&)>
        snapshots;
    // Every record in order, one at a time.
    std::function<absl::StatusOr<JournalScan>(
        const std::function<absl::Status(JournalRecord&)>&)>
        records;
  };
  struct RebuiltSession {
    uint64_t incarnation = 0;
    std::string owner;
    SessionKind kind = SessionKind::kAttention;
    uint64_t state_bytes = 0;
    uint64_t first_needed = 0;
    uint64_t tail_bytes = 0;
  };
  struct Rebuilt {
    JournalScan scan;
    uint64_t max_incarnation = 0;
    uint64_t max_file_seq = 0;
    std::map<std::string, RebuiltSession, std::less<>> sessions;
    // The incarnation of each snapshot read, by id.
    std::map<std::string, uint64_t, std::less<>> files;
  };
  absl::StatusOr<Rebuilt> Rebuild(
      SessionManager& table, const Sources& sources, RecoveryReport& report,
      const std::function<uint64_t(uint64_t recorded)>& incarnation);
  // A takeover of `id` (Claim), one at a time per id.
  absl::Status TakeOver(absl::string_view id);
  // The payload of a staged create, read from its session.
  static std::pair<DurableRecord, std::string> CreatePayload(
      const Session& session);

  const DurableStoreOptions options_;
  // The state dir's, held while the store is open (released last).
  StateDirLock lock_;
  const std::string journal_dir_;
  SnapshotFiles files_;

  // Held across a commit's write and sync: commits go to disk one at a
  // time, in order.
  std::mutex write_mu_;
  std::unique_ptr<JournalWriter> writer_ ABSL_GUARDED_BY(write_mu_);

  // A leaf lock (taken under the table's): staging and bookkeeping.
  mutable std::mutex mu_;
  bool recovering_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, uint64_t, std::less<>> recovered_incarnations_
      ABSL_GUARDED_BY(mu_);
  std::vector<Staged> staged_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t committed_ticket_ ABSL_GUARDED_BY(mu_) = 0;  // resolved through
  std::deque<FailedRange> failed_ ABSL_GUARDED_BY(mu_);
  uint64_t committed_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, Entry, std::less<>> entries_ ABSL_GUARDED_BY(mu_);
  std::vector<PendingRemoval> removals_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
  // The first sequence numbers of the last two journal segments.
  std::deque<uint64_t> segment_starts_ ABSL_GUARDED_BY(mu_);

  // Shared store.
  SessionManager* table_ = nullptr;                   // set by Recover
  std::vector<std::shared_ptr<const Model>> models_;  // set by Recover
  // The epoch of a session whose create committed after it left the table
  // (its delete is staged meanwhile), by id.
  std::map<std::string, std::pair<uint64_t, uint64_t>, std::less<>>
      orphan_epochs_ ABSL_GUARDED_BY(mu_);
  // Sessions handed over (id, incarnation), the latest kMaxHandedOver.
  std::set<std::pair<std::string, uint64_t>> handed_over_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<std::string, uint64_t>> handed_over_order_
      ABSL_GUARDED_BY(mu_);
  // The last heartbeat that reached the store.
  std::atomic<int64_t> lease_renewed_ns_{0};
  // Sessions being adopted by a takeover: their epoch and the number of
  // records the store holds, for their entry (made as they join the table).
  std::map<std::string, std::pair<uint64_t, uint64_t>, std::less<>> adopting_
      ABSL_GUARDED_BY(mu_);
  std::mutex claims_mu_;
  std::condition_variable claims_cv_;
  std::set<std::string, std::less<>> claiming_ ABSL_GUARDED_BY(claims_mu_);

  // Maintenance thread only: the incarnation whose file is on disk, by id.
  std::map<std::string, uint64_t, std::less<>> on_disk_;
};

}  // namespace linattn

#endif  // LINATTN_CORE_SESSION_DURABLE_STORE_H_
