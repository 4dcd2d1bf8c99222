// RecordLog: where a DurableStore's records and snapshots are kept — one
// backend each. LocalRecordLog (core/session/local_record_log.h) keeps
// them in a state directory (a journal of segments and a snapshot file per
// session); server/replica's RedisRecordLog keeps each session's records
// and snapshot in Redis, which replicas share (its ownership side, leases
// and takeovers, is the log's Replica). The DurableStore above them stages
// the table's creates and deletes, numbers them (tickets), answers the
// requests that wait for them and decides when a session's records are
// folded into a snapshot; a log writes, reads back and cleans up.
//
// Calls come from the DurableStore: Commit under its write lock (one at a
// time), OnRemoved under the table's lock (a leaf: it must not block), the
// maintenance calls from its one maintenance thread, Recover once.
#ifndef LINATTN_CORE_SESSION_RECORD_LOG_H_
#define LINATTN_CORE_SESSION_RECORD_LOG_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/session/records.h"
#include "core/session/replayer.h"
#include "core/session/session_manager.h"

namespace linattn {

class DurableStore;

// A create or delete the session table staged, in the table's order.
struct StagedChange {
  uint64_t ticket = 0;
  bool create = false;
  std::string id;
  uint64_t incarnation = 0;
  std::shared_ptr<Session> session;  // creates: serialized when written
};

// A snapshot of a session ready to store: `blob` is SerializeSnapshot's or
// SerializeModelSnapshot's, taken when the log stood at `covered`
// (RecordLog::CoveredPosition).
struct SnapshotToStore {
  std::string id;
  uint64_t incarnation = 0;
  std::string owner;
  uint64_t covered = 0;
  std::string_view blob;
};

// A lease-holding replica's side of a shared log: which sessions it owns,
// and letting go of them (core/engine/maintenance.h drives it).
class Replica {
 public:
  virtual ~Replica() = default;
  // How often Beat() should run (a quarter of the lease).
  virtual std::chrono::milliseconds heartbeat_period() const = 0;
  // Renews the lease; after a gap longer than the lease (a pause, a store
  // out of reach), returns the sessions other replicas took over meanwhile
  // (id, incarnation), which HandOver(…, false) then lets go.
  virtual absl::StatusOr<std::vector<std::pair<std::string, uint64_t>>>
  Beat() = 0;
  // The sessions (id, incarnation) other replicas asked for, once there
  // are any, or none after about a second (one thread).
  virtual absl::StatusOr<std::vector<std::pair<std::string, uint64_t>>>
  AwaitWanted() = 0;
  // Takes the sessions out of the table without deleting them, and marks
  // them released in the store (if `release`) so their next owner takes
  // them at once.
  virtual absl::Status HandOver(
      std::span<const std::pair<std::string, uint64_t>> sessions,
      bool release) = 0;
  // Shutdown: gives up the lease (after the snapshots).
  virtual absl::Status DropLease() = 0;
};

class RecordLog {
 public:
  virtual ~RecordLog() = default;
  // "state dir" or "state store", for messages.
  virtual const char* label() const = 0;
  // The replica side of a shared log; null for a local one.
  virtual Replica* replica() { return nullptr; }

  // --- Start ---
  // Feeds `replayer` everything the log holds (snapshots, then records in
  // order; Replayer::Finish with the scan). A shared log reads nothing
  // here: it becomes `table`'s gate (sessions are loaded from it when first
  // asked for, through `store`).
  virtual absl::Status Recover(Replayer& replayer, SessionManager& table,
                               DurableStore& store) = 0;
  // The sessions recovery brought into the table; then the log opens for
  // writing (a local journal's torn tail is cut off first).
  virtual absl::Status StartWriting(
      const std::map<std::string, RebuiltSession, std::less<>>& /*sessions*/) {
    return absl::OkStatus();
  }
  // The first ticket (incarnation) the store may give after recovery.
  virtual uint64_t next_incarnation() const { return 1; }

  // --- Writing ---
  struct Written {
    std::string id;
    uint64_t incarnation = 0;
    uint64_t bytes = 0;    // its records' measure (JournalRecordBytes)
    bool create = false;   // its create was among them
    uint64_t records = 1;  // how many records (a shared op carries several)
  };
  struct CommitResult {
    // The write's. A local journal writes all or nothing; a shared store
    // may have written some batches (`written` lists what landed) before
    // one failed.
    absl::Status status;
    // Writes (or round trips) made: 0 when there was nothing to send.
    uint32_t writes = 0;
    // Requests left out whole: a session of theirs was handed over to
    // another replica (only when the caller takes refusals).
    std::vector<uint32_t> refused;
    // Creates refused alone (an id the shared store holds), by ticket.
    std::vector<std::pair<uint64_t, absl::Status>> refused_creates;
    // What was written, per record, in order.
    std::vector<Written> written;
    // Sessions (id, incarnation) to take out of the table: taken over by
    // another replica (their writes were fenced: `taken_over`), or carried
    // by a commit whose outcome is not known (the store, not this
    // replica's memory, then says what they hold).
    std::vector<std::pair<std::string, uint64_t>> leave;
    bool taken_over = false;
  };
  // `staged`, then `records`, as one commit. With `take_refusals` false a
  // request the log must refuse fails the whole commit (ABORTED).
  virtual CommitResult Commit(std::span<const StagedChange> staged,
                              std::span<const Record> records,
                              bool take_refusals) = 0;
  // Session (id, incarnation) left the table; `why` as the table says.
  virtual void OnRemoved(const std::string& /*id*/, uint64_t /*incarnation*/,
                         SessionObserver::Removal /*why*/) {}

  // --- Compaction (the maintenance thread) ---
  // The position a snapshot of the session taken now covers (read on the
  // compute worker, where nothing of the session is being committed).
  virtual uint64_t CoveredPosition(const std::string& id,
                                   uint64_t incarnation) const = 0;
  // Whether the session's records keep old parts of the log alive (it is
  // then due for a snapshot whatever its tail).
  virtual bool Pinned(const std::string& /*id*/,
                      uint64_t /*incarnation*/) const {
    return false;
  }
  // Stores the snapshots (one sync for all); written[i] says whether the
  // i-th was (a session taken over keeps its own).
  virtual absl::Status WriteSnapshots(std::span<const SnapshotToStore> taken,
                                      std::vector<bool>& written) = 0;
  // Removes what no session needs any more (files of deleted sessions, old
  // journal segments).
  virtual absl::Status Maintain() { return absl::OkStatus(); }

  // For the store's stats (0 where the log keeps no such thing).
  struct Stats {
    uint64_t files_removed = 0;
    uint64_t segments_removed = 0;
  };
  virtual Stats stats() const { return {}; }
  virtual uint64_t journal_disk_bytes() const { return 0; }
  virtual uint64_t snapshot_disk_bytes() const { return 0; }
  // The position of the last record committed (a local journal's seq).
  virtual uint64_t committed_position() const { return 0; }
};

}  // namespace linattn

#endif  // LINATTN_CORE_SESSION_RECORD_LOG_H_
