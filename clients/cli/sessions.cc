#include "clients/cli/sessions.h"

#include <grpcpp/grpcpp.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "clients/cli/remote.h"
#include "linattn/v1/attention.grpc.pb.h"
#include "linattn/v1/generation.grpc.pb.h"
#include "nlohmann/json.hpp"

namespace linattn {
namespace {

constexpr std::chrono::seconds kCallTimeout(10);

// `session_id`: the session the call names (routing metadata).
std::unique_ptr<grpc::ClientContext> Context(
    const std::string& session_id = "") {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + kCallTimeout);
  NameSession(*ctx, session_id);
  return ctx;
}

std::string DescribeSpec(const v1::AttentionSpec& s) {
  return absl::StrCat(s.num_heads(), " heads, d_k ", s.key_dim(), ", d_v ",
                      s.value_dim(), ", ", s.feature_map(),
                      s.unnormalized() ? ", unnormalized" : "");
}

}  // namespace

absl::Status ListSessions(const std::string& server, bool json,
                          std::ostream& out,
                          const ConnectionOptions& connection) {
  auto channel = OpenChannel(server, connection);
  auto attention = v1::AttentionService::NewStub(channel);
  auto generation = v1::GenerationService::NewStub(channel);
  v1::ListSessionsResponse a;
  if (absl::Status s =
          FromGrpcStatus(attention->ListSessions(Context().get(), {}, &a));
      !s.ok()) {
    return s;
  }
  v1::ListModelSessionsResponse g;
  if (absl::Status s =
          FromGrpcStatus(generation->ListSessions(Context().get(), {}, &g));
      !s.ok()) {
    return s;
  }
  if (json) {
    nlohmann::json list = nlohmann::json::array();
    for (const v1::Session& s : a.sessions()) {
      list.push_back({{"session_id", s.session_id()},
                      {"service", "attention"},
                      {"position", s.position()},
                      {"state_bytes", s.state_bytes()},
                      {"spec", DescribeSpec(s.spec())}});
    }
    for (const v1::ModelSession& s : g.sessions()) {
      list.push_back({{"session_id", s.session_id()},
                      {"service", "generation"},
                      {"position", s.position()},
                      {"state_bytes", s.state_bytes()},
                      {"model", s.model()}});
    }
    out << list.dump(2) << "\n";
    return absl::OkStatus();
  }
  for (const v1::Session& s : a.sessions()) {
    out << absl::StrFormat("%-34s attention   position %-10d %10d B  %s\n",
                           s.session_id(), s.position(), s.state_bytes(),
                           DescribeSpec(s.spec()));
  }
  for (const v1::ModelSession& s : g.sessions()) {
    out << absl::StrFormat(
        "%-34s generation  position %-10d %10d B  model %s\n", s.session_id(),
        s.position(), s.state_bytes(), s.model());
  }
  if (a.sessions_size() + g.sessions_size() == 0) out << "no sessions\n";
  return absl::OkStatus();
}

absl::Status DeleteSessions(const std::string& server,
                            const std::vector<std::string>& ids,
                            std::ostream& out,
                            const ConnectionOptions& connection) {
  auto channel = OpenChannel(server, connection);
  auto attention = v1::AttentionService::NewStub(channel);
  auto generation = v1::GenerationService::NewStub(channel);
  absl::Status first;
  for (const std::string& id : ids) {
    v1::DeleteSessionRequest a;
    a.set_session_id(id);
    v1::DeleteSessionResponse a_resp;
    absl::Status s =
        FromGrpcStatus(attention->DeleteSession(Context(id).get(), a, &a_resp));
    if (s.code() == absl::StatusCode::kNotFound) {
      v1::DeleteModelSessionRequest g;
      g.set_session_id(id);
      v1::DeleteModelSessionResponse g_resp;
      s = FromGrpcStatus(
          generation->DeleteSession(Context(id).get(), g, &g_resp));
      if (s.code() == absl::StatusCode::kNotFound) {
        s = absl::NotFoundError(
            absl::StrCat("no session '", id, "' on either service"));
      }
    }
    if (s.ok()) {
      out << "deleted " << id << "\n";
    } else if (first.ok()) {
      first = s;
    }
  }
  return first;
}

}  // namespace linattn
