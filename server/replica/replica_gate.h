// ReplicaGate: a replica's ownership of sessions in the shared store
// (docs/design.md §4, "Replicas and the shared store") — its lease, the
// claims that take sessions over, and the hand-over of sessions others ask
// for.
//   - As the table's SessionGate: a session not in the table is claimed
//     from the store (Claim): once its holder's lease lapsed or it handed
//     the session over (it is asked to), its snapshot and records are
//     replayed (core/session/replayer.h) and it joins the table under a
//     new epoch; UNAVAILABLE if the holder keeps it past twice the lease.
//     After a gap in this replica's heartbeats, a session in the table is
//     confirmed first (Confirm): one taken over meanwhile leaves.
//   - As the store's Replica (core/session/record_log.h): the heartbeat
//     that renews the lease and finds what was taken over during a gap,
//     the wants other replicas send, hand-over and, at shutdown, the end of
//     the lease. core/engine/maintenance.h runs them on its threads.
//
// Thread-safe. Attach before serving.
#ifndef LINATTN_SERVER_REPLICA_REPLICA_GATE_H_
#define LINATTN_SERVER_REPLICA_REPLICA_GATE_H_

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <set>
#include <string>

#include "core/session/durable_store.h"
#include "core/session/record_log.h"
#include "server/redis/shared_store.h"
#include "server/replica/ownership.h"

namespace linattn {

class ReplicaGate final : public SessionGate, public Replica {
 public:
  // Both outlive the gate.
  ReplicaGate(SharedStore* shared, Ownership* ownership)
      : shared_(shared), ownership_(ownership) {}

  // The table it gates and the store sessions are rebuilt through; the
  // lease counts as renewed now.
  void Attach(SessionManager* table, DurableStore* store);

  // SessionGate.
  absl::Status Claim(absl::string_view id) override;
  absl::Status Confirm(const Session& session) override;

  // Replica.
  std::chrono::milliseconds heartbeat_period() const override {
    return shared_->options().lease / 4;
  }
  absl::StatusOr<std::vector<std::pair<std::string, uint64_t>>> Beat() override;
  absl::StatusOr<std::vector<std::pair<std::string, uint64_t>>> AwaitWanted()
      override;
  absl::Status HandOver(
      std::span<const std::pair<std::string, uint64_t>> sessions,
      bool release) override;
  absl::Status DropLease() override { return shared_->DropLease(); }

 private:
  // A takeover of `id` (Claim), one at a time per id.
  absl::Status TakeOver(absl::string_view id);
  // Waits for the store to let this replica have `id`.
  absl::StatusOr<SharedStore::Acquired> Acquire(absl::string_view id);
  bool LeaseFresh() const;

  SharedStore* const shared_;
  Ownership* const ownership_;
  SessionManager* table_ = nullptr;
  DurableStore* store_ = nullptr;
  // The last heartbeat that reached the store.
  std::atomic<int64_t> lease_renewed_ns_{0};
  std::mutex claims_mu_;
  std::condition_variable claims_cv_;
  std::set<std::string, std::less<>> claiming_;  // guarded by claims_mu_
};

}  // namespace linattn

#endif  // LINATTN_SERVER_REPLICA_REPLICA_GATE_H_
