#include "server/generation_service.h"

#include <deque>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "server/status.h"

namespace linattn {

namespace {

void ToProto(const ModelSessionInfo& info, v1::ModelSession* out) {
  out->set_session_id(info.session_id);
  out->set_model(info.model);
  out->set_position(info.position);
  out->set_state_bytes(info.state_bytes);
}

// Text or ids → ids, with the session's tokenizer. `text_field` and
// `ids_field` name the request's fields in errors.
absl::StatusOr<std::vector<int32_t>> Tokens(
    GenerationEngine& engine, const std::string& session_id,
    const Tenant& tenant, const std::string& text,
    const google::protobuf::RepeatedField<int32_t>& ids, const char* text_field,
    const char* ids_field, bool allow_empty) {
  if (!text.empty() && !ids.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        text_field, ", ", ids_field, ": set one of them, not both"));
  }
  if (text.empty() && ids.empty()) {
    if (allow_empty) return std::vector<int32_t>();
    return absl::InvalidArgumentError(
        absl::StrCat(text_field, ", ", ids_field, ": one of them is required"));
  }
  if (!ids.empty()) return std::vector<int32_t>(ids.begin(), ids.end());
  auto model = engine.ModelOf(session_id, tenant);
  if (!model.ok()) return model.status();
  auto encoded = (*model)->tokenizer().Encode(text);
  if (!encoded.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(text_field, ": ", encoded.status().message()));
  }
  return encoded;
}

}  // namespace

GenerationServiceImpl::GenerationServiceImpl(GenerationEngine* engine,
                                             const CallGate* gate)
    : EntryPoints("linattn.v1.GenerationService", gate), engine_(engine) {
  using Self = GenerationServiceImpl;
  Unary("ListModels", &Self::ListModels);
  Unary("CreateSession", &Self::CreateSession);
  Unary("GetSession", &Self::GetSession);
  Unary("ListSessions", &Self::ListSessions);
  Unary("Append", &Self::Append);
  Stream("Generate", &Self::Generate);
  Unary("Fork", &Self::Fork);
  Unary("Snapshot", &Self::Snapshot);
  Unary("Restore", &Self::Restore);
  Unary("DeleteSession", &Self::DeleteSession);
}

grpc::ServerUnaryReactor* GenerationServiceImpl::ListModels(
    grpc::CallbackServerContext* ctx, const v1::ListModelsRequest*,
    v1::ListModelsResponse* response) {
  for (const auto& m : engine_->models()) {
    const ModelConfig& c = m->config();
    v1::ModelInfo* info = response->add_models();
    info->set_name(m->name());
    info->set_model_type(c.model_type);
    if (c.is_linear_attn()) {
      info->set_feature_map(std::string(ModelFeatureMapName(c.feature_map)));
      info->set_normalized(c.norm_feature_map);
    }
    info->set_update_rule(
        std::string(UpdateRuleName(m->attention().spec().rule)));
    info->set_conv_window_floats(m->conv_window_floats());
    info->set_num_layers(c.num_hidden_layers);
    info->set_num_heads(c.num_heads);
    info->set_num_kv_heads(c.num_kv_heads);
    info->set_hidden_size(c.hidden_size);
    info->set_vocab_size(c.vocab_size);
    info->set_tokenizer(m->tokenizer().kind());
    info->set_parameters(m->parameter_count());
    info->set_state_bytes(m->state_bytes());
    info->set_kv_bytes_per_token(m->kv_bytes_per_token());
    if (c.is_hybrid()) {
      info->set_kv_bytes_max(m->kv_bytes_max().value_or(0));
      for (uint32_t l = 0; l < c.num_hidden_layers; ++l) {
        if (c.attention_layer(l) != nullptr) info->add_attention_layers(l);
      }
    }
    info->set_fingerprint(m->fingerprint_hex());
  }
  return FinishCall(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* GenerationServiceImpl::CreateSession(
    grpc::CallbackServerContext* ctx,
    const v1::CreateModelSessionRequest* request, v1::ModelSession* response) {
  auto info = engine_->CreateSession(request->model(), request->session_id(),
                                     TenantOf(ctx));
  if (info.ok()) ContextOf(ctx).NoteSession(info->session_id);
  if (info.ok()) ToProto(*info, response);
  return FinishCall(ctx, info.status());
}

grpc::ServerUnaryReactor* GenerationServiceImpl::GetSession(
    grpc::CallbackServerContext* ctx, const v1::GetModelSessionRequest* request,
    v1::ModelSession* response) {
  auto info = engine_->GetSession(request->session_id(), TenantOf(ctx));
  if (info.ok()) ToProto(*info, response);
  return FinishCall(ctx, info.status());
}

grpc::ServerUnaryReactor* GenerationServiceImpl::ListSessions(
    grpc::CallbackServerContext* ctx, const v1::ListModelSessionsRequest*,
    v1::ListModelSessionsResponse* response) {
  for (const ModelSessionInfo& info : engine_->ListSessions(TenantOf(ctx))) {
    ToProto(info, response->add_sessions());
  }
  return FinishCall(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* GenerationServiceImpl::Append(
    grpc::CallbackServerContext* ctx, const v1::AppendRequest* request,
    v1::ModelSession* response) {
  auto tokens =
      Tokens(*engine_, request->session_id(), TenantOf(ctx), request->text(),
             request->token_ids(), "text", "token_ids", false);
  if (!tokens.ok()) return FinishCall(ctx, tokens.status());
  if (absl::Status s = gate()->limiter().Take(
          TenantOf(ctx), static_cast<double>(tokens->size()));
      !s.ok()) {
    return FinishCall(ctx, s);
  }
  ContextOf(ctx).tokens_in.fetch_add(tokens->size(), std::memory_order_relaxed);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  engine_->Append(
      request->session_id(), std::move(*tokens),
      [reactor, response, o = gate()->observability(),
       start = ContextOf(ctx).start](absl::StatusOr<ModelSessionInfo> info) {
        if (info.ok()) {
          ToProto(*info, response);
          if (o != nullptr) {
            o->Prefill(std::chrono::duration<double>(
                           std::chrono::steady_clock::now() - start)
                           .count());
          }
        }
        reactor->Finish(ToGrpcStatus(info.status()));
      },
      LivenessOf(ctx), TenantOf(ctx));
  return reactor;
}

// Events from the engine's worker go through a Channel, which outlives the
// reactor: once the call is done the engine's remaining events are dropped.
// Delivery is paced (GenerateControl): the engine computes a token only
// after the previous one's message was written, so a stream that breaks
// leaves exactly the tokens its client was sent in the session's context.
class GenerationServiceImpl::GenerateReactor final
    : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  GenerateReactor(GenerationEngine* engine, CallContext* call,
                  Observability* observability, TokenRateLimiter* limiter)
      : channel_(std::make_shared<Channel>(engine, call, observability)),
        limiter_(limiter) {
    channel_->reactor = this;
  }

  void Start(const v1::GenerateRequest& request) {
    GenerationEngine& engine = *channel_->engine;
    const Tenant& tenant = channel_->call->tenant;
    auto tokens =
        Tokens(engine, request.session_id(), tenant, request.prompt(),
               request.prompt_token_ids(), "prompt", "prompt_token_ids", true);
    if (!tokens.ok()) {
      Finish(ToGrpcStatus(tokens.status()));
      return;
    }
    const v1::SamplingParams& p = request.sampling();
    SamplingParams params;
    params.temperature = p.temperature();
    params.top_k = p.top_k();
    params.top_p = p.top_p() == 0.0f ? 1.0f : p.top_p();
    params.seed = p.seed();
    params.max_tokens = p.max_tokens() == 0 ? 16 : p.max_tokens();
    params.stop.assign(p.stop().begin(), p.stop().end());
    params.logprobs = p.logprobs();
    params.resume_stream = p.resume_stream();
    params.min_p = p.min_p();
    params.presence_penalty = p.presence_penalty();
    params.frequency_penalty = p.frequency_penalty();
    if (p.has_repetition_penalty()) {
      params.repetition_penalty = p.repetition_penalty();
    }
    if (p.has_penalty_last_n()) params.penalty_last_n = p.penalty_last_n();
    // Charged the prompt and max_tokens now; what it does not generate is
    // given back when it ends.
    if (absl::Status s = limiter_->Take(
            tenant, static_cast<double>(tokens->size() + params.max_tokens));
        !s.ok()) {
      AddRetryHint(channel_->call, s);
      Finish(ToGrpcStatus(s));
      return;
    }
    channel_->limiter = limiter_;
    channel_->tenant = tenant;
    channel_->max_tokens = params.max_tokens;
    engine.Generate(
        request.session_id(), std::move(*tokens), std::move(params),
        [channel = channel_](const GenerateEvent& e) { channel->Push(e); },
        channel_->control, tenant);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(channel_->mu);
    channel_->writing = false;
    if (ok && channel_->current.token_id() >= 0) {
      channel_->engine->Delivered(*channel_->control);
    }
    if (!ok || channel_->cancelled) {
      // The client is gone: stop generating, finish once the engine has.
      // (A cancel that came during this write waited for it, so that the
      // engine counts the message the client may well have received.)
      channel_->engine->Cancel(*channel_->control);
      channel_->queue.clear();
      channel_->broken = true;
    }
    channel_->WriteNextLocked();
  }

  void OnCancel() override {
    std::lock_guard<std::mutex> lock(channel_->mu);
    channel_->cancelled = true;
    if (!channel_->writing) channel_->engine->Cancel(*channel_->control);
  }

  void OnDone() override {
    {
      std::lock_guard<std::mutex> lock(channel_->mu);
      channel_->reactor = nullptr;
    }
    delete this;
  }

 private:
  struct Channel {
    Channel(GenerationEngine* e, CallContext* c, Observability* o)
        : engine(e), call(c), observability(o), last_token(c->start) {}
    GenerationEngine* const engine;
    CallContext* const call;  // valid while `reactor` is set
    Observability* const observability;
    // The rate this generation was charged against, and for how many
    // tokens it may generate (given back as unused at its end).
    TokenRateLimiter* limiter = nullptr;
    Tenant tenant;
    uint64_t max_tokens = 0;
    // The call's start, then its last token's arrival.
    std::chrono::steady_clock::time_point last_token;
    bool had_token = false;
    const std::shared_ptr<GenerateControl> control =
        std::make_shared<GenerateControl>(/*paced=*/true);
    std::mutex mu;
    GenerateReactor* reactor = nullptr;  // null once the call is done
    std::deque<v1::GenerateResponse> queue;
    v1::GenerateResponse current;
    bool writing = false;
    bool cancelled = false;  // OnCancel came
    bool broken = false;
    bool finished = false;  // the final event has arrived
    grpc::Status final_status;

    void Push(const GenerateEvent& e) {
      std::lock_guard<std::mutex> lock(mu);
      if (e.finished && limiter != nullptr) {  // the call may be gone
        if (e.completion_tokens < max_tokens) {
          limiter->GiveBack(
              tenant, static_cast<double>(max_tokens - e.completion_tokens));
        }
        limiter = nullptr;
      }
      if (reactor == nullptr) return;
      // Usage grows event by event: the last one seen is the call's.
      if (e.prompt_tokens != 0) call->tokens_in.store(e.prompt_tokens);
      if (e.completion_tokens != 0) call->tokens_out.store(e.completion_tokens);
      if (e.token_id >= 0 && observability != nullptr) {
        const auto now = std::chrono::steady_clock::now();
        const double seconds =
            std::chrono::duration<double>(now - last_token).count();
        if (had_token) {
          observability->BetweenTokens(seconds);
        } else {
          observability->FirstToken(seconds);
        }
        had_token = true;
        last_token = now;
      }
      if (e.status.ok() &&
          (e.token_id >= 0 || !e.text.empty() || !e.finish_reason.empty()) &&
          !broken && !cancelled) {
        v1::GenerateResponse r;
        r.set_token_id(e.token_id);
        r.set_text(e.text);
        r.set_logprob(e.logprob);
        r.set_finish_reason(e.finish_reason);
        r.mutable_usage()->set_prompt_tokens(e.prompt_tokens);
        r.mutable_usage()->set_completion_tokens(e.completion_tokens);
        r.set_position(e.position);
        queue.push_back(std::move(r));
      }
      if (e.finished) {
        finished = true;
        final_status = ToGrpcStatus(e.status);
      }
      WriteNextLocked();
    }

    void WriteNextLocked() {
      if (reactor == nullptr || writing) return;
      if (!queue.empty()) {
        current = std::move(queue.front());
        queue.pop_front();
        writing = true;
        reactor->StartWrite(&current);
        return;
      }
      if (finished) {
        finished = false;  // Finish exactly once
        reactor->Finish(final_status);
      }
    }
  };

  std::shared_ptr<Channel> channel_;
  TokenRateLimiter* const limiter_;
};

grpc::ServerWriteReactor<v1::GenerateResponse>* GenerationServiceImpl::Generate(
    grpc::CallbackServerContext* ctx, const v1::GenerateRequest* request) {
  auto* reactor = new GenerateReactor(
      engine_, &ContextOf(ctx), gate()->observability(), &gate()->limiter());
  reactor->Start(*request);
  return reactor;
}

grpc::ServerUnaryReactor* GenerationServiceImpl::Fork(
    grpc::CallbackServerContext* ctx,
    const v1::ForkModelSessionRequest* request, v1::ModelSession* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  engine_->Fork(
      request->session_id(), request->new_session_id(),
      [reactor, response](absl::StatusOr<ModelSessionInfo> info) {
        if (info.ok()) ToProto(*info, response);
        reactor->Finish(ToGrpcStatus(info.status()));
      },
      LivenessOf(ctx), TenantOf(ctx));
  return reactor;
}

grpc::ServerUnaryReactor* GenerationServiceImpl::Snapshot(
    grpc::CallbackServerContext* ctx,
    const v1::SnapshotModelSessionRequest* request,
    v1::SnapshotModelSessionResponse* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  engine_->Snapshot(
      request->session_id(),
      [reactor, response](absl::StatusOr<std::string> bytes) {
        if (bytes.ok()) response->set_state(std::move(*bytes));
        reactor->Finish(ToGrpcStatus(bytes.status()));
      },
      LivenessOf(ctx), TenantOf(ctx));
  return reactor;
}

grpc::ServerUnaryReactor* GenerationServiceImpl::Restore(
    grpc::CallbackServerContext* ctx,
    const v1::RestoreModelSessionRequest* request, v1::ModelSession* response) {
  auto info =
      engine_->Restore(request->state(), request->session_id(), TenantOf(ctx));
  if (info.ok()) ContextOf(ctx).NoteSession(info->session_id);
  if (info.ok()) ToProto(*info, response);
  return FinishCall(ctx, info.status());
}

grpc::ServerUnaryReactor* GenerationServiceImpl::DeleteSession(
    grpc::CallbackServerContext* ctx,
    const v1::DeleteModelSessionRequest* request,
    v1::DeleteModelSessionResponse*) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  engine_->Delete(
      request->session_id(),
      [reactor](absl::Status s) { reactor->Finish(ToGrpcStatus(s)); },
      LivenessOf(ctx), TenantOf(ctx));
  return reactor;
}

}  // namespace linattn
