// Shared by the request fuzzers: one linattn-server, started in this
// process on 127.0.0.1 (an ephemeral port) with small limits, and raw calls
// to it. Each input's first byte picks the method; the rest is the request
// message as the client sent it, parseable or not, so the whole path is
// exercised: the checked parse, admission, validation and the work itself.
#ifndef LINATTN_TESTS_FUZZ_REQUESTS_FUZZ_H_
#define LINATTN_TESTS_FUZZ_REQUESTS_FUZZ_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/client_unary_call.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "server/server.h"
#include "spdlog/spdlog.h"

namespace linattn::fuzz {

inline LinattnServer& Server(const std::vector<std::string>& models) {
  static LinattnServer* server = [&] {
    spdlog::set_level(spdlog::level::off);
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.models = models;
    options.sessions.max_sessions = 64;
    options.sessions.max_state_bytes = 64 << 20;
    options.max_message_bytes = 4 << 20;
    options.idle_ttl = std::chrono::milliseconds(0);
    auto started = LinattnServer::Start(options);
    if (!started.ok()) {
      std::fprintf(stderr, "the server did not start: %s\n",
                   std::string(started.status().message()).c_str());
      std::abort();
    }
    return started->release();  // lives as long as the process
  }();
  return *server;
}

inline std::shared_ptr<grpc::Channel> Channel(LinattnServer& server) {
  static std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  return channel;
}

// One unary call of `method` with `payload` as the request's bytes.
inline grpc::Status RawCall(LinattnServer& server, const std::string& method,
                            const std::string& payload) {
  grpc::Slice slice(payload);
  grpc::ByteBuffer request(&slice, 1), response;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto channel = Channel(server);
  return grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      channel.get(),
      grpc::internal::RpcMethod(method.c_str(),
                                grpc::internal::RpcMethod::NORMAL_RPC),
      &ctx, request, &response);
}

// Codes a request may end with; anything else (UNKNOWN, UNIMPLEMENTED,
// INTERNAL, DATA_LOSS of a request, a deadline) is a defect.
inline bool Expected(const grpc::Status& s) {
  switch (s.error_code()) {
    case grpc::StatusCode::OK:
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::ALREADY_EXISTS:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::OUT_OF_RANGE:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::DATA_LOSS:  // a snapshot whose checksum fails
      return !s.error_message().empty() || s.ok();
    default:
      return false;
  }
}

}  // namespace linattn::fuzz

#endif  // LINATTN_TESTS_FUZZ_REQUESTS_FUZZ_H_
