#include "core/engine/engine.h"

#include <utility>

#include "core/util/status_macros.h"

namespace linattn {

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(EngineOptions options) {
  std::unique_ptr<Engine> engine(new Engine());
  EngineEvents* const events = options.events;
  options.generation.forward.chunkwise.precision = options.prefill_precision;
  options.scheduler.chunkwise.precision = options.prefill_precision;

  // The store first: it observes the table from the table's first session.
  DurableStoreOptions durable = std::move(options.durable);
  if (!durable.dir.empty() || durable.log != nullptr) {
    durable.forward = options.generation.forward;
    if (events != nullptr) {
      // A commit that finds sessions taken over (their writes fenced) sends
      // them away as the heartbeat would; either way the operator hears.
      durable.on_taken_over = [events](size_t n) { events->TakenOver(n); };
      durable.on_commit = [events](double s) { events->DurableCommit(s); };
    }
    LINATTN_ASSIGN_OR_RETURN(engine->store_,
                             DurableStore::Open(std::move(durable)));
    options.sessions.observer = engine->store_.get();
  }
  LINATTN_ASSIGN_OR_RETURN(engine->table_,
                           SessionManager::Create(options.sessions));
  // One compute worker (and one OpenMP team) for both schedulers.
  engine->executor_ =
      std::make_shared<ComputeExecutor>(options.compute_threads);

  SchedulerOptions scheduler = options.scheduler;
  scheduler.budget = engine->table_->shared_budget();
  scheduler.executor = engine->executor_;
  scheduler.store = engine->store_.get();
  if (events != nullptr) {
    scheduler.on_round = [events](size_t requests, double seconds) {
      events->SchedulerRound(requests, seconds);
    };
  }
  engine->scheduler_ = std::make_unique<Scheduler>(std::move(scheduler));
  engine->attention_ = std::make_unique<AttentionSessions>(
      engine->table_.get(), engine->scheduler_.get(), engine->store_.get());

  if (engine->store_ != nullptr) {
    // Every recorded session is back before anything is served.
    LINATTN_ASSIGN_OR_RETURN(
        engine->recovery_,
        engine->store_->Recover(*engine->table_, options.models));
  }
  GenerationOptions generation = options.generation;
  generation.sessions = engine->table_.get();
  generation.store = engine->store_.get();
  generation.executor = engine->executor_;
  if (events != nullptr) {
    generation.on_iteration = [events](size_t rows, double seconds) {
      events->GenerationIteration(rows, seconds);
    };
  }
  engine->generation_ = std::make_unique<GenerationEngine>(
      std::move(options.models), std::move(generation));

  Engine* const e = engine.get();
  engine->maintenance_ = std::make_unique<Maintenance>(
      engine->table_.get(), engine->store_.get(),
      [e](const DurableStore::Due& due,
          std::function<void(absl::StatusOr<std::string>, uint64_t)> done) {
        if (due.kind == SessionKind::kModel) {
          e->generation_->SnapshotForStore(due.id, std::move(done));
        } else {
          e->attention_->SnapshotForStore(due, std::move(done));
        }
      },
      options.idle_ttl, options.periods, events);
  return engine;
}

void Engine::Drain() {
  if (drained_) return;
  drained_ = true;
  maintenance_->Stop();
  // Every session into its snapshot, so that the next start reads them
  // instead of replaying the journal.
  maintenance_->FinalSnapshots();
  scheduler_->Shutdown();
}

Engine::~Engine() {
  if (maintenance_ != nullptr && scheduler_ != nullptr) Drain();
}

Engine::Readings Engine::Read() const {
  Readings r;
  const SessionManager& table = *table_;
  r.attention_sessions =
      table.List(SessionKind::kAttention, Tenant::Server()).size();
  r.model_sessions = table.List(SessionKind::kModel, Tenant::Server()).size();
  r.tenants = table.tenant_count();
  r.state_bytes = table.state_bytes_in_use();
  r.state_budget_bytes = table.budget().limit();
  const Scheduler::Load attention = scheduler_->load();
  const GenerationEngine::Load generation = generation_->load();
  r.waiting = attention.waiting + generation.waiting;
  r.running = attention.running + generation.running;
  r.attention = scheduler_->stats();
  r.generation_stats = generation_->stats();
  if (store_ != nullptr) {
    r.durable = true;
    r.store = store_->stats();
  }
  return r;
}

}  // namespace linattn
