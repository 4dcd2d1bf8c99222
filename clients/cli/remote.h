// A client of linattn-server's AttentionService for the command-line tools:
// sessions, Prefill, a Decode stream, Inspect, and the standard health check.
// Every call returns an absl::Status carrying the server's code and message.
#ifndef LINATTN_CLIENTS_CLI_REMOTE_H_
#define LINATTN_CLIENTS_CLI_REMOTE_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "clients/common/connection.h"
#include "core/attention/attention.h"
#include "linattn/v1/attention.grpc.pb.h"

namespace linattn {

absl::Status FromGrpcStatus(const grpc::Status& status);

// Ends a streaming call after a Read that returned false. Read fails both
// when the stream has ended (the status has then arrived, and `finish`
// returns at once) and when a message could not be parsed (the server is
// still sending, and `finish` would wait for ever). A call that has not
// finished within `grace` is cancelled and reported as DATA_LOSS.
absl::Status FinishAfterFailedRead(
    grpc::ClientContext& ctx, const std::function<grpc::Status()>& finish,
    std::chrono::milliseconds grace = std::chrono::milliseconds(2000));

// The metadata naming the session a call is about: a proxy in front of
// several replicas routes by it (deploy/), so every call that names a
// session carries it.
inline constexpr char kSessionIdMetadata[] = "x-session-id";
void NameSession(grpc::ClientContext& ctx, const std::string& session_id);
// An id for a new session, chosen by the client (128 random bits as 32 hex
// digits, the form the server's own ids take), so that the create is routed
// by its session's id like every later call.
std::string NewSessionId();

class RemoteAttention {
 public:
  // A channel to `address` (host:port) as `connection` says (plaintext by
  // default; see clients/common/connection.h); connects lazily.
  explicit RemoteAttention(const std::string& address,
                           const ConnectionOptions& connection = {});

  // `epsilon` unset = the server's default; `session_id` empty = one chosen
  // here (NewSessionId).
  absl::StatusOr<v1::Session> CreateSession(const AttentionSpec& spec,
                                            std::optional<float> epsilon,
                                            const std::string& session_id = "");
  absl::Status DeleteSession(const std::string& session_id);
  // A new session (its id chosen here) with a copy of `session_id`'s state
  // and position.
  absl::StatusOr<v1::Session> Fork(const std::string& session_id);
  absl::StatusOr<v1::InspectResponse> Inspect(const std::string& session_id);
  absl::StatusOr<v1::Session> GetSession(const std::string& session_id);
  // The session's snapshot blob (core/session/snapshot.h).
  absl::StatusOr<std::string> Snapshot(const std::string& session_id);

  // All of `in` through Prefill, in requests of at most `max_tokens` tokens.
  absl::Status Prefill(const std::string& session_id, const AttentionSpec& spec,
                       const SequenceInput& in, const SequenceOutput& out,
                       uint64_t max_tokens);
  // All of `in` through one Decode stream, one token per message.
  absl::Status Decode(const std::string& session_id, const AttentionSpec& spec,
                      const SequenceInput& in, const SequenceOutput& out);

  // grpc.health.v1 Check of `service` ("" = the server); true if SERVING.
  absl::StatusOr<bool> Healthy(const std::string& service,
                               std::chrono::milliseconds timeout);

  v1::AttentionService::Stub& stub() { return *stub_; }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::AttentionService::Stub> stub_;
};

}  // namespace linattn

#endif  // LINATTN_CLIENTS_CLI_REMOTE_H_
