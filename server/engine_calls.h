// The generation engine's requests as blocking calls, for the HTTP
// listener's handler threads (each request holds one of its threads while
// it runs; gRPC uses the engine's callbacks directly).
#ifndef LINATTN_SERVER_ENGINE_CALLS_H_
#define LINATTN_SERVER_ENGINE_CALLS_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/scheduler/generation.h"

namespace linattn {

// Each on behalf of `tenant` (core/session/tenant.h).
absl::StatusOr<ModelSessionInfo> AppendAndWait(GenerationEngine& engine,
                                               const std::string& id,
                                               std::vector<int32_t> tokens,
                                               const Tenant& tenant);
absl::StatusOr<ModelSessionInfo> ForkAndWait(GenerationEngine& engine,
                                             const std::string& id,
                                             const std::string& new_id,
                                             const Tenant& tenant);
absl::StatusOr<std::string> SnapshotAndWait(GenerationEngine& engine,
                                            const std::string& id,
                                            const Tenant& tenant);
absl::Status DeleteAndWait(GenerationEngine& engine, const std::string& id,
                           const Tenant& tenant);

// Several Generate requests (the n choices of one completion) whose events
// one thread takes in arrival order. Paced (a stream to a client): a
// choice's next token is computed only once the previous one's event was
// taken and Delivered() said it reached the client, so at most two events
// per choice wait here whatever the client's speed, and a cancel leaves
// exactly the delivered tokens in the sessions. Unpaced: an event counts as
// delivered when it is queued. Destroying the mux cancels what still runs.
class GenerateMux {
 public:
  struct Event {
    int choice = 0;
    GenerateEvent event;
  };

  // Its generations run on behalf of `tenant`.
  GenerateMux(GenerationEngine* engine, bool paced, Tenant tenant);
  ~GenerateMux();
  GenerateMux(const GenerateMux&) = delete;
  GenerateMux& operator=(const GenerateMux&) = delete;

  // Starts choice `choice` (0, 1, … in order).
  void Start(const std::string& session_id, std::vector<int32_t> prompt,
             SamplingParams params);
  // The next event; false once every choice's final event was taken.
  bool Next(Event* out);
  // The event of `choice` last taken, carrying a token, reached the client.
  void Delivered(int choice);
  // Ends every choice still generating (their final events still come).
  void CancelAll();

 private:
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Event> events;
    int running = 0;  // choices whose final event was not taken
  };
  GenerationEngine* const engine_;
  const bool paced_;
  const Tenant tenant_;
  const std::shared_ptr<Shared> shared_ = std::make_shared<Shared>();
  std::vector<std::shared_ptr<GenerateControl>> controls_;
};

}  // namespace linattn

#endif  // LINATTN_SERVER_ENGINE_CALLS_H_
