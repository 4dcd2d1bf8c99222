#include "server/attention_service.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/attention_tensors.h"
#include "server/convert.h"
#include "server/status.h"

namespace linattn {

AttentionServiceImpl::AttentionServiceImpl(AttentionSessions* sessions,
                                           const CallGate* gate,
                                           SharedMemoryOptions shared_memory)
    : EntryPoints("linattn.v1.AttentionService", gate),
      sessions_(sessions),
      shared_memory_(shared_memory) {
  using Self = AttentionServiceImpl;
  Unary("CreateSession", &Self::CreateSession);
  Unary("GetSession", &Self::GetSession);
  Unary("ListSessions", &Self::ListSessions);
  Unary("DeleteSession", &Self::DeleteSession);
  Unary("Prefill", &Self::Prefill);
  Bidi("Decode", &Self::OpenDecode);
  Bidi("DecodeBatch", &Self::OpenDecodeBatch);
  Unary("Inspect", &Self::Inspect);
  Unary("Snapshot", &Self::Snapshot);
  Unary("Restore", &Self::Restore);
  Unary("Fork", &Self::Fork);
}

namespace {

// A unary call that answers with a new session's description.
grpc::ServerUnaryReactor* FinishWithSession(
    grpc::CallbackServerContext* ctx, const absl::StatusOr<SessionInfo>& info,
    v1::Session* response) {
  if (!info.ok()) return FinishCall(ctx, info.status());
  ContextOf(ctx).NoteSession(info->id);
  ToProto(*info, response);
  return FinishCall(ctx, absl::OkStatus());
}

}  // namespace

grpc::ServerUnaryReactor* AttentionServiceImpl::CreateSession(
    grpc::CallbackServerContext* ctx, const v1::CreateSessionRequest* request,
    v1::Session* response) {
  auto spec = FromProto(request->spec());
  if (!spec.ok()) return FinishCall(ctx, spec.status());
  return FinishWithSession(
      ctx,
      sessions_->Create(spec->spec, spec->epsilon, request->session_id(),
                        TenantOf(ctx)),
      response);
}

grpc::ServerUnaryReactor* AttentionServiceImpl::GetSession(
    grpc::CallbackServerContext* ctx, const v1::GetSessionRequest* request,
    v1::Session* response) {
  auto info = sessions_->Get(request->session_id(), TenantOf(ctx));
  if (info.ok()) ToProto(*info, response);
  return FinishCall(ctx, info.status());
}

grpc::ServerUnaryReactor* AttentionServiceImpl::ListSessions(
    grpc::CallbackServerContext* ctx, const v1::ListSessionsRequest*,
    v1::ListSessionsResponse* response) {
  for (const SessionInfo& info : sessions_->List(TenantOf(ctx))) {
    ToProto(info, response->add_sessions());
  }
  return FinishCall(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* AttentionServiceImpl::DeleteSession(
    grpc::CallbackServerContext* ctx, const v1::DeleteSessionRequest* request,
    v1::DeleteSessionResponse*) {
  return FinishCall(ctx,
                    sessions_->Delete(request->session_id(), TenantOf(ctx)));
}

void AttentionServiceImpl::FinishPrefill(
    const absl::Status& status, const std::vector<uint8_t>& available,
    const AttentionSession& session, Observability* o,
    std::chrono::steady_clock::time_point start, v1::PrefillResponse* response,
    grpc::ServerUnaryReactor* reactor) {
  if (status.ok()) {
    CopyAvailable(available, response->mutable_available());
    response->set_position(session.state().position());
    if (o != nullptr) {
      o->Prefill(std::chrono::duration<double>(
                     std::chrono::steady_clock::now() - start)
                     .count());
    }
  } else {
    response->Clear();
  }
  reactor->Finish(ToGrpcStatus(status));
}

grpc::ServerUnaryReactor* AttentionServiceImpl::Prefill(
    grpc::CallbackServerContext* ctx, const v1::PrefillRequest* request,
    v1::PrefillResponse* response) {
  auto found = sessions_->Find(request->session_id(), TenantOf(ctx));
  if (!found.ok()) return FinishCall(ctx, found.status());
  std::shared_ptr<AttentionSession> session = *std::move(found);
  const AttentionSpec& spec = session->spec();
  const uint64_t T = request->tokens();
  if (T == 0) {
    return FinishCall(ctx,
                      absl::InvalidArgumentError("tokens: must be at least 1"));
  }
  if (request->has_shared_memory()) {
    return PrefillShared(ctx, request, response, std::move(session));
  }
  absl::StatusOr<SequenceInput> in = InputOf(spec, T, *request);
  if (!in.ok()) return FinishCall(ctx, in.status());
  if (absl::Status s = gate()->limiter().Take(TenantOf(ctx), T); !s.ok()) {
    return FinishCall(ctx, s);
  }
  ContextOf(ctx).tokens_in.fetch_add(T, std::memory_order_relaxed);
  const auto [output, denominator] =
      OutputOf(!request->q_bytes().empty(), T * spec.num_heads, spec.value_dim,
               response);
  std::vector<uint8_t> available(T * spec.num_heads);
  const SequenceOutput out{output, denominator, available.data()};
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  AttentionSession* raw = session.get();
  sessions_->Prefill(
      std::move(session), *in, out,
      [reactor, response, raw, available = std::move(available),
       o = gate()->observability(),
       start = ContextOf(ctx).start](absl::Status status) mutable {
        FinishPrefill(status, available, *raw, o, start, response, reactor);
      },
      LivenessOf(ctx));
  return reactor;
}

grpc::ServerUnaryReactor* AttentionServiceImpl::Inspect(
    grpc::CallbackServerContext* ctx, const v1::InspectRequest* request,
    v1::InspectResponse* response) {
  auto found = sessions_->Find(request->session_id(), TenantOf(ctx));
  if (!found.ok()) return FinishCall(ctx, found.status());
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  sessions_->Read(
      *std::move(found),
      [response](const AttentionSession& session) {
        const AttentionState& state = session.state();
        const uint64_t s_floats =
            uint64_t{state.feature_dim()} * state.value_dim();
        for (uint32_t h = 0; h < state.num_heads(); ++h) {
          response->mutable_s()->Add(state.s(h), state.s(h) + s_floats);
          if (state.has_z()) {
            response->mutable_z()->Add(state.z(h),
                                       state.z(h) + state.feature_dim());
          }
          if (state.has_key_shift()) {
            response->add_key_log_scale(state.key_shift(h));
          }
        }
        response->set_position(state.position());
        SessionInfo info = DescribeSession(session);
        info.position = state.position();
        ToProto(info, response->mutable_session());
      },
      [reactor](absl::Status status) { reactor->Finish(ToGrpcStatus(status)); },
      LivenessOf(ctx));
  return reactor;
}

grpc::ServerUnaryReactor* AttentionServiceImpl::Snapshot(
    grpc::CallbackServerContext* ctx, const v1::SnapshotRequest* request,
    v1::SnapshotResponse* response) {
  auto found = sessions_->Find(request->session_id(), TenantOf(ctx));
  if (!found.ok()) return FinishCall(ctx, found.status());
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  sessions_->Snapshot(
      *std::move(found),
      [reactor, response](absl::StatusOr<std::string> blob) {
        if (blob.ok()) response->set_state(*std::move(blob));
        reactor->Finish(ToGrpcStatus(blob.status()));
      },
      LivenessOf(ctx));
  return reactor;
}

grpc::ServerUnaryReactor* AttentionServiceImpl::Restore(
    grpc::CallbackServerContext* ctx, const v1::RestoreRequest* request,
    v1::Session* response) {
  return FinishWithSession(
      ctx,
      sessions_->Restore(request->state(), request->session_id(),
                         TenantOf(ctx)),
      response);
}

grpc::ServerUnaryReactor* AttentionServiceImpl::Fork(
    grpc::CallbackServerContext* ctx, const v1::ForkRequest* request,
    v1::Session* response) {
  auto found = sessions_->Find(request->session_id(), TenantOf(ctx));
  if (!found.ok()) return FinishCall(ctx, found.status());
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  sessions_->Fork(
      *std::move(found), request->new_session_id(), TenantOf(ctx),
      [reactor, response](absl::StatusOr<SessionInfo> child) {
        if (child.ok()) ToProto(*child, response);
        reactor->Finish(ToGrpcStatus(child.status()));
      },
      LivenessOf(ctx));
  return reactor;
}

}  // namespace linattn
