#include "server/rpc_entry.h"

#include <cstdlib>
#include <map>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "core/util/status_macros.h"
#include "core/util/utf8.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "spdlog/spdlog.h"

namespace linattn {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;

// Walks the fields in `in` as fields of `type`: the path of the first string
// field that is not UTF-8 ("" when there is none), or nullopt when the bytes
// are not well-formed protobuf.
std::optional<std::string> FindBadString(const Descriptor* type,
                                         CodedInputStream& in,
                                         const std::string& prefix, int depth) {
  if (depth > 32) return std::nullopt;
  std::map<int, int> seen;  // field number → occurrences (repeated fields)
  while (const uint32_t tag = in.ReadTag()) {
    const int number = static_cast<int>(WireFormatLite::GetTagFieldNumber(tag));
    const FieldDescriptor* field = type->FindFieldByNumber(number);
    const bool delimited = WireFormatLite::GetTagWireType(tag) ==
                           WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
    if (field == nullptr || !delimited ||
        (field->type() != FieldDescriptor::TYPE_STRING &&
         field->type() != FieldDescriptor::TYPE_MESSAGE)) {
      if (!WireFormatLite::SkipField(&in, tag)) return std::nullopt;
      continue;
    }
    const int index = seen[number]++;
    std::string path = absl::StrCat(prefix, field->name());
    if (field->is_repeated()) absl::StrAppend(&path, "[", index, "]");
    uint32_t length = 0;
    if (!in.ReadVarint32(&length)) return std::nullopt;
    if (field->type() == FieldDescriptor::TYPE_STRING) {
      std::string value;
      if (!in.ReadString(&value, static_cast<int>(length))) return std::nullopt;
      if (!IsValidUtf8(value)) return path;
      continue;
    }
    const CodedInputStream::Limit limit =
        in.PushLimit(static_cast<int>(length));
    std::optional<std::string> inner =
        FindBadString(field->message_type(), in, path + ".", depth + 1);
    if (!inner || !inner->empty()) return inner;
    if (!in.ConsumedEntireMessage()) return std::nullopt;
    in.PopLimit(limit);
  }
  if (!in.ConsumedEntireMessage()) return std::nullopt;
  return std::string();
}

}  // namespace

CallLiveness LivenessOf(const grpc::ServerContextBase* ctx) {
  using Steady = std::chrono::steady_clock;
  using System = std::chrono::system_clock;
  Steady::time_point deadline = Steady::time_point::max();
  const System::time_point wall = ctx->deadline();
  if (wall != System::time_point::max()) {
    const auto left =
        std::chrono::duration_cast<Steady::duration>(wall - System::now());
    deadline = Steady::now() + left;
  }
  return CallLiveness(deadline, [ctx] { return ctx->IsCancelled(); });
}

absl::Status DiagnoseUnparsable(const Descriptor* type,
                                grpc::ByteBuffer* bytes) {
  std::optional<std::string> bad;
  {
    grpc::ProtoBufferReader reader(bytes);
    CodedInputStream in(&reader);
    in.SetRecursionLimit(64);
    bad = FindBadString(type, in, "", 0);
  }
  if (bad && !bad->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(*bad, ": not valid UTF-8 (string fields must be)"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("request: not a valid ", type->full_name(), " message"));
}

int MethodIndex(const char* service, const char* method) {
  const google::protobuf::ServiceDescriptor* s =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          service);
  const google::protobuf::MethodDescriptor* m =
      s == nullptr ? nullptr : s->FindMethodByName(method);
  if (m == nullptr) {
    spdlog::critical("no method {}.{} in the generated services", service,
                     method);
    std::abort();
  }
  return m->index();
}

absl::Status CallGate::Admit() const {
  if (draining_.load()) {
    return absl::UnavailableError(
        "the server is shutting down (draining); retry on another replica "
        "or after it restarts");
  }
  return absl::OkStatus();
}

absl::Status CallGate::Admit(grpc::CallbackServerContext* ctx) const {
  LINATTN_RETURN_IF_ERROR(Admit());
  CallContext& call = ContextOf(ctx);
  if (keys_ == nullptr || !keys_->enabled()) {
    call.authenticated = true;
    return absl::OkStatus();
  }
  // gRPC keeps metadata keys lowercase; a call may carry one value.
  const auto& metadata = ctx->client_metadata();
  auto it = metadata.find("authorization");
  const absl::string_view value =
      it == metadata.end()
          ? absl::string_view()
          : absl::string_view(it->second.data(), it->second.size());
  LINATTN_ASSIGN_OR_RETURN(call.tenant, keys_->Authenticate(value));
  call.authenticated = true;
  return absl::OkStatus();
}

void AddRetryHint(grpc::ServerContextBase* ctx, const absl::Status& status) {
  if (const std::optional<int64_t> ms = RetryAfterMs(status)) {
    ctx->AddTrailingMetadata("retry-after-ms", absl::StrCat(*ms));
  }
}

grpc::ServerUnaryReactor* FinishCall(grpc::CallbackServerContext* ctx,
                                     const absl::Status& status) {
  AddRetryHint(ctx, status);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

void NoteSessionOf(grpc::CallbackServerContext* ctx,
                   const google::protobuf::Message& request) {
  const google::protobuf::FieldDescriptor* field =
      request.GetDescriptor()->FindFieldByName("session_id");
  if (field == nullptr ||
      field->type() != google::protobuf::FieldDescriptor::TYPE_STRING ||
      field->is_repeated()) {
    return;
  }
  ContextOf(ctx).NoteSession(
      request.GetReflection()->GetString(request, field));
}

void CallGate::CallStarted() {
  std::lock_guard<std::mutex> lock(mu_);
  ++in_flight_;
}

void CallGate::CallEnded() {
  std::lock_guard<std::mutex> lock(mu_);
  if (--in_flight_ == 0) idle_.notify_all();
}

std::shared_ptr<void> CallGate::Track() {
  CallStarted();
  return std::shared_ptr<void>(this, [](CallGate* gate) { gate->CallEnded(); });
}

uint64_t CallGate::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_flight_;
}

bool CallGate::WaitIdle(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_.wait_until(lock, deadline, [this] { return in_flight_ == 0; });
}

// Lives exactly as long as its call: created when the call starts, deleted
// when it is done. Counts the call in flight, and reports it when its
// status goes out (what the handlers noted in its CallContext: tenant,
// session, tokens).
class InFlightInterceptor final : public grpc::experimental::Interceptor {
 public:
  InFlightInterceptor(CallGate* gate, grpc::experimental::ServerRpcInfo* info)
      : gate_(gate), info_(info) {
    gate_->CallStarted();
  }
  ~InFlightInterceptor() override {
    // A call that ends without a status sent (its client went first).
    if (!reported_) Report(grpc::StatusCode::CANCELLED, nullptr);
    gate_->CallEnded();
  }
  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    if (gate_->observability() != nullptr &&
        methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      Report(methods->GetSendStatus().error_code(),
             static_cast<CallContext*>(info_->server_context()));
    }
    methods->Proceed();
  }

 private:
  void Report(grpc::StatusCode code, const CallContext* call) {
    Observability* o = gate_->observability();
    if (o == nullptr || reported_) return;
    reported_ = true;
    CallRecord r;
    r.protocol = "grpc";
    absl::string_view method = info_->method();  // "/pkg.Service/Method"
    absl::ConsumePrefix(&method, "/");
    r.method = std::string(method);
    const size_t slash = method.find('/');
    absl::string_view service = method.substr(0, slash);
    const size_t dot = service.rfind('.');
    r.service_label = std::string(
        dot == absl::string_view::npos ? service : service.substr(dot + 1));
    r.method_label = slash == absl::string_view::npos
                         ? std::string(method)
                         : std::string(method.substr(slash + 1));
    r.code = static_cast<int>(code);
    r.status = std::string(
        absl::StatusCodeToString(static_cast<absl::StatusCode>(code)));
    r.failed = code != grpc::StatusCode::OK;
    r.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_)
            .count();
    if (call != nullptr) {
      r.session = call->session();
      r.tenant = call->tenant.name();
      r.tokens_in = call->tokens_in.load(std::memory_order_relaxed);
      r.tokens_out = call->tokens_out.load(std::memory_order_relaxed);
      r.peer = call->peer();
    }
    o->CallEnded(r);
  }

  CallGate* const gate_;
  grpc::experimental::ServerRpcInfo* const info_;
  const std::chrono::steady_clock::time_point start_ =
      std::chrono::steady_clock::now();
  bool reported_ = false;
};

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
CallGate::NewInterceptorFactory() {
  class Factory final
      : public grpc::experimental::ServerInterceptorFactoryInterface {
   public:
    explicit Factory(CallGate* gate) : gate_(gate) {}
    grpc::experimental::Interceptor* CreateServerInterceptor(
        grpc::experimental::ServerRpcInfo* info) override {
      // The services' calls; health checks and reflection are not work.
      const absl::string_view method = info->method();
      if (!absl::StartsWith(method, "/linattn.")) return nullptr;
      return new InFlightInterceptor(gate_, info);
    }

   private:
    CallGate* const gate_;
  };
  return std::make_unique<Factory>(this);
}

}  // namespace linattn
