#include "server/attention_service.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <memory>
#include <new>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/session/snapshot.h"
#include "core/util/status_macros.h"
#include "server/convert.h"
#include "server/shared_memory.h"
#include "server/status.h"

namespace linattn {

namespace {

// The three tensors of a request hold tokens × heads × dim floats each.
using FloatField = google::protobuf::RepeatedField<float>;

static_assert(std::endian::native == std::endian::little,
              "bytes tensors are little-endian float32, read in place");

// One tensor of a request in either of its forms: `floats` (repeated float)
// or `bytes` (packed little-endian float32, "<name>_bytes"). *data receives
// its values, in place, when it holds `want` of them; an empty tensor in
// both forms gives nullptr.
absl::Status TensorOf(const char* name, const FloatField& floats,
                      const std::string& bytes, uint64_t want,
                      absl::string_view shape, const float** data) {
  if (!floats.empty() && !bytes.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ", ", name, "_bytes: one tensor given twice; send ",
                     name, " or ", name, "_bytes, not both"));
  }
  if (!bytes.empty()) {
    if (bytes.size() != want * sizeof(float)) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, "_bytes: expected ", want * sizeof(float), " bytes (", want,
          " float32 values: ", shape, "), got ", bytes.size()));
    }
    // A std::string's buffer is aligned for any fundamental type (operator
    // new) or sits 8-aligned inside the string object (short strings).
    if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(float) != 0) {
      return absl::InternalError(
          absl::StrCat(name, "_bytes: the parsed buffer is not aligned"));
    }
    *data = reinterpret_cast<const float*>(bytes.data());
    return absl::OkStatus();
  }
  if (uint64_t(floats.size()) != want) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": expected ", want,
                                                   " floats (", shape,
                                                   "), got ", floats.size()));
  }
  *data = floats.empty() ? nullptr : floats.data();
  return absl::OkStatus();
}

// The sizes of a request's tensors for `tokens` tokens of `spec`, and the
// input they make: q, k, v always; g and beta exactly when the rule takes
// them (docs/design.md §1). Each tensor as repeated floats or bytes.
template <typename Request>
absl::StatusOr<SequenceInput> InputOf(const AttentionSpec& spec,
                                      uint64_t tokens, const Request& r) {
  const uint64_t rows = tokens * spec.num_heads;  // ≤ 2^32 · 2^16
  const uint64_t gates = GatesPerHead(spec);
  // No message carries more than 2 GiB (protobuf's limit), so a tensor of
  // more than 2^29 floats cannot have arrived: refusing those first keeps
  // every size below (floats and their bytes) far from uint64's range.
  constexpr uint64_t kMaxTensorFloats = uint64_t{1} << 29;
  const uint64_t widest =
      std::max<uint64_t>({spec.key_dim, spec.value_dim, gates});
  if (rows > kMaxTensorFloats / widest) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokens: ", tokens, " tokens of ", spec.num_heads, " heads × ", widest,
        " values are more than any message carries (at most ", kMaxTensorFloats,
        " floats per tensor)"));
  }
  auto shape = [&](absl::string_view dim) {
    return absl::StrCat("tokens ", tokens, " × num_heads ", spec.num_heads,
                        dim);
  };
  SequenceInput in{.tokens = tokens};
  LINATTN_RETURN_IF_ERROR(TensorOf("q", r.q(), r.q_bytes(), rows * spec.key_dim,
                                   shape(" × key_dim"), &in.q));
  LINATTN_RETURN_IF_ERROR(TensorOf("k", r.k(), r.k_bytes(), rows * spec.key_dim,
                                   shape(" × key_dim"), &in.k));
  LINATTN_RETURN_IF_ERROR(TensorOf("v", r.v(), r.v_bytes(),
                                   rows * spec.value_dim, shape(" × value_dim"),
                                   &in.v));
  const absl::string_view rule = UpdateRuleName(spec.rule);
  if (gates == 0 && (!r.g().empty() || !r.g_bytes().empty())) {
    return absl::InvalidArgumentError(
        absl::StrCat(r.g().empty() ? "g_bytes" : "g", ": rule ", rule,
                     " takes no log-gates"));
  }
  if (gates != 0) {
    LINATTN_RETURN_IF_ERROR(
        TensorOf("g", r.g(), r.g_bytes(), rows * gates,
                 shape(gates == 1 ? "" : " × key_dim (gate key)"), &in.g));
  }
  if (!HasBeta(spec.rule) && (!r.beta().empty() || !r.beta_bytes().empty())) {
    return absl::InvalidArgumentError(
        absl::StrCat(r.beta().empty() ? "beta_bytes" : "beta", ": rule ", rule,
                     " takes no beta"));
  }
  if (HasBeta(spec.rule)) {
    LINATTN_RETURN_IF_ERROR(
        TensorOf("beta", r.beta(), r.beta_bytes(), rows, shape(""), &in.beta));
  }
  return in;
}

// Room for a response's output and denominator (`rows` heads' worth) in the
// form the request asked for: bytes when its q came as q_bytes.
template <typename Response>
std::pair<float*, float*> OutputOf(bool as_bytes, uint64_t rows,
                                   uint32_t value_dim, Response* r) {
  if (as_bytes) {
    r->mutable_output_bytes()->resize(rows * value_dim * sizeof(float));
    r->mutable_denominator_bytes()->resize(rows * sizeof(float));
    return {reinterpret_cast<float*>(r->mutable_output_bytes()->data()),
            reinterpret_cast<float*>(r->mutable_denominator_bytes()->data())};
  }
  r->mutable_output()->Resize(static_cast<int>(rows * value_dim), 0);
  r->mutable_denominator()->Resize(static_cast<int>(rows), 0);
  return {r->mutable_output()->mutable_data(),
          r->mutable_denominator()->mutable_data()};
}

void CopyAvailable(const std::vector<uint8_t>& from,
                   google::protobuf::RepeatedField<bool>* to) {
  to->Resize(static_cast<int>(from.size()), false);
  for (size_t i = 0; i < from.size(); ++i)
    to->Set(static_cast<int>(i), from[i] != 0);
}

// A Prefill's answer once the scheduler is done with it: availability and
// position on success (and its latency observed), nothing on failure.
void FinishPrefill(const absl::Status& status,
                   const std::vector<uint8_t>& available,
                   const AttentionSession& session, Observability* o,
                   std::chrono::steady_clock::time_point start,
                   v1::PrefillResponse* response,
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

}  // namespace

AttentionServiceImpl::AttentionServiceImpl(SessionManager* sessions,
                                           Scheduler* scheduler,
                                           const CallGate* gate,
                                           DurableStore* store,
                                           SharedMemoryOptions shared_memory)
    : EntryPoints("linattn.v1.AttentionService", gate),
      sessions_(sessions),
      scheduler_(scheduler),
      store_(store),
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

grpc::ServerUnaryReactor* AttentionServiceImpl::CreateSession(
    grpc::CallbackServerContext* ctx, const v1::CreateSessionRequest* request,
    v1::Session* response) {
  auto spec = FromProto(request->spec());
  if (!spec.ok()) return FinishCall(ctx, spec.status());
  auto session = sessions_->CreateSession(spec->spec, spec->epsilon,
                                          request->session_id(), TenantOf(ctx));
  if (session.ok()) ContextOf(ctx).NoteSession((*session)->id());
  if (!session.ok()) return FinishCall(ctx, session.status());
  if (store_ != nullptr) {
    if (absl::Status s = store_->AwaitCreate(*sessions_, **session); !s.ok()) {
      return FinishCall(ctx, s);
    }
  }
  ToProto(DescribeSession(**session), response);
  return FinishCall(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* AttentionServiceImpl::GetSession(
    grpc::CallbackServerContext* ctx, const v1::GetSessionRequest* request,
    v1::Session* response) {
  auto session = sessions_->FindAttention(request->session_id(), TenantOf(ctx));
  if (!session.ok()) return FinishCall(ctx, session.status());
  ToProto(DescribeSession(**session), response);
  return FinishCall(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* AttentionServiceImpl::ListSessions(
    grpc::CallbackServerContext* ctx, const v1::ListSessionsRequest*,
    v1::ListSessionsResponse* response) {
  for (const auto& session :
       sessions_->List(SessionKind::kAttention, TenantOf(ctx))) {
    ToProto(DescribeSession(static_cast<const AttentionSession&>(*session)),
            response->add_sessions());
  }
  return FinishCall(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* AttentionServiceImpl::DeleteSession(
    grpc::CallbackServerContext* ctx, const v1::DeleteSessionRequest* request,
    v1::DeleteSessionResponse*) {
  return FinishCall(
      ctx, store_ != nullptr
               ? store_->Delete(*sessions_, request->session_id(),
                                SessionKind::kAttention, TenantOf(ctx))
               : sessions_->Delete(request->session_id(),
                                   SessionKind::kAttention, TenantOf(ctx)));
}

grpc::ServerUnaryReactor* AttentionServiceImpl::Prefill(
    grpc::CallbackServerContext* ctx, const v1::PrefillRequest* request,
    v1::PrefillResponse* response) {
  auto found = sessions_->FindAttention(request->session_id(), TenantOf(ctx));
  if (!found.ok()) return FinishCall(ctx, found.status());
  std::shared_ptr<AttentionSession> session = *std::move(found);
  const AttentionSpec& spec = session->spec();
  const uint64_t T = request->tokens();
  if (T == 0)
    return FinishCall(ctx,
                      absl::InvalidArgumentError("tokens: must be at least 1"));
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
  scheduler_->Prefill(
      std::move(session), *in, out,
      [reactor, response, raw, available = std::move(available),
       o = gate()->observability(),
       start = ContextOf(ctx).start](absl::Status status) mutable {
        FinishPrefill(status, available, *raw, o, start, response, reactor);
      },
      LivenessOf(ctx));
  return reactor;
}

namespace {

// A share of the bytes shared-memory Prefills may hold at once, returned
// when it goes.
class InFlightBytes {
 public:
  InFlightBytes(InFlightBytes&& other) noexcept
      : counter_(std::move(other.counter_)),
        bytes_(std::exchange(other.bytes_, 0)) {}
  InFlightBytes& operator=(InFlightBytes&&) = delete;
  ~InFlightBytes() {
    if (counter_ != nullptr) counter_->fetch_sub(bytes_);
  }

  // `bytes` more, unless that passes `limit`.
  static std::optional<InFlightBytes> Take(
      const std::shared_ptr<std::atomic<uint64_t>>& counter, uint64_t bytes,
      uint64_t limit) {
    uint64_t held = counter->load();
    do {
      if (bytes > limit || held > limit - bytes) return std::nullopt;
    } while (!counter->compare_exchange_weak(held, held + bytes));
    return InFlightBytes(counter, bytes);
  }

 private:
  InFlightBytes(std::shared_ptr<std::atomic<uint64_t>> counter, uint64_t bytes)
      : counter_(std::move(counter)), bytes_(bytes) {}
  std::shared_ptr<std::atomic<uint64_t>> counter_;
  uint64_t bytes_ = 0;
};

// A shared-memory Prefill's tensors, read out of the client's region, and
// room for its outputs; they live until the call's last callback.
struct SharedPrefillBuffers {
  SharedRegion region;
  InFlightBytes share;
  std::unique_ptr<float[]> q, k, v, g, beta, output, denominator;
  std::vector<uint8_t> available;
};

// Default-initialised floats: every one is written before it is read.
std::unique_ptr<float[]> Floats(uint64_t n) {
  return n == 0 ? nullptr : std::unique_ptr<float[]>(new float[n]);
}

}  // namespace

// Prefill with its tensors in a client's memfd (docs/design.md,
// "Shared-memory tensors"): every size and range is checked before
// anything is allocated or read; the inputs are copied out of the region,
// so the call sees one version of them whatever the client does meanwhile;
// the outputs are written into it once the prefill has succeeded.
grpc::ServerUnaryReactor* AttentionServiceImpl::PrefillShared(
    grpc::CallbackServerContext* ctx, const v1::PrefillRequest* request,
    v1::PrefillResponse* response, std::shared_ptr<AttentionSession> session) {
  const v1::SharedMemoryTensors& shm = request->shared_memory();
  if (!shared_memory_.enabled) {
    return FinishCall(
        ctx, absl::FailedPreconditionError(
                 "shared_memory: this server takes no shared-memory tensors "
                 "(linattn-server --shared-memory, listening on a unix "
                 "socket, does)"));
  }
  const v1::PrefillRequest& r = *request;
  const std::pair<const char*, bool> inline_tensors[] = {
      {"q", !r.q().empty() || !r.q_bytes().empty()},
      {"k", !r.k().empty() || !r.k_bytes().empty()},
      {"v", !r.v().empty() || !r.v_bytes().empty()},
      {"g", !r.g().empty() || !r.g_bytes().empty()},
      {"beta", !r.beta().empty() || !r.beta_bytes().empty()}};
  for (const auto& [name, given] : inline_tensors) {
    if (given) {
      return FinishCall(ctx,
                        absl::InvalidArgumentError(absl::StrCat(
                            name,
                            ": given beside shared_memory; each tensor comes "
                            "in one form, here from the region")));
    }
  }
  const AttentionSpec& spec = session->spec();
  const uint64_t T = request->tokens();
  const uint64_t rows = T * spec.num_heads;  // ≤ 2^32 · 2^16
  const uint64_t gates = GatesPerHead(spec);
  const bool beta = HasBeta(spec.rule);
  const absl::string_view rule = UpdateRuleName(spec.rule);
  if ((gates != 0) != shm.has_g_offset()) {
    return FinishCall(
        ctx, absl::InvalidArgumentError(
                 absl::StrCat("shared_memory.g_offset: rule ", rule,
                              gates != 0 ? " takes log-gates; give their offset"
                                         : " takes no log-gates")));
  }
  if (beta != shm.has_beta_offset()) {
    return FinishCall(
        ctx, absl::InvalidArgumentError(absl::StrCat(
                 "shared_memory.beta_offset: rule ", rule,
                 beta ? " takes beta; give its offset" : " takes no beta")));
  }
  // Floats per token and head in and out: each side is bounded as the
  // request or response message carrying it would be, before anything is
  // formed from them.
  const uint64_t in_per_row =
      2 * uint64_t{spec.key_dim} + spec.value_dim + gates + (beta ? 1 : 0);
  const uint64_t out_per_row = uint64_t{spec.value_dim} + 1;
  const uint64_t max_floats = shared_memory_.max_tensor_bytes / sizeof(float);
  if (rows > max_floats / std::max(in_per_row, out_per_row)) {
    return FinishCall(
        ctx, absl::InvalidArgumentError(absl::StrCat(
                 "tokens: ", T, " tokens of ", spec.num_heads, " heads take ",
                 rows * in_per_row * sizeof(float), " bytes of inputs and ",
                 rows * out_per_row * sizeof(float),
                 " of outputs; a Prefill carries at most ",
                 shared_memory_.max_tensor_bytes,
                 " each way (--max-message-bytes)")));
  }
  const uint64_t qk_floats = rows * spec.key_dim;
  const uint64_t v_floats = rows * spec.value_dim;
  absl::StatusOr<SharedRegion> region =
      SharedRegion::Open("shared_memory.path", shm.path());
  if (!region.ok()) return FinishCall(ctx, region.status());
  const struct {
    const char* field;
    uint64_t offset, floats;
  } ranges[] = {
      {"shared_memory.q_offset", shm.q_offset(), qk_floats},
      {"shared_memory.k_offset", shm.k_offset(), qk_floats},
      {"shared_memory.v_offset", shm.v_offset(), v_floats},
      {"shared_memory.g_offset", shm.g_offset(), rows * gates},
      {"shared_memory.beta_offset", shm.beta_offset(), beta ? rows : 0},
      {"shared_memory.output_offset", shm.output_offset(), v_floats},
      {"shared_memory.denominator_offset", shm.denominator_offset(), rows}};
  for (const auto& range : ranges) {
    if (absl::Status s = region->CheckRange(range.field, range.offset,
                                            range.floats * sizeof(float));
        !s.ok()) {
      return FinishCall(ctx, s);
    }
  }
  // Each call holds the region's descriptor too: it counts at least a
  // 64th of the budget, so at most 64 such calls are in flight.
  const uint64_t held =
      std::max(rows * (in_per_row + out_per_row) * sizeof(float) + rows,
               shared_memory_.max_bytes_in_flight / 64);
  std::optional<InFlightBytes> share = InFlightBytes::Take(
      shared_bytes_in_flight_, held, shared_memory_.max_bytes_in_flight);
  if (!share.has_value()) {
    return FinishCall(
        ctx, absl::ResourceExhaustedError(absl::StrCat(
                 "shared_memory: the server holds as many shared-memory "
                 "prefills' tensors as it takes at once (",
                 shared_memory_.max_bytes_in_flight,
                 " bytes, --transport-memory); this one needs ", held,
                 "; try again when others are done")));
  }
  if (absl::Status s = gate()->limiter().Take(TenantOf(ctx), T); !s.ok()) {
    return FinishCall(ctx, s);
  }
  ContextOf(ctx).tokens_in.fetch_add(T, std::memory_order_relaxed);
  auto buffers = std::make_shared<SharedPrefillBuffers>(SharedPrefillBuffers{
      .region = *std::move(region), .share = *std::move(share)});
  SharedPrefillBuffers& b = *buffers;
  try {
    b.q = Floats(qk_floats);
    b.k = Floats(qk_floats);
    b.v = Floats(v_floats);
    b.g = Floats(rows * gates);
    b.beta = Floats(beta ? rows : 0);
    b.output = Floats(v_floats);
    b.denominator = Floats(rows);
    b.available.resize(rows);
  } catch (const std::bad_alloc&) {
    return FinishCall(ctx, absl::ResourceExhaustedError(
                               "out of memory for the prefill's tensors"));
  }
  SequenceInput in{.tokens = T};
  float* const inputs[] = {b.q.get(), b.k.get(), b.v.get(), b.g.get(),
                           b.beta.get()};
  for (size_t i = 0; i < std::size(inputs); ++i) {
    if (inputs[i] == nullptr) continue;
    if (absl::Status s = b.region.Read(
            ranges[i].offset, ranges[i].floats * sizeof(float), inputs[i]);
        !s.ok()) {
      return FinishCall(ctx, s);
    }
  }
  in.q = b.q.get();
  in.k = b.k.get();
  in.v = b.v.get();
  in.g = b.g.get();
  in.beta = b.beta.get();
  const SequenceOutput out{b.output.get(), b.denominator.get(),
                           b.available.data()};
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  AttentionSession* raw = session.get();
  const uint64_t output_offset = shm.output_offset();
  const uint64_t denominator_offset = shm.denominator_offset();
  scheduler_->Prefill(
      std::move(session), in, out,
      [reactor, response, raw, buffers = std::move(buffers), v_floats, rows,
       output_offset, denominator_offset, o = gate()->observability(),
       start = ContextOf(ctx).start](absl::Status status) mutable {
        // The prefill is applied. Should the region refuse the outputs
        // now (the client sealed it against writes meanwhile), they go
        // back in the response instead, so the call still succeeds whole.
        if (status.ok() &&
            !(buffers->region
                  .Write(output_offset, v_floats * sizeof(float),
                         buffers->output.get())
                  .ok() &&
              buffers->region
                  .Write(denominator_offset, rows * sizeof(float),
                         buffers->denominator.get())
                  .ok())) {
          response->set_output_bytes(
              reinterpret_cast<const char*>(buffers->output.get()),
              v_floats * sizeof(float));
          response->set_denominator_bytes(
              reinterpret_cast<const char*>(buffers->denominator.get()),
              rows * sizeof(float));
        }
        const std::vector<uint8_t> available = std::move(buffers->available);
        buffers.reset();  // the region is closed with the call
        FinishPrefill(status, available, *raw, o, start, response, reactor);
      },
      LivenessOf(ctx));
  return reactor;
}

// What Decode and DecodeBatch streams share: one message in flight; after
// its response is written, the next request is read. (The first read is
// started by the derived constructor, once the reactor is whole.)
//
// A stream can be aborted from outside (the server's grace period ended):
// waiting for a message it finishes at once; with a step running or a
// response being written, it finishes as soon as that is done, because the
// scheduler writes into the reactor's buffers until then.
class AttentionServiceImpl::OpenStream {
 public:
  virtual ~OpenStream() = default;
  virtual void Abort(const grpc::Status& status) = 0;
};

template <typename Request, typename Response>
class AttentionServiceImpl::StepStreamReactor
    : public grpc::ServerBidiReactor<Checked<Request>, Response>,
      public OpenStream {
 public:
  StepStreamReactor(AttentionServiceImpl* service,
                    grpc::CallbackServerContext* ctx)
      : service_(service), call_(&ContextOf(ctx)), liveness_(LivenessOf(ctx)) {}

  // Makes the stream reachable by AbortStreams; called once the reactor is
  // whole (by the handler that created it, before gRPC can call OnDone).
  void Register() {
    std::lock_guard<std::recursive_mutex> lock(service_->streams_mu_);
    service_->streams_.insert(this);
  }

  void Abort(const grpc::Status& status) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (finished_) return;
    if (busy_) {
      abort_ = status;  // finished when the step or write completes
      return;
    }
    finished_ = true;
    lock.unlock();
    this->Finish(status);
  }

  void OnReadDone(bool ok) final {
    if (!ok) {  // the client closed its side (or the call was cancelled)
      FinishOnce(grpc::Status::OK);
      return;
    }
    if (!read_.status.ok()) {  // the message could not be parsed
      FinishOnce(ToGrpcStatus(read_.status));
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_) return;
      busy_ = true;
    }
    step_start_ = std::chrono::steady_clock::now();
    if (absl::Status s = StartStep(); !s.ok()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        busy_ = false;
      }
      AddRetryHint(call_, s);
      FinishOnce(ToGrpcStatus(s));
    }
  }

  void OnWriteDone(bool ok) final {
    std::unique_lock<std::mutex> lock(mu_);
    busy_ = false;
    if (finished_) return;
    if (!ok || abort_) {
      finished_ = true;
      const grpc::Status status =
          abort_ ? *abort_
                 : grpc::Status(grpc::StatusCode::CANCELLED,
                                "the client went away");
      lock.unlock();
      this->Finish(status);
      return;
    }
    lock.unlock();
    this->StartRead(&read_);
  }

  void OnDone() final {
    {
      std::lock_guard<std::recursive_mutex> lock(service_->streams_mu_);
      service_->streams_.erase(this);
    }
    delete this;
  }

 protected:
  // Checks the request just read and submits its step; the step's
  // completion calls StepDone. An error ends the stream with it.
  virtual absl::Status StartStep() = 0;

  // From the step's completion: a step that failed ends the stream with its
  // error (or the abort); a step that was applied always has its response
  // written, even when the stream is being aborted (OnWriteDone then
  // finishes it), so a client learns of every step that changed its
  // session.
  void StepDone(const absl::Status& status) {
    if (Observability* o = service_->gate()->observability();
        o != nullptr && status.ok()) {
      o->DecodeStep(std::chrono::duration<double>(
                        std::chrono::steady_clock::now() - step_start_)
                        .count());
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (!status.ok()) {
      busy_ = false;
      finished_ = true;
      const grpc::Status out = abort_ ? *abort_ : ToGrpcStatus(status);
      lock.unlock();
      this->Finish(out);
      return;
    }
    lock.unlock();
    this->StartWrite(&response_);
  }

  void FinishOnce(const grpc::Status& status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_) return;
      finished_ = true;
    }
    this->Finish(status);
  }

  AttentionServiceImpl* const service_;
  CallContext* const call_;  // the stream's: its tenant, for the access log
  // When the message in flight was read (one at a time).
  std::chrono::steady_clock::time_point step_start_;
  const CallLiveness liveness_;  // a step of a stream that ended is dropped
  Checked<Request> read_;
  const Request& request_ = read_.message;
  Response response_;

 private:
  std::mutex mu_;
  bool busy_ = false;      // a step or a write is in flight
  bool finished_ = false;  // Finish was called
  std::optional<grpc::Status> abort_;
};

// One Decode stream: read a token, step it on the scheduler, write the
// result, read the next. A bad message ends the stream with its status and
// leaves the session as it was.
class AttentionServiceImpl::DecodeReactor final
    : public StepStreamReactor<v1::DecodeRequest, v1::DecodeResponse> {
 public:
  DecodeReactor(AttentionServiceImpl* service, grpc::CallbackServerContext* ctx)
      : StepStreamReactor(service, ctx) {
    StartRead(&read_);
  }

 private:
  absl::Status StartStep() override {
    LINATTN_ASSIGN_OR_RETURN(
        session_, service_->sessions_->FindAttention(request_.session_id(),
                                                     call_->tenant));
    call_->NoteSession(request_.session_id());
    call_->tokens_in.fetch_add(1, std::memory_order_relaxed);
    const AttentionSpec& spec = session_->spec();
    LINATTN_ASSIGN_OR_RETURN(const SequenceInput in,
                             InputOf(spec, 1, request_));
    LINATTN_RETURN_IF_ERROR(service_->gate()->limiter().Take(call_->tenant, 1));
    response_.Clear();
    const auto [output, denominator] =
        OutputOf(!request_.q_bytes().empty(), spec.num_heads, spec.value_dim,
                 &response_);
    available_.assign(spec.num_heads, 0);
    const SequenceOutput out{output, denominator, available_.data()};
    service_->scheduler_->Step(
        session_, in, out,
        [this](absl::Status status) {
          if (status.ok()) {
            CopyAvailable(available_, response_.mutable_available());
            response_.set_position(session_->state().position());
          }
          StepDone(status);
        },
        liveness_,
        request_.has_expected_position()
            ? std::optional<uint64_t>(request_.expected_position())
            : std::nullopt);
    return absl::OkStatus();
  }

  std::vector<uint8_t> available_;
  std::shared_ptr<AttentionSession> session_;
};

grpc::ServerBidiReactor<Checked<v1::DecodeRequest>, v1::DecodeResponse>*
AttentionServiceImpl::OpenDecode(grpc::CallbackServerContext* ctx) {
  auto* reactor = new DecodeReactor(this, ctx);
  reactor->Register();
  return reactor;
}

// One DecodeBatch stream: each message is a step group on the scheduler.
// Everything that can be checked before it runs is checked here, so a bad
// message ends the stream naming steps[i] before anything is queued.
class AttentionServiceImpl::DecodeBatchReactor final
    : public StepStreamReactor<v1::DecodeBatchRequest,
                               v1::DecodeBatchResponse> {
 public:
  DecodeBatchReactor(AttentionServiceImpl* service,
                     grpc::CallbackServerContext* ctx)
      : StepStreamReactor(service, ctx) {
    StartRead(&read_);
  }

 private:
  absl::Status StartStep() override {
    LINATTN_ASSIGN_OR_RETURN(std::vector<Scheduler::GroupStep> group,
                             Prepare());
    LINATTN_RETURN_IF_ERROR(service_->gate()->limiter().Take(
        call_->tenant, static_cast<double>(group.size())));
    service_->scheduler_->StepGroup(
        std::move(group),
        [this](absl::Status status) {
          if (status.ok()) {
            for (int i = 0; i < response_.steps_size(); ++i) {
              v1::DecodeResponse& r = *response_.mutable_steps(i);
              CopyAvailable(available_[i], r.mutable_available());
              r.set_position(sessions_[i]->state().position());
            }
          }
          sessions_.clear();
          StepDone(status);
        },
        liveness_);
    return absl::OkStatus();
  }

  // The step group of request_, with response_ sized to receive it.
  absl::StatusOr<std::vector<Scheduler::GroupStep>> Prepare() {
    // An empty group and a session twice are refused by the scheduler
    // (Scheduler::StepGroup), where every step group enters core.
    const int n = request_.steps_size();
    sessions_.clear();
    std::vector<Scheduler::GroupStep> group;
    group.reserve(n);
    response_.Clear();
    available_.resize(n);
    for (int i = 0; i < n; ++i) {
      const v1::DecodeRequest& step = request_.steps(i);
      auto prefix = [i](const absl::Status& s) {
        return absl::Status(s.code(),
                            absl::StrCat("steps[", i, "].", s.message()));
      };
      auto found =
          service_->sessions_->FindAttention(step.session_id(), call_->tenant);
      if (!found.ok()) return prefix(found.status());
      call_->NoteSession(step.session_id());
      call_->tokens_in.fetch_add(1, std::memory_order_relaxed);
      const AttentionSpec& spec = (*found)->spec();
      absl::StatusOr<SequenceInput> in = InputOf(spec, 1, step);
      if (!in.ok()) return prefix(in.status());
      v1::DecodeResponse& r = *response_.add_steps();
      const auto [output, denominator] =
          OutputOf(!step.q_bytes().empty(), spec.num_heads, spec.value_dim, &r);
      available_[i].assign(spec.num_heads, 0);
      group.push_back({*found,
                       *in,
                       {output, denominator, available_[i].data()},
                       step.has_expected_position()
                           ? std::optional<uint64_t>(step.expected_position())
                           : std::nullopt});
      sessions_.push_back(*std::move(found));
    }
    return group;
  }

  std::vector<std::vector<uint8_t>> available_;
  std::vector<std::shared_ptr<AttentionSession>> sessions_;
};

grpc::ServerBidiReactor<Checked<v1::DecodeBatchRequest>,
                        v1::DecodeBatchResponse>*
AttentionServiceImpl::OpenDecodeBatch(grpc::CallbackServerContext* ctx) {
  auto* reactor = new DecodeBatchReactor(this, ctx);
  reactor->Register();
  return reactor;
}

void AttentionServiceImpl::AbortStreams(const absl::Status& status) {
  // Held while aborting: a stream's OnDone (which deletes it) waits, so
  // every pointer stays valid; recursive in case gRPC runs OnDone inline.
  std::lock_guard<std::recursive_mutex> lock(streams_mu_);
  const std::vector<OpenStream*> open(streams_.begin(), streams_.end());
  for (OpenStream* stream : open) stream->Abort(ToGrpcStatus(status));
}

grpc::ServerUnaryReactor* AttentionServiceImpl::Inspect(
    grpc::CallbackServerContext* ctx, const v1::InspectRequest* request,
    v1::InspectResponse* response) {
  auto found = sessions_->FindAttention(request->session_id(), TenantOf(ctx));
  if (!found.ok()) return FinishCall(ctx, found.status());
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  scheduler_->Run(
      *std::move(found),
      [response](AttentionSession& session) {
        const AttentionState& state = session.state();
        const uint64_t s_floats =
            uint64_t{state.feature_dim()} * state.value_dim();
        for (uint32_t h = 0; h < state.num_heads(); ++h) {
          response->mutable_s()->Add(state.s(h), state.s(h) + s_floats);
          if (state.has_z()) {
            response->mutable_z()->Add(state.z(h),
                                       state.z(h) + state.feature_dim());
          }
          if (state.has_key_shift())
            response->add_key_log_scale(state.key_shift(h));
        }
        response->set_position(state.position());
        SessionInfo info = DescribeSession(session);
        info.position = state.position();
        ToProto(info, response->mutable_session());
        return absl::OkStatus();
      },
      [reactor](absl::Status status) { reactor->Finish(ToGrpcStatus(status)); },
      LivenessOf(ctx));
  return reactor;
}

grpc::ServerUnaryReactor* AttentionServiceImpl::Snapshot(
    grpc::CallbackServerContext* ctx, const v1::SnapshotRequest* request,
    v1::SnapshotResponse* response) {
  auto found = sessions_->FindAttention(request->session_id(), TenantOf(ctx));
  if (!found.ok()) return FinishCall(ctx, found.status());
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  scheduler_->Run(
      *std::move(found),
      [response](AttentionSession& session) {
        response->set_state(SerializeSnapshot(session.spec(), session.state()));
        return absl::OkStatus();
      },
      [reactor](absl::Status status) { reactor->Finish(ToGrpcStatus(status)); },
      LivenessOf(ctx));
  return reactor;
}

grpc::ServerUnaryReactor* AttentionServiceImpl::Restore(
    grpc::CallbackServerContext* ctx, const v1::RestoreRequest* request,
    v1::Session* response) {
  auto parsed = ParseSnapshot(request->state());
  if (!parsed.ok()) return FinishCall(ctx, parsed.status());
  auto session = sessions_->AdoptSession(parsed->spec, std::move(parsed->state),
                                         request->session_id(), "session_id",
                                         TenantOf(ctx));
  if (session.ok()) ContextOf(ctx).NoteSession((*session)->id());
  if (!session.ok()) return FinishCall(ctx, session.status());
  if (store_ != nullptr) {
    if (absl::Status s = store_->AwaitCreate(*sessions_, **session); !s.ok()) {
      return FinishCall(ctx, s);
    }
  }
  ToProto(DescribeSession(**session), response);
  return FinishCall(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* AttentionServiceImpl::Fork(
    grpc::CallbackServerContext* ctx, const v1::ForkRequest* request,
    v1::Session* response) {
  auto found = sessions_->FindAttention(request->session_id(), TenantOf(ctx));
  if (!found.ok()) return FinishCall(ctx, found.status());
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  SessionManager* sessions = sessions_;
  scheduler_->Run(
      *std::move(found),
      [sessions, store = store_, response, new_id = request->new_session_id(),
       tenant = TenantOf(ctx)](AttentionSession& parent) {
        // O(state): one copy of the block, then the two evolve independently.
        auto child =
            sessions->ForkSession(parent, new_id, "new_session_id", tenant);
        if (!child.ok()) return child.status();
        if (store != nullptr) {
          LINATTN_RETURN_IF_ERROR(store->AwaitCreate(*sessions, **child));
        }
        ToProto(DescribeSession(**child), response);
        return absl::OkStatus();
      },
      [reactor](absl::Status status) { reactor->Finish(ToGrpcStatus(status)); },
      LivenessOf(ctx));
  return reactor;
}

}  // namespace linattn
