#include "server/engine_log.h"

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace linattn {

void EngineLog::SchedulerRound(size_t requests, double seconds) {
  observability_->SchedulerRound(requests, seconds);
}

void EngineLog::GenerationIteration(size_t rows, double seconds) {
  observability_->GenerationIteration(rows, seconds);
}

void EngineLog::DurableCommit(double seconds) {
  observability_->DurableCommit(seconds);
}

void EngineLog::Evicted(size_t attention, size_t model,
                        std::chrono::milliseconds ttl) {
  observability_->Evicted("attention", attention);
  observability_->Evicted("model", model);
  if (attention + model == 0) return;
  spdlog::info(
      "evicted {} idle attention and {} idle model session(s) (idle ttl {} "
      "ms)",
      attention, model, ttl.count());
}

void EngineLog::StoreFailing(absl::string_view what,
                             const absl::Status& status) {
  const std::string message(status.message());
  if (what == "lease") {
    spdlog::warn("state store: renewing this replica's lease: {}", message);
  } else if (what == "wants") {
    spdlog::warn("state store: waiting for other replicas' requests: {}",
                 message);
  } else if (what == "snapshots") {
    spdlog::warn("{}: writing snapshots: {}", store_label_, message);
  } else {
    spdlog::warn("{}: {}", store_label_, message);
  }
}

void EngineLog::StoreRecovered(absl::string_view what) {
  if (what == "lease") spdlog::info("state store: reachable again");
}

void EngineLog::TakenOver(size_t sessions) {
  spdlog::warn(
      "state store: {} session(s) were taken over by other replicas while "
      "this one's lease had lapsed (their writes are refused); they leave "
      "this replica",
      sessions);
}

void EngineLog::HandedOver(size_t sessions, size_t snapshots,
                           const absl::Status& released) {
  spdlog::info(
      "state store: handed {} session(s) over to the replicas that asked ({} "
      "snapshot(s) written){}",
      sessions, snapshots,
      released.ok() ? "" : absl::StrCat("; releasing: ", released.message()));
}

void EngineLog::DrainSnapshots(size_t written, size_t sessions, double seconds,
                               const absl::Status& status) {
  if (!status.ok()) {
    spdlog::warn("{}: at shutdown: {}", store_label_,
                 std::string(status.message()));
  }
  spdlog::info("{}: wrote the snapshots of {} of {} session(s) in {:.3f} s",
               store_label_, written, sessions, seconds);
}

}  // namespace linattn
