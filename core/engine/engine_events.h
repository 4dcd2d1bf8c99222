// EngineEvents: what the engine tells its operator — per unit of work for
// metrics, and the changes an operator should hear of (evictions, a store
// out of reach and back, sessions taken over by or handed to another
// replica). The server implements it with its log and metrics
// (server/engine_log.h); core/ logs nothing itself.
//
// Calls come from the compute worker (rounds, iterations), committing
// threads (commits) and the maintenance threads; none may block or call
// back into the engine.
#ifndef LINATTN_CORE_ENGINE_ENGINE_EVENTS_H_
#define LINATTN_CORE_ENGINE_ENGINE_EVENTS_H_

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace linattn {

class EngineEvents {
 public:
  virtual ~EngineEvents() = default;

  // --- Per unit of work (metrics) ---
  // An attention scheduler round: its requests and its length.
  virtual void SchedulerRound(size_t /*requests*/, double /*seconds*/) {}
  // A generation iteration: its rows and its length.
  virtual void GenerationIteration(size_t /*rows*/, double /*seconds*/) {}
  // A durable commit (write and sync, or the shared store's round trip).
  virtual void DurableCommit(double /*seconds*/) {}

  // --- For the operator ---
  // Idle sessions deleted after `ttl` without use.
  virtual void Evicted(size_t /*attention*/, size_t /*model*/,
                       std::chrono::milliseconds /*ttl*/) {}
  // `what` (the store's upkeep, renewing the lease, listening for other
  // replicas' requests) failed; told once per run of failures, with
  // Recovered() when it works again.
  virtual void StoreFailing(absl::string_view /*what*/,
                            const absl::Status& /*status*/) {}
  virtual void StoreRecovered(absl::string_view /*what*/) {}
  // Sessions other replicas took over while this one's lease had lapsed
  // (found by a commit or a heartbeat); they leave this replica.
  virtual void TakenOver(size_t /*sessions*/) {}
  // Sessions handed to the replicas that asked for them: how many, the
  // snapshots written first, and how the release went.
  virtual void HandedOver(size_t /*sessions*/, size_t /*snapshots*/,
                          const absl::Status& /*released*/) {}
  // The drain's snapshots of every session.
  virtual void DrainSnapshots(size_t /*written*/, size_t /*sessions*/,
                              double /*seconds*/,
                              const absl::Status& /*status*/) {}
};

}  // namespace linattn

#endif  // LINATTN_CORE_ENGINE_ENGINE_EVENTS_H_
