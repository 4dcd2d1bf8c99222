#include "clients/cli/remote.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpc_health/v1/health.grpc.pb.h"

namespace linattn {

namespace {

// n floats as a request tensor's bytes form (packed little-endian
// float32, docs/design.md "Tensors as bytes").
void SetBytes(const float* from, uint64_t n, std::string* bytes) {
  bytes->assign(reinterpret_cast<const char*>(from), n * sizeof(float));
}

// A response's tensor `name`, in whichever form it came, into `to` (room
// for `want` floats); DATA_LOSS when the server sent another count.
absl::Status CopyTensor(const char* name,
                        const google::protobuf::RepeatedField<float>& floats,
                        const std::string& bytes, uint64_t want, float* to) {
  const uint64_t got =
      bytes.empty() ? uint64_t(floats.size()) : bytes.size() / sizeof(float);
  if (got != want || bytes.size() % sizeof(float) != 0) {
    return absl::DataLossError(absl::StrCat("the server answered ", got, " ",
                                            name, " values where ", want,
                                            " were due"));
  }
  if (bytes.empty()) {
    std::copy(floats.begin(), floats.end(), to);
  } else {
    std::memcpy(to, bytes.data(), bytes.size());
  }
  return absl::OkStatus();
}

// `rows` heads' output, denominator and availability of a response at row
// row0 of `out`.
template <typename Response>
absl::Status CopyOut(const Response& r, uint64_t row0, uint64_t rows,
                     uint32_t d_v, const SequenceOutput& out) {
  if (absl::Status s = CopyTensor("output", r.output(), r.output_bytes(),
                                  rows * d_v, out.output + row0 * d_v);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CopyTensor("denominator", r.denominator(), r.denominator_bytes(),
                     rows, out.denominator + row0);
      !s.ok()) {
    return s;
  }
  for (uint64_t i = 0; i < rows && i < uint64_t(r.available_size()); ++i) {
    out.available[row0 + i] = r.available(static_cast<int>(i)) ? 1 : 0;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

absl::Status FinishAfterFailedRead(grpc::ClientContext& ctx,
                                   const std::function<grpc::Status()>& finish,
                                   std::chrono::milliseconds grace) {
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false, cancelled = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, grace, [&] { return finished; })) {
      cancelled = true;
      ctx.TryCancel();
    }
  });
  const grpc::Status status = finish();
  {
    std::lock_guard<std::mutex> lock(mu);
    finished = true;
  }
  cv.notify_all();
  watchdog.join();
  if (cancelled) {
    return absl::DataLossError(
        "a response from the server could not be read; the call was "
        "cancelled");
  }
  return FromGrpcStatus(status);
}

void NameSession(grpc::ClientContext& ctx, const std::string& session_id) {
  if (!session_id.empty()) ctx.AddMetadata(kSessionIdMetadata, session_id);
}

std::string NewSessionId() {
  std::random_device device;
  std::string id;
  for (int i = 0; i < 4; ++i) {
    absl::StrAppend(&id, absl::Hex(device(), absl::kZeroPad8));
  }
  return id;
}

RemoteAttention::RemoteAttention(const std::string& address,
                                 const ConnectionOptions& connection) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);  // the server enforces its own limit
  args.SetMaxSendMessageSize(-1);
  channel_ = OpenChannel(address, connection, std::move(args));
  stub_ = v1::AttentionService::NewStub(channel_);
}

absl::StatusOr<v1::Session> RemoteAttention::CreateSession(
    const AttentionSpec& spec, std::optional<float> epsilon,
    const std::string& session_id) {
  v1::CreateSessionRequest req;
  v1::AttentionSpec* s = req.mutable_spec();
  s->set_num_heads(spec.num_heads);
  s->set_key_dim(spec.key_dim);
  s->set_value_dim(spec.value_dim);
  s->set_feature_map(std::string(FeatureMapName(spec.feature_map)));
  s->set_unnormalized(spec.unnormalized);
  if (epsilon) s->set_epsilon(*epsilon);
  s->mutable_decay()->Assign(spec.decay.begin(), spec.decay.end());
  s->set_feature_dim(spec.feature_dim);
  s->set_seed(spec.seed);
  s->set_horizon(spec.horizon);
  if (spec.rule != UpdateRule::kLinear) {
    s->set_rule(std::string(UpdateRuleName(spec.rule)));
    s->set_gate(std::string(GateShapeName(spec.gate)));
    s->set_qk_l2norm(spec.qk_l2norm);
    s->set_scale(spec.scale);
    s->mutable_bonus()->Assign(spec.bonus.begin(), spec.bonus.end());
  }
  req.set_session_id(session_id.empty() ? NewSessionId() : session_id);
  grpc::ClientContext ctx;
  NameSession(ctx, req.session_id());
  v1::Session session;
  if (grpc::Status st = stub_->CreateSession(&ctx, req, &session); !st.ok()) {
    return FromGrpcStatus(st);
  }
  return session;
}

absl::Status RemoteAttention::DeleteSession(const std::string& session_id) {
  grpc::ClientContext ctx;
  v1::DeleteSessionRequest req;
  req.set_session_id(session_id);
  NameSession(ctx, session_id);
  v1::DeleteSessionResponse resp;
  return FromGrpcStatus(stub_->DeleteSession(&ctx, req, &resp));
}

absl::StatusOr<v1::Session> RemoteAttention::Fork(
    const std::string& session_id) {
  grpc::ClientContext ctx;
  v1::ForkRequest req;
  req.set_session_id(session_id);
  req.set_new_session_id(NewSessionId());
  NameSession(ctx, session_id);
  v1::Session resp;
  if (grpc::Status st = stub_->Fork(&ctx, req, &resp); !st.ok())
    return FromGrpcStatus(st);
  return resp;
}

absl::StatusOr<v1::InspectResponse> RemoteAttention::Inspect(
    const std::string& session_id) {
  grpc::ClientContext ctx;
  v1::InspectRequest req;
  req.set_session_id(session_id);
  NameSession(ctx, session_id);
  v1::InspectResponse resp;
  if (grpc::Status st = stub_->Inspect(&ctx, req, &resp); !st.ok())
    return FromGrpcStatus(st);
  return resp;
}

absl::StatusOr<v1::Session> RemoteAttention::GetSession(
    const std::string& session_id) {
  grpc::ClientContext ctx;
  v1::GetSessionRequest req;
  req.set_session_id(session_id);
  NameSession(ctx, session_id);
  v1::Session resp;
  if (grpc::Status st = stub_->GetSession(&ctx, req, &resp); !st.ok())
    return FromGrpcStatus(st);
  return resp;
}

absl::StatusOr<std::string> RemoteAttention::Snapshot(
    const std::string& session_id) {
  grpc::ClientContext ctx;
  v1::SnapshotRequest req;
  req.set_session_id(session_id);
  NameSession(ctx, session_id);
  v1::SnapshotResponse resp;
  if (grpc::Status st = stub_->Snapshot(&ctx, req, &resp); !st.ok())
    return FromGrpcStatus(st);
  return std::move(*resp.mutable_state());
}

namespace {

// Tokens [t0, t0 + n) of `in` into a request's bytes tensors: q, k, v, and
// g, β, a and b where the rule takes them.
template <typename Request>
void SetInputs(const AttentionSpec& spec, const SequenceInput& in, uint64_t t0,
               uint64_t n, Request* req) {
  const uint64_t H = spec.num_heads, qk = H * spec.key_dim,
                 vv = H * spec.value_dim, gates = GatesPerHead(spec);
  SetBytes(in.q + t0 * qk, n * qk, req->mutable_q_bytes());
  SetBytes(in.k + t0 * qk, n * qk, req->mutable_k_bytes());
  SetBytes(in.v + t0 * vv, n * vv, req->mutable_v_bytes());
  if (gates != 0) {
    SetBytes(in.g + t0 * H * gates, n * H * gates, req->mutable_g_bytes());
  }
  if (HasBeta(spec.rule)) {
    SetBytes(in.beta + t0 * H, n * H, req->mutable_beta_bytes());
  }
  if (HasLowRank(spec.rule)) {
    SetBytes(in.a + t0 * qk, n * qk, req->mutable_a_bytes());
    SetBytes(in.b + t0 * qk, n * qk, req->mutable_b_bytes());
  }
}

}  // namespace

absl::Status RemoteAttention::Prefill(const std::string& session_id,
                                      const AttentionSpec& spec,
                                      const SequenceInput& in,
                                      const SequenceOutput& out,
                                      uint64_t max_tokens) {
  const uint64_t H = spec.num_heads;
  for (uint64_t t0 = 0; t0 < in.tokens; t0 += max_tokens) {
    const uint64_t n = std::min(max_tokens, in.tokens - t0);
    v1::PrefillRequest req;
    req.set_session_id(session_id);
    req.set_tokens(static_cast<uint32_t>(n));
    SetInputs(spec, in, t0, n, &req);
    grpc::ClientContext ctx;
    NameSession(ctx, session_id);
    v1::PrefillResponse resp;
    if (grpc::Status st = stub_->Prefill(&ctx, req, &resp); !st.ok())
      return FromGrpcStatus(st);
    if (absl::Status s = CopyOut(resp, t0 * H, n * H, spec.value_dim, out);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status RemoteAttention::Decode(const std::string& session_id,
                                     const AttentionSpec& spec,
                                     const SequenceInput& in,
                                     const SequenceOutput& out) {
  const uint64_t H = spec.num_heads;
  grpc::ClientContext ctx;
  NameSession(ctx, session_id);
  auto stream = stub_->Decode(&ctx);
  uint64_t t = 0;
  for (; t < in.tokens; ++t) {
    v1::DecodeRequest req;
    req.set_session_id(session_id);
    SetInputs(spec, in, t, 1, &req);
    v1::DecodeResponse resp;
    if (!stream->Write(req) || !stream->Read(&resp)) break;
    if (absl::Status s = CopyOut(resp, t * H, H, spec.value_dim, out);
        !s.ok()) {
      stream->WritesDone();
      ctx.TryCancel();
      stream->Finish();
      return s;
    }
  }
  stream->WritesDone();
  if (t == in.tokens) return FromGrpcStatus(stream->Finish());
  // A step without its response: the server ended the stream, or a response
  // could not be read.
  absl::Status status =
      FinishAfterFailedRead(ctx, [&] { return stream->Finish(); });
  if (status.ok()) {
    return absl::DataLossError(
        absl::StrCat("decode: the stream broke off after ", t, " of ",
                     in.tokens, " responses"));
  }
  return status;
}

absl::StatusOr<bool> RemoteAttention::Healthy(
    const std::string& service, std::chrono::milliseconds timeout) {
  auto health = grpc::health::v1::Health::NewStub(channel_);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  if (grpc::Status st = health->Check(&ctx, req, &resp); !st.ok())
    return FromGrpcStatus(st);
  return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

}  // namespace linattn
