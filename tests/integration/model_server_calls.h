// What the model-type server tests share: a fixture model's greedy
// continuation computed in this process, and the same asked of a server
// through GenerationService.
#ifndef LINATTN_TESTS_INTEGRATION_MODEL_SERVER_CALLS_H_
#define LINATTN_TESTS_INTEGRATION_MODEL_SERVER_CALLS_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/model/forward.h"
#include "core/model/model.h"
#include "linattn/v1/generation.grpc.pb.h"
#include "tests/integration/server_process.h"
#include "tests/model/fixtures.h"

namespace linattn::testing {

inline std::string FixtureDir(const std::string& name) {
  return FixtureRoot() + "/" + name;
}

// A byte-level model's own greedy continuation of `context` (n tokens, or
// fewer when it says eos), in this process.
inline std::vector<int32_t> LocalGreedy(
    const std::shared_ptr<const Model>& model, const std::string& context,
    int n) {
  ForwardRunner runner(model);
  ModelState state = model->NewState();
  std::vector<float> logits(model->config().vocab_size);
  const std::vector<int32_t> ids(context.begin(), context.end());
  EXPECT_TRUE(runner.Run(state, ids, logits.data()).ok());
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const int32_t t = static_cast<int32_t>(
        std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(t);
    if (model->config().eos_token_id == t) break;
    EXPECT_TRUE(
        runner.Run(state, std::span<const int32_t>(&t, 1), logits.data()).ok());
  }
  return out;
}

inline std::vector<int32_t> LocalGreedy(const std::string& fixture,
                                        const std::string& context, int n) {
  return LocalGreedy(Model::Load(FixtureDir(fixture)).value(), context, n);
}

struct Streamed {
  std::vector<int32_t> ids;
  std::string text;
  uint64_t last_position = 0;  // of the last message read
  grpc::Status status;
};

// A greedy Generate of `n` tokens after `prompt`, read to its end; with
// `cancel_after`, the call is cancelled once that many messages were read.
inline Streamed GenerateGreedy(v1::GenerationService::Stub& stub,
                               const std::string& id, const std::string& prompt,
                               int n, int cancel_after = -1) {
  grpc::ClientContext ctx;
  v1::GenerateRequest req;
  req.set_session_id(id);
  req.set_prompt(prompt);
  req.mutable_sampling()->set_max_tokens(n);
  auto reader = stub.Generate(&ctx, req);
  Streamed out;
  int read = 0;
  for (v1::GenerateResponse r; reader->Read(&r);) {
    if (r.token_id() >= 0) out.ids.push_back(r.token_id());
    out.text += r.text();
    out.last_position = r.position();
    if (++read == cancel_after) ctx.TryCancel();
  }
  out.status = reader->Finish();
  return out;
}

// Calls of GenerationService with their request built here.
inline grpc::Status CreateSession(v1::GenerationService::Stub& stub,
                                  const std::string& model,
                                  v1::ModelSession* out,
                                  const std::string& id = "") {
  grpc::ClientContext ctx;
  v1::CreateModelSessionRequest req;
  req.set_model(model);
  req.set_session_id(id);
  return stub.CreateSession(&ctx, req, out);
}

inline grpc::Status Append(v1::GenerationService::Stub& stub,
                           const std::string& id, const std::string& text,
                           v1::ModelSession* out) {
  grpc::ClientContext ctx;
  v1::AppendRequest req;
  req.set_session_id(id);
  req.set_text(text);
  return stub.Append(&ctx, req, out);
}

inline grpc::Status Fork(v1::GenerationService::Stub& stub,
                         const std::string& id, v1::ModelSession* out) {
  grpc::ClientContext ctx;
  v1::ForkModelSessionRequest req;
  req.set_session_id(id);
  return stub.Fork(&ctx, req, out);
}

inline v1::ModelSession Get(v1::GenerationService::Stub& stub,
                            const std::string& id) {
  grpc::ClientContext ctx;
  v1::GetModelSessionRequest req;
  req.set_session_id(id);
  v1::ModelSession s;
  EXPECT_TRUE(stub.GetSession(&ctx, req, &s).ok());
  return s;
}

// After `context` is appended to session `id` (of fixture `model`), the
// session, a fork of it and a restored snapshot of it hold the same state
// and continue with the model's own greedy tokens.
inline void ExpectForkAndRestoreContinueAlike(v1::GenerationService::Stub& stub,
                                              const std::string& model,
                                              const std::string& id,
                                              const std::string& context) {
  v1::ModelSession appended;
  ASSERT_TRUE(Append(stub, id, context, &appended).ok());
  v1::ModelSession fork;
  ASSERT_TRUE(Fork(stub, id, &fork).ok());
  EXPECT_EQ(fork.state_bytes(), appended.state_bytes());
  std::string blob;
  {
    grpc::ClientContext ctx;
    v1::SnapshotModelSessionRequest req;
    req.set_session_id(id);
    v1::SnapshotModelSessionResponse resp;
    ASSERT_TRUE(stub.Snapshot(&ctx, req, &resp).ok());
    blob = resp.state();
  }
  v1::ModelSession restored;
  {
    grpc::ClientContext ctx;
    v1::RestoreModelSessionRequest req;
    req.set_state(blob);
    ASSERT_TRUE(stub.Restore(&ctx, req, &restored).ok());
  }
  EXPECT_EQ(restored.position(), context.size());
  EXPECT_EQ(restored.state_bytes(), appended.state_bytes());
  const auto expected = LocalGreedy(model, context, 8);
  EXPECT_EQ(GenerateGreedy(stub, id, "", 8).ids, expected);
  EXPECT_EQ(GenerateGreedy(stub, fork.session_id(), "", 8).ids, expected);
  EXPECT_EQ(GenerateGreedy(stub, restored.session_id(), "", 8).ids, expected);
}

// A suite whose tests share one server of the fixtures Models::kNames
// (each a --model), with a GenerationService stub per test.
template <class Models>
class FixtureServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::vector<std::string> args;
    for (const char* name : Models::kNames) {
      args.push_back("--model");
      args.push_back(FixtureDir(name));
    }
    server_ = ServerProcess::Start(args).release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(server_, nullptr);
    stub_ = v1::GenerationService::NewStub(server_->Channel());
  }
  // A new session of `model`.
  std::string Create(const std::string& model) {
    grpc::ClientContext ctx;
    v1::CreateModelSessionRequest req;
    req.set_model(model);
    v1::ModelSession s;
    EXPECT_TRUE(stub_->CreateSession(&ctx, req, &s).ok());
    return s.session_id();
  }

  static inline ServerProcess* server_ = nullptr;
  std::unique_ptr<v1::GenerationService::Stub> stub_;
};

}  // namespace linattn::testing

#endif  // LINATTN_TESTS_INTEGRATION_MODEL_SERVER_CALLS_H_
