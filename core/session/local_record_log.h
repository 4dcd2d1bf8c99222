// LocalRecordLog: a DurableStore's records and snapshots in a state
// directory (`--state-dir`; docs/design.md §4, "Durable sessions"):
//
//   DIR/lock                          held while the log is open
//                                     (state_dir_lock.h)
//   DIR/journal/journal-<seq>.log     the records, in segments (journal.h)
//   DIR/sessions/session-<id>.snap    each session's snapshot
//                                     (snapshot_files.h), covering its
//                                     records through the seq it names
//
// Every record gets the next seq; a commit is one write and, per
// durability, one fdatasync. A session's records before its snapshot file
// are not needed; a segment no live session (or pending file removal)
// needs is removed by Maintain, as is the snapshot file of a session whose
// delete is committed. A session whose first needed record lies before the
// previous segment keeps three or more segments alive: it is Pinned, due
// for a snapshot whatever its tail.
//
// Thread-safety: as RecordLog's.
#ifndef LINATTN_CORE_SESSION_LOCAL_RECORD_LOG_H_
#define LINATTN_CORE_SESSION_LOCAL_RECORD_LOG_H_

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "core/session/journal.h"
#include "core/session/record_log.h"
#include "core/session/snapshot_files.h"
#include "core/session/state_dir_lock.h"

namespace linattn {

struct LocalRecordLogOptions {
  std::string dir;
  Durability durability = Durability::kAlways;
  std::chrono::milliseconds sync_interval{100};  // Durability::kBatch
  uint64_t segment_bytes = uint64_t{64} << 20;
};

class LocalRecordLog final : public RecordLog {
 public:
  // Takes the directory's lock (FAILED_PRECONDITION naming the holder when
  // another server has it) and creates what is missing; reads nothing yet.
  static absl::StatusOr<std::unique_ptr<LocalRecordLog>> Open(
      const LocalRecordLogOptions& options);

  const char* label() const override { return "state dir"; }
  absl::Status Recover(Replayer& replayer, SessionManager& table,
                       DurableStore& store) override;
  absl::Status StartWriting(const std::map<std::string, RebuiltSession,
                                           std::less<>>& sessions) override;
  uint64_t next_incarnation() const override { return next_incarnation_; }
  CommitResult Commit(std::span<const StagedChange> staged,
                      std::span<const Record> records,
                      bool take_refusals) override;
  uint64_t CoveredPosition(const std::string& id,
                           uint64_t incarnation) const override;
  bool Pinned(const std::string& id, uint64_t incarnation) const override;
  absl::Status WriteSnapshots(std::span<const SnapshotToStore> taken,
                              std::vector<bool>& written) override;
  absl::Status Maintain() override;
  Stats stats() const override;
  uint64_t journal_disk_bytes() const override;
  uint64_t snapshot_disk_bytes() const override;
  uint64_t committed_position() const override;

 private:
  explicit LocalRecordLog(const LocalRecordLogOptions& options);

  // What the log knows of a live session: the first record its recovery
  // needs.
  struct Needs {
    uint64_t incarnation = 0;
    uint64_t first = 0;
  };
  struct PendingRemoval {
    std::string id;
    uint64_t incarnation = 0;
    uint64_t seq = 0;  // of its committed delete record
  };

  const LocalRecordLogOptions options_;
  StateDirLock lock_;  // released last
  const std::string journal_dir_;
  SnapshotFiles files_;
  JournalScan scan_;  // recovery's, until StartWriting repairs the journal
  uint64_t next_incarnation_ = 1;

  // Held across a commit's write and sync (the store's write lock already
  // orders commits; this guards the writer against Maintain).
  std::mutex write_mu_;
  std::unique_ptr<JournalWriter> writer_ ABSL_GUARDED_BY(write_mu_);

  mutable std::mutex mu_;  // a leaf
  uint64_t committed_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, Needs, std::less<>> needs_ ABSL_GUARDED_BY(mu_);
  std::vector<PendingRemoval> removals_ ABSL_GUARDED_BY(mu_);
  // The first sequence numbers of the last two journal segments.
  std::deque<uint64_t> segment_starts_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
  // Maintenance thread only: the incarnation whose file is on disk, by id.
  std::map<std::string, uint64_t, std::less<>> on_disk_;
};

}  // namespace linattn

#endif  // LINATTN_CORE_SESSION_LOCAL_RECORD_LOG_H_
