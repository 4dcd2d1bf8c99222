// Maintenance: the engine's background threads.
//   - eviction: sessions unused for the idle TTL are deleted;
//   - the store's upkeep (with a durable store): a batch sync that fell
//     due, snapshots of sessions whose records outgrew their state (taken
//     on the compute worker, in each session's order, and written in
//     pieces), and the removal of what no session needs any more;
//   - with a shared store (replicas), the lease's heartbeat and the
//     hand-over of sessions other replicas ask for.
// Snapshots are taken through `take` (the engine's two APIs), which calls
// back with the blob and the journal position it covers.
//
// Thread-safe; Stop() joins the threads, after which FinalSnapshots()
// writes every session's snapshot (the drain).
#ifndef LINATTN_CORE_ENGINE_MAINTENANCE_H_
#define LINATTN_CORE_ENGINE_MAINTENANCE_H_

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "core/engine/engine_events.h"
#include "core/session/durable_store.h"
#include "core/session/session_manager.h"

namespace linattn {

class Maintenance {
 public:
  struct Periods {
    // How often the store's upkeep looks for sessions to snapshot (and,
    // for Durability::kBatch, syncs: then every durable sync interval).
    std::chrono::milliseconds upkeep{500};
  };
  // Takes the snapshot of one session; `done` gets the blob and the
  // position it covers (on any thread, once).
  using Take = std::function<void(
      const DurableStore::Due&,
      std::function<void(absl::StatusOr<std::string>, uint64_t)>)>;

  // `store` may be null (then only eviction runs); `ttl` 0 = no eviction.
  // All of them outlive this.
  Maintenance(SessionManager* table, DurableStore* store, Take take,
              std::chrono::milliseconds ttl, Periods periods,
              EngineEvents* events);
  ~Maintenance();  // Stop()
  Maintenance(const Maintenance&) = delete;
  Maintenance& operator=(const Maintenance&) = delete;

  // Joins the threads; idempotent.
  void Stop();
  // Every session's snapshot, then the store's cleanup and, with a shared
  // store, the end of this replica's lease (after Stop; for the drain).
  void FinalSnapshots();

  // Takes and writes the snapshots of `sessions`, in pieces of at most
  // 64 MiB of state (one sync each); returns how many were written.
  size_t Snapshot(std::span<const DurableStore::Due> sessions);

 private:
  // Waits `period` unless stopped meanwhile; false once stopped.
  bool Sleep(std::chrono::milliseconds period);
  void EvictionLoop(std::chrono::milliseconds ttl);
  void UpkeepLoop(std::chrono::milliseconds period);
  void HeartbeatLoop(Replica& replica, std::chrono::milliseconds period);
  void HandOverLoop(Replica& replica);
  size_t SnapshotPiece(std::span<const DurableStore::Due> piece);
  // Tells events of a failure once per run of them, and of the recovery.
  void Report(const char* what, const absl::Status& status, bool& failing);

  SessionManager* const table_;
  DurableStore* const store_;
  const Take take_;
  EngineEvents* const events_;
  std::mutex mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;  // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace linattn

#endif  // LINATTN_CORE_ENGINE_MAINTENANCE_H_
