// GenerationService (proto/linattn/v1/generation.proto) on gRPC's callback
// API. Handlers only parse, tokenize and convert: sessions live in the
// session table (core/session), batching and sampling in
// core/scheduler/generation.h, which calls back from the compute worker
// when a request's work is done. Generate is a write reactor that
// sends each token as the engine produces it; cancelling the call stops
// the generation at the next iteration.
#ifndef LINATTN_SERVER_GENERATION_SERVICE_H_
#define LINATTN_SERVER_GENERATION_SERVICE_H_

#include "core/scheduler/generation.h"
#include "linattn/v1/generation.grpc.pb.h"
#include "server/rpc_entry.h"

namespace linattn {

class GenerationServiceImpl final
    : public EntryPoints<v1::GenerationService::CallbackService> {
 public:
  // Both outlive the service. Every method enters through `gate`
  // (server/rpc_entry.h).
  GenerationServiceImpl(GenerationEngine* engine, const CallGate* gate);

  grpc::ServerUnaryReactor* ListModels(
      grpc::CallbackServerContext* ctx, const v1::ListModelsRequest* request,
      v1::ListModelsResponse* response) override;
  grpc::ServerUnaryReactor* CreateSession(
      grpc::CallbackServerContext* ctx,
      const v1::CreateModelSessionRequest* request,
      v1::ModelSession* response) override;
  grpc::ServerUnaryReactor* GetSession(
      grpc::CallbackServerContext* ctx,
      const v1::GetModelSessionRequest* request,
      v1::ModelSession* response) override;
  grpc::ServerUnaryReactor* ListSessions(
      grpc::CallbackServerContext* ctx,
      const v1::ListModelSessionsRequest* request,
      v1::ListModelSessionsResponse* response) override;
  grpc::ServerUnaryReactor* Append(grpc::CallbackServerContext* ctx,
                                   const v1::AppendRequest* request,
                                   v1::ModelSession* response) override;
  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* ctx,
      const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Fork(grpc::CallbackServerContext* ctx,
                                 const v1::ForkModelSessionRequest* request,
                                 v1::ModelSession* response) override;
  grpc::ServerUnaryReactor* Snapshot(
      grpc::CallbackServerContext* ctx,
      const v1::SnapshotModelSessionRequest* request,
      v1::SnapshotModelSessionResponse* response) override;
  grpc::ServerUnaryReactor* Restore(
      grpc::CallbackServerContext* ctx,
      const v1::RestoreModelSessionRequest* request,
      v1::ModelSession* response) override;
  grpc::ServerUnaryReactor* DeleteSession(
      grpc::CallbackServerContext* ctx,
      const v1::DeleteModelSessionRequest* request,
      v1::DeleteModelSessionResponse* response) override;

 private:
  class GenerateReactor;

  GenerationEngine* const engine_;
};

}  // namespace linattn

#endif  // LINATTN_SERVER_GENERATION_SERVICE_H_
