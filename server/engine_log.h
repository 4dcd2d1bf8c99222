// EngineLog: what the engine tells its operator (core/engine/engine_events.h)
// as the server's log lines and metrics (server/observability.h).
#ifndef LINATTN_SERVER_ENGINE_LOG_H_
#define LINATTN_SERVER_ENGINE_LOG_H_

#include <string>

#include "core/engine/engine_events.h"
#include "server/observability.h"

namespace linattn {

class EngineLog final : public EngineEvents {
 public:
  // `observability` outlives this; `store_label` names the store in
  // messages ("state dir", "state store").
  EngineLog(Observability* observability, std::string store_label)
      : observability_(observability), store_label_(std::move(store_label)) {}

  void SchedulerRound(size_t requests, double seconds) override;
  void GenerationIteration(size_t rows, double seconds) override;
  void DurableCommit(double seconds) override;
  void Evicted(size_t attention, size_t model,
               std::chrono::milliseconds ttl) override;
  void StoreFailing(absl::string_view what,
                    const absl::Status& status) override;
  void StoreRecovered(absl::string_view what) override;
  void TakenOver(size_t sessions) override;
  void HandedOver(size_t sessions, size_t snapshots,
                  const absl::Status& released) override;
  void DrainSnapshots(size_t written, size_t sessions, double seconds,
                      const absl::Status& status) override;

 private:
  Observability* const observability_;
  const std::string store_label_;
};

}  // namespace linattn

#endif  // LINATTN_SERVER_ENGINE_LOG_H_
