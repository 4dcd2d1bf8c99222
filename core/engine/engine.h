// Engine: everything a server computes and keeps, behind two APIs — one
// for attention sessions (AttentionSessions) and one for model sessions
// (GenerationEngine). It owns the one session table, the durable store, the
// one compute worker both schedulers run on, and the maintenance threads
// (idle eviction; the store's syncs, compaction snapshots and cleanup).
// Front ends (gRPC, HTTP) translate requests into calls on those two APIs
// and convert the status; they know nothing of the parts below.
//
//   EngineOptions options;
//   options.models = {model};
//   options.durable.dir = "/var/lib/linattn";  // memory only when empty
//   auto engine = Engine::Create(std::move(options));  // recovers first
//   auto info = (*engine)->attention().Create(spec, {}, "", Tenant());
//
// What the operator should hear of (evictions, a store out of reach,
// sessions taken over by another replica) goes to EngineEvents, which the
// server turns into log lines and metrics.
//
// Thread-safe. Destroying the engine drains it (Drain), then the
// schedulers, the table and the store go in that order.
#ifndef LINATTN_CORE_ENGINE_ENGINE_H_
#define LINATTN_CORE_ENGINE_ENGINE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/engine/attention_sessions.h"
#include "core/engine/engine_events.h"
#include "core/engine/maintenance.h"
#include "core/scheduler/compute_executor.h"
#include "core/scheduler/generation.h"
#include "core/scheduler/scheduler.h"
#include "core/session/durable_store.h"
#include "core/session/session_manager.h"

namespace linattn {

struct EngineOptions {
  // The one table of both kinds of session; its max_state_bytes is the one
  // memory budget (core/util/memory_budget.h) the schedulers' working
  // copies come from too.
  SessionManagerOptions sessions;
  SchedulerOptions scheduler;
  GenerationOptions generation;
  // The models GenerationEngine serves (distinct names).
  std::vector<std::shared_ptr<const Model>> models;
  // The operands of chunkwise prefill's products in both schedulers (and in
  // the store's replay of model sessions, so a rebuilt state is the one the
  // session had).
  PrefillPrecision prefill_precision = PrefillPrecision::kF32;
  // OpenMP threads of the compute worker's team (0 = OpenMP's default).
  int compute_threads = 0;
  // Durable sessions (docs/design.md §4): a directory, or another record
  // log (the shared store of replicas, server/replica/); neither = memory
  // only. Every recorded session is back in
  // the table before Create returns.
  DurableStoreOptions durable;
  // Sessions unused this long are deleted; 0 = kept until deleted.
  std::chrono::milliseconds idle_ttl{std::chrono::hours(1)};
  Maintenance::Periods periods;
  // Hears of what the operator should know; null = nobody. Outlives the
  // engine.
  EngineEvents* events = nullptr;
};

class Engine {
 public:
  // Opens the store, rebuilds every recorded session, and starts the
  // worker and the maintenance threads. The store's errors name their
  // file (DATA_LOSS for a damaged one, FAILED_PRECONDITION for a model
  // that is not loaded, or a state dir another server holds).
  static absl::StatusOr<std::unique_ptr<Engine>> Create(EngineOptions options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  AttentionSessions& attention() { return *attention_; }
  GenerationEngine& generation() { return *generation_; }

  // Ends every Generate under way with `status` (a drain's grace period
  // ended); the sessions keep what their clients received.
  void AbortGenerations(const absl::Status& status) {
    generation_->AbortGenerations(status);
  }
  // Stops the maintenance threads, writes every session's snapshot (so
  // the next start reads files, not the journal), gives up a replica's
  // lease, and lets the queued compute run out; new compute is refused.
  // Blocks until done; idempotent.
  void Drain();

  // What the metrics read.
  struct Readings {
    uint64_t attention_sessions = 0, model_sessions = 0, tenants = 0;
    uint64_t state_bytes = 0, state_budget_bytes = 0;
    uint64_t waiting = 0, running = 0;  // requests of both schedulers
    SchedulerStats attention;
    GenerationStats generation_stats;
    bool durable = false;
    DurableStore::Stats store;
  };
  Readings Read() const;

  // The parts, for tests and the shutdown summary.
  SessionManager& sessions() { return *table_; }
  Scheduler& scheduler() { return *scheduler_; }
  DurableStore* store() { return store_.get(); }  // null: memory only
  const RecoveryReport& recovery() const { return recovery_; }

 private:
  Engine() = default;

  // Declared in the order they are built; destroyed the other way.
  std::unique_ptr<DurableStore> store_;  // observes the table: outlives it
  RecoveryReport recovery_;
  std::shared_ptr<ComputeExecutor> executor_;
  std::unique_ptr<SessionManager> table_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<AttentionSessions> attention_;
  std::unique_ptr<GenerationEngine> generation_;
  std::unique_ptr<Maintenance> maintenance_;
  bool drained_ = false;
};

}  // namespace linattn

#endif  // LINATTN_CORE_ENGINE_ENGINE_H_
