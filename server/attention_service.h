// AttentionService (proto/linattn/v1/attention.proto) on gRPC's callback
// API. Handlers are thin: read the request's tensors against the session's
// spec (server/attention_tensors.h), call the engine's AttentionSessions
// (core/engine/attention_sessions.h), convert the status in one place
// (server/status.h). No handler blocks a callback thread on compute: unary
// calls finish from the engine's completion, and Decode (DecodeBatch) is a
// bidi reactor that writes each response when its step (group) is done
// (server/attention_streams.cc); Prefill with shared-memory tensors is in
// server/shared_memory_prefill.cc.
#ifndef LINATTN_SERVER_ATTENTION_SERVICE_H_
#define LINATTN_SERVER_ATTENTION_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "core/engine/attention_sessions.h"
#include "linattn/v1/attention.grpc.pb.h"
#include "server/rpc_entry.h"

namespace linattn {

// Shared-memory tensors (PrefillRequest.shared_memory; docs/design.md,
// "Shared-memory tensors"): off unless `enabled`, and then a Prefill's
// tensors there total at most `max_tensor_bytes`, as a message's would.
// The buffers such Prefills hold at once (inputs read out of the regions,
// outputs before they are written back) stay within `max_bytes_in_flight`
// (the transport's memory bound, which messages' tensors would count
// against); a call beyond it is refused with RESOURCE_EXHAUSTED.
struct SharedMemoryOptions {
  bool enabled = false;
  uint64_t max_tensor_bytes = 64 << 20;
  uint64_t max_bytes_in_flight = uint64_t{1} << 30;
};

class AttentionServiceImpl final
    : public EntryPoints<v1::AttentionService::CallbackService> {
 public:
  // Both outlive the service. Every method enters through `gate`
  // (server/rpc_entry.h).
  AttentionServiceImpl(
      AttentionSessions* sessions, const CallGate* gate,
      SharedMemoryOptions shared_memory = SharedMemoryOptions());

  grpc::ServerUnaryReactor* CreateSession(
      grpc::CallbackServerContext* ctx, const v1::CreateSessionRequest* request,
      v1::Session* response) override;
  grpc::ServerUnaryReactor* GetSession(grpc::CallbackServerContext* ctx,
                                       const v1::GetSessionRequest* request,
                                       v1::Session* response) override;
  grpc::ServerUnaryReactor* ListSessions(
      grpc::CallbackServerContext* ctx, const v1::ListSessionsRequest* request,
      v1::ListSessionsResponse* response) override;
  grpc::ServerUnaryReactor* DeleteSession(
      grpc::CallbackServerContext* ctx, const v1::DeleteSessionRequest* request,
      v1::DeleteSessionResponse* response) override;
  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* ctx,
                                    const v1::PrefillRequest* request,
                                    v1::PrefillResponse* response) override;
  grpc::ServerBidiReactor<Checked<v1::DecodeRequest>, v1::DecodeResponse>*
  OpenDecode(grpc::CallbackServerContext* ctx);
  grpc::ServerBidiReactor<Checked<v1::DecodeBatchRequest>,
                          v1::DecodeBatchResponse>*
  OpenDecodeBatch(grpc::CallbackServerContext* ctx);
  grpc::ServerUnaryReactor* Inspect(grpc::CallbackServerContext* ctx,
                                    const v1::InspectRequest* request,
                                    v1::InspectResponse* response) override;
  grpc::ServerUnaryReactor* Snapshot(grpc::CallbackServerContext* ctx,
                                     const v1::SnapshotRequest* request,
                                     v1::SnapshotResponse* response) override;
  grpc::ServerUnaryReactor* Restore(grpc::CallbackServerContext* ctx,
                                    const v1::RestoreRequest* request,
                                    v1::Session* response) override;
  grpc::ServerUnaryReactor* Fork(grpc::CallbackServerContext* ctx,
                                 const v1::ForkRequest* request,
                                 v1::Session* response) override;

  // Ends every open Decode and DecodeBatch stream with `status` (at once,
  // or when its running step is done). For the end of a drain.
  void AbortStreams(const absl::Status& status);

 private:
  class OpenStream;
  template <typename Request, typename Response>
  class StepStreamReactor;
  class DecodeReactor;
  class DecodeBatchReactor;

  // A Prefill's answer once the engine is done with it: availability and
  // position on success (and its latency observed), nothing on failure.
  static void FinishPrefill(const absl::Status& status,
                            const std::vector<uint8_t>& available,
                            const AttentionSession& session, Observability* o,
                            std::chrono::steady_clock::time_point start,
                            v1::PrefillResponse* response,
                            grpc::ServerUnaryReactor* reactor);
  grpc::ServerUnaryReactor* PrefillShared(
      grpc::CallbackServerContext* ctx, const v1::PrefillRequest* request,
      v1::PrefillResponse* response, std::shared_ptr<AttentionSession> session);

  AttentionSessions* const sessions_;
  const SharedMemoryOptions shared_memory_;
  // Bytes of shared-memory Prefills' buffers held now (≤ max_bytes_in_flight).
  std::shared_ptr<std::atomic<uint64_t>> shared_bytes_in_flight_ =
      std::make_shared<std::atomic<uint64_t>>(0);
  std::recursive_mutex streams_mu_;
  std::set<OpenStream*> streams_;  // guarded by streams_mu_
};

}  // namespace linattn

#endif  // LINATTN_SERVER_ATTENTION_SERVICE_H_
