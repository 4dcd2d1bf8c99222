// AttentionService (proto/linattn/v1/attention.proto) on gRPC's callback
// API. Handlers are thin: check request shapes against the session's spec,
// hand compute to the Scheduler, convert the status in one place
// (server/status.h). No handler blocks a callback thread on compute: unary
// calls finish from the scheduler's completion, and Decode (DecodeBatch) is
// a bidi reactor that writes each response when its step (group) is done.
#ifndef LINATTN_SERVER_ATTENTION_SERVICE_H_
#define LINATTN_SERVER_ATTENTION_SERVICE_H_

#include "core/scheduler/scheduler.h"
#include "core/session/session_manager.h"
#include "linattn/v1/attention.grpc.pb.h"

namespace linattn {

class AttentionServiceImpl final
    : public v1::AttentionService::CallbackService {
 public:
  // Both outlive the service.
  AttentionServiceImpl(SessionManager* sessions, Scheduler* scheduler)
      : sessions_(sessions), scheduler_(scheduler) {}

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
  grpc::ServerBidiReactor<v1::DecodeRequest, v1::DecodeResponse>* Decode(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerBidiReactor<v1::DecodeBatchRequest, v1::DecodeBatchResponse>*
  DecodeBatch(grpc::CallbackServerContext* ctx) override;
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

 private:
  class DecodeReactor;
  class DecodeBatchReactor;

  SessionManager* const sessions_;
  Scheduler* const scheduler_;
};

}  // namespace linattn

#endif  // LINATTN_SERVER_ATTENTION_SERVICE_H_
