// AttentionService requests, as any client could send them, to a real
// server in this process: every one ends with a code that names what was
// wrong (requests_fuzz.h), and the server stays up. Sessions "s1" and "s2"
// exist from the start, so inputs that name them reach the state.
#include <cstddef>
#include <cstdint>
#include <cstdio>

#include "linattn/v1/attention.pb.h"
#include "tests/fuzz/requests_fuzz.h"

namespace {

const char* const kMethods[] = {"CreateSession", "GetSession", "ListSessions",
                                "DeleteSession", "Prefill",    "Inspect",
                                "Snapshot",      "Restore",    "Fork"};

linattn::LinattnServer& Ready() {
  static linattn::LinattnServer& server = []() -> linattn::LinattnServer& {
    linattn::LinattnServer& s = linattn::fuzz::Server({});
    for (const char* id : {"s1", "s2"}) {
      linattn::v1::CreateSessionRequest create;
      create.set_session_id(id);
      create.mutable_spec()->set_num_heads(2);
      create.mutable_spec()->set_key_dim(3);
      create.mutable_spec()->set_value_dim(2);
      linattn::fuzz::RawCall(s, "/linattn.v1.AttentionService/CreateSession",
                             create.SerializeAsString());
    }
    return s;
  }();
  return server;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  linattn::LinattnServer& server = Ready();
  const char* method = kMethods[data[0] % std::size(kMethods)];
  const std::string payload(reinterpret_cast<const char*>(data) + 1, size - 1);
  const grpc::Status s = linattn::fuzz::RawCall(
      server, std::string("/linattn.v1.AttentionService/") + method, payload);
  if (!linattn::fuzz::Expected(s)) {
    std::fprintf(stderr, "%s answered %d: %s\n", method, s.error_code(),
                 s.error_message().c_str());
    std::abort();
  }
  // Sessions created by the inputs are removed again, so that the table
  // does not fill up and hide later inputs behind RESOURCE_EXHAUSTED.
  for (const auto& session :
       server.sessions().List(linattn::SessionKind::kAttention)) {
    if (session->id() != "s1" && session->id() != "s2") {
      server.sessions()
          .Delete(session->id(), linattn::SessionKind::kAttention)
          .IgnoreError();
    }
  }
  return 0;
}
