// GenerationService requests, as any client could send them, to a real
// server in this process serving the built-in model's weights: every one
// ends with a code that names what was wrong (requests_fuzz.h), and the
// server stays up. Session "m" exists from the start. Generate requests that
// parse run with at most 4 tokens, so that each input stays quick.
//
// The model is served without its tokenizer.model, so with the byte
// tokenizer (the same ids, text read as bytes): the SentencePiece module is
// loaded with RTLD_DEEPBIND beside gRPC's protobuf, which the sanitizer
// runtimes refuse. tokenizer_fuzz fuzzes SentencePiece in a process without
// protobuf.
#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>

#include "linattn/v1/generation.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tests/fuzz/requests_fuzz.h"

namespace {

const char* const kMethods[] = {
    "CreateSession", "GetSession", "ListSessions",  "Append",     "Fork",
    "Snapshot",      "Restore",    "DeleteSession", "ListModels", "Generate"};

// A directory "tiny" with the built-in model's weights (linked) and its
// config.json saying its tokens are bytes (no SentencePiece module needed);
// removed when the process exits.
class WeightsOnly {
 public:
  WeightsOnly() {
    char dir[] = "/tmp/linattn_fuzz_XXXXXX";
    if (mkdtemp(dir) == nullptr) std::abort();
    root_ = dir;
    const std::filesystem::path from(LINATTN_BUILTIN_MODEL_DIR);
    std::filesystem::create_directory(root_ / "tiny");
    std::filesystem::create_symlink(
        std::filesystem::absolute(from / "model.safetensors"),
        root_ / "tiny" / "model.safetensors");
    std::ifstream in(from / "config.json");
    nlohmann::json config = nlohmann::json::parse(in);
    config["linattn_tokenizer"] = "bytes";
    std::ofstream(root_ / "tiny" / "config.json") << config.dump();
  }
  ~WeightsOnly() {
    std::error_code ignored;
    std::filesystem::remove_all(root_, ignored);
  }
  std::string path() const { return (root_ / "tiny").string(); }

 private:
  std::filesystem::path root_;
};

linattn::LinattnServer& Ready() {
  static WeightsOnly model;
  static linattn::LinattnServer& server = []() -> linattn::LinattnServer& {
    linattn::LinattnServer& s = linattn::fuzz::Server({model.path()});
    linattn::v1::CreateModelSessionRequest create;
    create.set_session_id("m");
    linattn::fuzz::RawCall(s, "/linattn.v1.GenerationService/CreateSession",
                           create.SerializeAsString());
    return s;
  }();
  return server;
}

grpc::Status Generate(linattn::LinattnServer& server,
                      const std::string& payload) {
  linattn::v1::GenerateRequest request;
  if (!request.ParseFromString(payload)) return grpc::Status::OK;
  linattn::v1::SamplingParams& sampling = *request.mutable_sampling();
  if (sampling.max_tokens() > 4 || sampling.max_tokens() == 0) {
    sampling.set_max_tokens(4);
  }
  auto stub =
      linattn::v1::GenerationService::NewStub(linattn::fuzz::Channel(server));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto reader = stub->Generate(&ctx, request);
  linattn::v1::GenerateResponse response;
  while (reader->Read(&response)) {
  }
  return reader->Finish();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  linattn::LinattnServer& server = Ready();
  const std::string method = kMethods[data[0] % std::size(kMethods)];
  const std::string payload(reinterpret_cast<const char*>(data) + 1, size - 1);
  const grpc::Status s =
      method == "Generate"
          ? Generate(server, payload)
          : linattn::fuzz::RawCall(
                server, "/linattn.v1.GenerationService/" + method, payload);
  if (!linattn::fuzz::Expected(s)) {
    std::fprintf(stderr, "%s answered %d: %s\n", method.c_str(), s.error_code(),
                 s.error_message().c_str());
    std::abort();
  }
  // Sessions created by the inputs are removed again (and "m" made anew if
  // an input deleted it), so that the table does not fill up.
  linattn::GenerationEngine& engine = server.generation();
  for (const auto& info : engine.ListSessions()) {
    if (info.session_id == "m") continue;
    std::promise<void> deleted;
    engine.Delete(info.session_id, [&](absl::Status) { deleted.set_value(); });
    deleted.get_future().wait();
  }
  if (!engine.GetSession("m").ok()) engine.CreateSession("", "m").IgnoreError();
  return 0;
}
