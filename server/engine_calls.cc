#include "server/engine_calls.h"

#include <future>

namespace linattn {

namespace {

template <typename T>
struct Waiter {
  std::promise<T> promise;
  std::future<T> future = promise.get_future();
};

}  // namespace

absl::StatusOr<ModelSessionInfo> AppendAndWait(GenerationEngine& engine,
                                               const std::string& id,
                                               std::vector<int32_t> tokens,
                                               const Tenant& tenant) {
  auto w = std::make_shared<Waiter<absl::StatusOr<ModelSessionInfo>>>();
  engine.Append(
      id, std::move(tokens),
      [w](absl::StatusOr<ModelSessionInfo> info) {
        w->promise.set_value(std::move(info));
      },
      CallLiveness(), tenant);
  return w->future.get();
}

absl::StatusOr<ModelSessionInfo> ForkAndWait(GenerationEngine& engine,
                                             const std::string& id,
                                             const std::string& new_id,
                                             const Tenant& tenant) {
  auto w = std::make_shared<Waiter<absl::StatusOr<ModelSessionInfo>>>();
  engine.Fork(
      id, new_id,
      [w](absl::StatusOr<ModelSessionInfo> info) {
        w->promise.set_value(std::move(info));
      },
      CallLiveness(), tenant);
  return w->future.get();
}

absl::StatusOr<std::string> SnapshotAndWait(GenerationEngine& engine,
                                            const std::string& id,
                                            const Tenant& tenant) {
  auto w = std::make_shared<Waiter<absl::StatusOr<std::string>>>();
  engine.Snapshot(
      id,
      [w](absl::StatusOr<std::string> bytes) {
        w->promise.set_value(std::move(bytes));
      },
      CallLiveness(), tenant);
  return w->future.get();
}

absl::Status DeleteAndWait(GenerationEngine& engine, const std::string& id,
                           const Tenant& tenant) {
  auto w = std::make_shared<Waiter<absl::Status>>();
  engine.Delete(
      id, [w](absl::Status s) { w->promise.set_value(std::move(s)); },
      CallLiveness(), tenant);
  return w->future.get();
}

GenerateMux::GenerateMux(GenerationEngine* engine, bool paced, Tenant tenant)
    : engine_(engine), paced_(paced), tenant_(std::move(tenant)) {}

GenerateMux::~GenerateMux() { CancelAll(); }

void GenerateMux::Start(const std::string& session_id,
                        std::vector<int32_t> prompt, SamplingParams params) {
  const int choice = static_cast<int>(controls_.size());
  // Not streamed: the answer goes out whole at the end, so a request that
  // fails leaves no part of itself in the session.
  controls_.push_back(
      std::make_shared<GenerateControl>(paced_, /*atomic=*/!paced_));
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->running++;
  }
  engine_->Generate(
      session_id, std::move(prompt), std::move(params),
      [shared = shared_, choice](const GenerateEvent& e) {
        {
          std::lock_guard<std::mutex> lock(shared->mu);
          shared->events.push_back({choice, e});
        }
        shared->cv.notify_all();
      },
      controls_.back(), tenant_);
}

bool GenerateMux::Next(Event* out) {
  std::unique_lock<std::mutex> lock(shared_->mu);
  shared_->cv.wait(
      lock, [&] { return !shared_->events.empty() || shared_->running == 0; });
  if (shared_->events.empty()) return false;
  *out = std::move(shared_->events.front());
  shared_->events.pop_front();
  if (out->event.finished) shared_->running--;
  return true;
}

void GenerateMux::Delivered(int choice) {
  if (paced_) engine_->Delivered(*controls_[choice]);
}

void GenerateMux::CancelAll() {
  for (const auto& control : controls_) engine_->Cancel(*control);
}

}  // namespace linattn
