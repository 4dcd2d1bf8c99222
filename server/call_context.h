// CallContext: the context of every gRPC call of the services, a
// CallbackServerContext that also carries what the server learns about the
// call as it runs — the tenant its key names (set at admission,
// server/rpc_entry.h), the session it is about and the tokens it brought
// and took, which the access log and metrics report when it ends
// (server/observability.h). The builder's context allocator makes every
// callback call's context one of these.
#ifndef LINATTN_SERVER_CALL_CONTEXT_H_
#define LINATTN_SERVER_CALL_CONTEXT_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>

#include "core/session/tenant.h"

namespace linattn {

class CallContext final : public grpc::CallbackServerContext {
 public:
  const std::chrono::steady_clock::time_point start =
      std::chrono::steady_clock::now();

  // Set once at admission, before the handler runs; read-only after.
  Tenant tenant;
  bool authenticated = false;

  // The session the call is about (the first one named; "" for none).
  void NoteSession(const std::string& id) {
    if (id.empty()) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (session_.empty()) session_ = id;
  }
  std::string session() const {
    std::lock_guard<std::mutex> lock(mu_);
    return session_;
  }
  // Tokens the call brought (prompt, prefill, decode steps) and returned.
  std::atomic<uint64_t> tokens_in{0};
  std::atomic<uint64_t> tokens_out{0};

 private:
  mutable std::mutex mu_;
  std::string session_;
};

// The context of a call of this server (every callback context is one).
inline CallContext& ContextOf(grpc::CallbackServerContext* ctx) {
  return *static_cast<CallContext*>(ctx);
}
inline const Tenant& TenantOf(grpc::CallbackServerContext* ctx) {
  return ContextOf(ctx).tenant;
}

class CallContextAllocator final : public grpc::ContextAllocator {
 public:
  grpc::CallbackServerContext* NewCallbackServerContext() override {
    return new CallContext();
  }
  void Release(grpc::CallbackServerContext* ctx) override {
    delete static_cast<CallContext*>(ctx);
  }
};

}  // namespace linattn

#endif  // LINATTN_SERVER_CALL_CONTEXT_H_
