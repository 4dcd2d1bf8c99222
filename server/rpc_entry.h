// How every call enters the server: through one door for all RPCs of both
// services, so that what is true of one call is true of all.
//
//  * Requests are parsed here, not by gRPC's default codec. A proto3 string
//    field that is not UTF-8 makes the protobuf parser fail, and gRPC then
//    answers UNIMPLEMENTED with no message; here the call gets
//    INVALID_ARGUMENT naming the field (`spec.feature_map`,
//    `sampling.stop[1]`), and a message that is not protobuf at all says so.
//  * While the server drains, new calls get UNAVAILABLE with the reason;
//    health checks keep answering (NOT_SERVING), so load balancers and
//    Kubernetes probes see the drain rather than a refused connection.
//  * Calls in flight are counted, so a drain waits for them and no longer.
//  * With API keys, a call is admitted only with a key (UNAUTHENTICATED
//    otherwise), and its tenant is in its CallContext before the handler
//    runs (server/call_context.h, server/api_keys.h).
//
// A service derives from EntryPoints<its generated CallbackService> and
// registers every method in its constructor (Unary, Stream, Bidi), which
// replaces the generated handler of that method with one of the entries
// below.
#ifndef LINATTN_SERVER_RPC_ENTRY_H_
#define LINATTN_SERVER_RPC_ENTRY_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/server_interceptor.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "core/util/call_liveness.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "server/api_keys.h"
#include "server/call_context.h"
#include "server/observability.h"
#include "server/rate_limiter.h"
#include "server/status.h"

namespace linattn {

// Why `bytes` do not parse as `type`: INVALID_ARGUMENT naming the first
// string field, at any depth, that is not UTF-8, or saying that the bytes
// are not a `type` message at all. Reads `bytes` without consuming them.
// The call's deadline and cancellation, for core work that must not apply
// a request its caller no longer waits for (core/util/call_liveness.h). The
// context must outlive the work (it does until the call is finished).
CallLiveness LivenessOf(const grpc::ServerContextBase* ctx);

absl::Status DiagnoseUnparsable(const google::protobuf::Descriptor* type,
                                grpc::ByteBuffer* bytes);

// A request as it arrived: the message, or why it could not be read.
template <typename Message>
struct Checked {
  Message message;
  absl::Status status;
};

// The index of `method` in the service `service` ("linattn.v1.X") as the
// generated service registers it. Aborts when there is no such method: a
// mistake in the server's own table, found by the first test that runs.
int MethodIndex(const char* service, const char* method);

// Admission and drain: new calls are refused once a drain begins; calls in
// flight are counted by an interceptor the builder installs.
class CallGate {
 public:
  // The keys calls are checked against (none set: every call is the
  // anonymous tenant). Set before serving; must outlive the gate's use.
  void set_keys(const ApiKeys* keys) { keys_ = keys; }
  const ApiKeys* keys() const { return keys_; }
  // Where finished calls and latencies are reported (null: nowhere). Set
  // before serving.
  void set_observability(Observability* o) { observability_ = o; }
  Observability* observability() const { return observability_; }
  // Tenants' token rates (both front ends charge it).
  TokenRateLimiter& limiter() const { return limiter_; }
  // UNAVAILABLE once Drain() was called.
  absl::Status Admit() const;
  // Admit(), then the call's key: UNAUTHENTICATED without a valid one; the
  // tenant it names goes into the call's CallContext.
  absl::Status Admit(grpc::CallbackServerContext* ctx) const;
  void Drain() { draining_.store(true); }
  bool draining() const { return draining_.load(); }

  // Counts a call of another front end (an HTTP request, its stream
  // included) as in flight until the returned handle and its copies go.
  std::shared_ptr<void> Track();

  // Blocks until no call is in flight or `deadline`; true if idle.
  bool WaitIdle(std::chrono::steady_clock::time_point deadline);
  uint64_t in_flight() const;

  // For ServerBuilder::experimental().SetInterceptorCreators.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
  NewInterceptorFactory();

 private:
  friend class InFlightInterceptor;
  void CallStarted();
  void CallEnded();

  std::atomic<bool> draining_{false};
  const ApiKeys* keys_ = nullptr;
  Observability* observability_ = nullptr;
  mutable TokenRateLimiter limiter_;
  mutable std::mutex mu_;
  std::condition_variable idle_;
  uint64_t in_flight_ = 0;  // guarded by mu_
};

// Adds `retry-after-ms` trailing metadata when `status` is a rate limit's
// refusal (server/rate_limiter.h); call before the call finishes.
void AddRetryHint(grpc::ServerContextBase* ctx, const absl::Status& status);
// Finishes a unary call with `status` (and its retry hint).
grpc::ServerUnaryReactor* FinishCall(grpc::CallbackServerContext* ctx,
                                     const absl::Status& status);

// Notes the request's `session_id` (when it has one) in the call's
// context, for the access log.
void NoteSessionOf(grpc::CallbackServerContext* ctx,
                   const google::protobuf::Message& request);

// A unary method: admission (a key before anything of the request is
// told), the Checked parse, then `handler`.
template <typename Request, typename Response>
grpc::internal::MethodHandler* UnaryEntry(
    const CallGate* gate,
    std::function<grpc::ServerUnaryReactor*(grpc::CallbackServerContext*,
                                            const Request*, Response*)>
        handler) {
  return new grpc::internal::CallbackUnaryHandler<Checked<Request>, Response>(
      [gate, handler = std::move(handler)](
          grpc::CallbackServerContext* ctx, const Checked<Request>* request,
          Response* response) -> grpc::ServerUnaryReactor* {
        absl::Status admitted = gate->Admit(ctx);
        if (admitted.ok()) admitted = request->status;
        if (!admitted.ok()) {
          grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
          reactor->Finish(ToGrpcStatus(admitted));
          return reactor;
        }
        NoteSessionOf(ctx, request->message);
        return handler(ctx, &request->message, response);
      });
}

// A server-streaming method.
template <typename Request, typename Response>
grpc::internal::MethodHandler* StreamEntry(
    const CallGate* gate, std::function<grpc::ServerWriteReactor<Response>*(
                              grpc::CallbackServerContext*, const Request*)>
                              handler) {
  class Refused final : public grpc::ServerWriteReactor<Response> {
   public:
    explicit Refused(const absl::Status& s) { this->Finish(ToGrpcStatus(s)); }
    void OnDone() override { delete this; }
  };
  return new grpc::internal::CallbackServerStreamingHandler<Checked<Request>,
                                                            Response>(
      [gate, handler = std::move(handler)](grpc::CallbackServerContext* ctx,
                                           const Checked<Request>* request)
          -> grpc::ServerWriteReactor<Response>* {
        absl::Status admitted = gate->Admit(ctx);
        if (admitted.ok()) admitted = request->status;
        if (!admitted.ok()) return new Refused(admitted);
        NoteSessionOf(ctx, request->message);
        return handler(ctx, &request->message);
      });
}

// A bidi-streaming method: its reactor reads Checked<Request> and ends the
// stream with a message's status when it could not be read.
template <typename Request, typename Response>
grpc::internal::MethodHandler* BidiEntry(
    const CallGate* gate,
    std::function<grpc::ServerBidiReactor<Checked<Request>, Response>*(
        grpc::CallbackServerContext*)>
        handler) {
  class Refused final
      : public grpc::ServerBidiReactor<Checked<Request>, Response> {
   public:
    explicit Refused(const absl::Status& s) { this->Finish(ToGrpcStatus(s)); }
    void OnDone() override { delete this; }
  };
  return new grpc::internal::CallbackBidiHandler<Checked<Request>, Response>(
      [gate, handler = std::move(handler)](grpc::CallbackServerContext* ctx)
          -> grpc::ServerBidiReactor<Checked<Request>, Response>* {
        if (absl::Status admitted = gate->Admit(ctx); !admitted.ok()) {
          return new Refused(admitted);
        }
        return handler(ctx);
      });
}

// The base of a service implementation: `Generated` is the generated
// CallbackService, whose handlers the derived constructor replaces, method
// by method, with the entries above (Unary, Stream, Bidi).
template <typename Generated>
class EntryPoints : public Generated {
 protected:
  EntryPoints(const char* service, const CallGate* gate)
      : service_(service), gate_(gate) {}

  template <typename Self, typename Request, typename Response>
  void Unary(const char* method,
             grpc::ServerUnaryReactor* (Self::*fn)(grpc::CallbackServerContext*,
                                                   const Request*, Response*)) {
    Self* self = static_cast<Self*>(this);
    Mark(method,
         UnaryEntry<Request, Response>(
             gate_, [self, fn](grpc::CallbackServerContext* ctx,
                               const Request* request, Response* response) {
               return (self->*fn)(ctx, request, response);
             }));
  }

  template <typename Self, typename Request, typename Response>
  void Stream(const char* method,
              grpc::ServerWriteReactor<Response>* (Self::*fn)(
                  grpc::CallbackServerContext*, const Request*)) {
    Self* self = static_cast<Self*>(this);
    Mark(method, StreamEntry<Request, Response>(
                     gate_, [self, fn](grpc::CallbackServerContext* ctx,
                                       const Request* request) {
                       return (self->*fn)(ctx, request);
                     }));
  }

  template <typename Self, typename Request, typename Response>
  void Bidi(const char* method,
            grpc::ServerBidiReactor<Checked<Request>, Response>* (Self::*fn)(
                grpc::CallbackServerContext*)) {
    Self* self = static_cast<Self*>(this);
    Mark(method, BidiEntry<Request, Response>(
                     gate_, [self, fn](grpc::CallbackServerContext* ctx) {
                       return (self->*fn)(ctx);
                     }));
  }

  const CallGate* gate() const { return gate_; }

 private:
  void Mark(const char* method, grpc::internal::MethodHandler* handler) {
    this->MarkMethodCallback(MethodIndex(service_, method), handler);
  }

  const char* const service_;
  const CallGate* const gate_;
};

}  // namespace linattn

namespace grpc {

// Reading a request into Checked<M>: the message when it parses, else the
// reason, and the call goes on to the handler either way (which answers with
// the reason). Only the server reads these.
template <typename M>
class SerializationTraits<linattn::Checked<M>, void> {
 public:
  static Status Deserialize(ByteBuffer* buffer, linattn::Checked<M>* out) {
    if (buffer == nullptr) return Status(StatusCode::INTERNAL, "No payload");
    bool parsed = false;
    {
      ProtoBufferReader reader(buffer);
      if (!reader.status().ok()) return reader.status();
      parsed = out->message.ParseFromZeroCopyStream(&reader);
    }
    out->status = parsed ? absl::OkStatus()
                         : linattn::DiagnoseUnparsable(M::descriptor(), buffer);
    buffer->Clear();
    return Status::OK;
  }
};

}  // namespace grpc

#endif  // LINATTN_SERVER_RPC_ENTRY_H_
