// SharedRecordLog: a DurableStore's records and snapshots in the store
// replicas share (`--state-store`; docs/design.md §4, "Replicas and the
// shared store"), each session's on its own: its records in a list, its
// snapshot beside them (server/redis/shared_store.h has the keys). Every
// write names this replica's epoch of each session it touches and is
// refused whole if one was taken over meanwhile; such sessions leave this
// replica's table. A session's records there carry incarnation 0 (the
// store holds one incarnation of it) and replay on their own (a step's
// count is 1: the scheduler checks each request before it is recorded).
// Its Replica is a ReplicaGate (server/replica/replica_gate.h).
//
// Thread-safety: as RecordLog's.
#ifndef LINATTN_SERVER_REPLICA_SHARED_RECORD_LOG_H_
#define LINATTN_SERVER_REPLICA_SHARED_RECORD_LOG_H_

#include <memory>

#include "core/session/record_log.h"
#include "server/redis/shared_store.h"
#include "server/replica/ownership.h"
#include "server/replica/replica_gate.h"

namespace linattn {

class SharedRecordLog final : public RecordLog {
 public:
  explicit SharedRecordLog(std::unique_ptr<SharedStore> shared);

  const char* label() const override { return "state store"; }
  Replica* replica() override { return &gate_; }
  const SharedStore& shared() const { return *shared_; }

  // Reads nothing: becomes `table`'s gate.
  absl::Status Recover(Replayer& replayer, SessionManager& table,
                       DurableStore& store) override;
  CommitResult Commit(std::span<const StagedChange> staged,
                      std::span<const Record> records,
                      bool take_refusals) override;
  void OnRemoved(const std::string& id, uint64_t incarnation,
                 SessionObserver::Removal why) override;
  uint64_t CoveredPosition(const std::string& id,
                           uint64_t incarnation) const override;
  absl::Status WriteSnapshots(std::span<const SnapshotToStore> taken,
                              std::vector<bool>& written) override;

 private:
  // One session's part of a commit, and what it means here.
  struct Pending;
  // The ops of a commit, in batches: an id deleted and created again within
  // one commit needs the delete written first.
  std::vector<std::vector<Pending>> Plan(std::span<const StagedChange> staged,
                                         std::span<const Record> records,
                                         const std::set<uint32_t>& out,
                                         const Ownership::View& view) const;
  // Writes one batch; false when the commit stops (result.status says why).
  bool Write(std::vector<Pending>& batch, CommitResult& result);

  const std::unique_ptr<SharedStore> shared_;
  Ownership ownership_;
  ReplicaGate gate_;
};

}  // namespace linattn

#endif  // LINATTN_SERVER_REPLICA_SHARED_RECORD_LOG_H_
