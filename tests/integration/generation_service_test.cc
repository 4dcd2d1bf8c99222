// GenerationService against a real linattn-server process serving the
// built-in model, compared with the same model run in this process; the
// `linattn generate` command; and servers given broken model directories.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <thread>

#include "clients/cli/generate.h"
#include "clients/cli/remote.h"
#include "core/scheduler/generation.h"
#include "linattn/v1/generation.grpc.pb.h"
#include "tests/integration/server_process.h"
#include "tests/model/test_model.h"
#include "tests/util/temp_dir.h"

namespace linattn {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<const Model> BuiltinModel() {
  static std::shared_ptr<const Model> model =
      Model::Load(LINATTN_BUILTIN_MODEL_DIR).value();
  return model;
}

// What the engine gives in this process for `params` (the built-in model,
// its projections packed as `weights`).
std::string LocalWith(const std::string& prompt, SamplingParams params,
                      WeightType weights = WeightType::kF32) {
  std::shared_ptr<const Model> model = BuiltinModel();
  if (weights != WeightType::kF32) {
    model = Model::Load(LINATTN_BUILTIN_MODEL_DIR, "", weights).value();
  }
  GenerationEngine engine({model});
  auto s = engine.CreateSession("", "").value();
  std::promise<std::string> text;
  std::string acc;
  engine.Generate(s.session_id, model->tokenizer().Encode(prompt).value(),
                  params, [&](const GenerateEvent& e) {
                    acc += e.text;
                    if (e.finished) text.set_value(acc);
                  });
  return text.get_future().get();
}

// How many tokens the built-in model's tokenizer makes of `text`.
uint64_t TokenCount(const std::string& text) {
  return BuiltinModel()->tokenizer().Encode(text).value().size();
}

// What the model itself gives, greedy, in this process.
std::string LocalGreedy(const std::string& prompt, uint32_t max_tokens,
                        WeightType weights = WeightType::kF32) {
  return LocalWith(prompt, SamplingParams{.max_tokens = max_tokens}, weights);
}

class GenerationServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ =
        testing::ServerProcess::Start({"--model", LINATTN_BUILTIN_MODEL_DIR});
    ASSERT_NE(server_, nullptr);
    stub_ = v1::GenerationService::NewStub(server_->Channel());
  }

  v1::ModelSession Create(const std::string& id = "") {
    grpc::ClientContext ctx;
    v1::CreateModelSessionRequest req;
    req.set_session_id(id);
    v1::ModelSession s;
    EXPECT_TRUE(stub_->CreateSession(&ctx, req, &s).ok());
    return s;
  }

  struct Streamed {
    std::string text;
    std::vector<v1::GenerateResponse> messages;
    grpc::Status status;
  };
  Streamed Generate(const std::string& id, const std::string& prompt,
                    uint32_t max_tokens, int cancel_after = -1) {
    grpc::ClientContext ctx;
    v1::GenerateRequest req;
    req.set_session_id(id);
    req.set_prompt(prompt);
    req.mutable_sampling()->set_max_tokens(max_tokens);
    auto reader = stub_->Generate(&ctx, req);
    Streamed out;
    v1::GenerateResponse r;
    while (reader->Read(&r)) {
      out.text += r.text();
      out.messages.push_back(r);
      if (static_cast<int>(out.messages.size()) == cancel_after) {
        ctx.TryCancel();
      }
    }
    out.status = reader->Finish();
    return out;
  }

  std::unique_ptr<testing::ServerProcess> server_;
  std::unique_ptr<v1::GenerationService::Stub> stub_;
};

TEST_F(GenerationServiceTest, ListModelsDescribesTheBuiltinModel) {
  grpc::ClientContext ctx;
  v1::ListModelsResponse resp;
  ASSERT_TRUE(stub_->ListModels(&ctx, {}, &resp).ok());
  ASSERT_EQ(resp.models_size(), 1);
  const v1::ModelInfo& m = resp.models(0);
  EXPECT_EQ(m.name(), "tiny");
  EXPECT_EQ(m.model_type(), "gated_deltanet");
  EXPECT_EQ(m.update_rule(), "gated_delta");
  EXPECT_EQ(m.feature_map(), "");
  EXPECT_EQ(m.tokenizer(), "sentencepiece");
  EXPECT_EQ(m.vocab_size(), 4096u);
  // Per layer: 4 heads × 64·64 floats of S, and the last 3 inputs of the
  // q, k and v convolutions (256 channels each).
  EXPECT_EQ(m.conv_window_floats(), 3u * 3 * 256);
  EXPECT_EQ(m.state_bytes(), 4u * (4 * 64 * 64 + 3 * 3 * 256) * 4);
  EXPECT_EQ(m.fingerprint().size(), 16u);
}

TEST_F(GenerationServiceTest, StreamedTextIsWhatTheModelGivesLocally) {
  const std::string prompt = "And the LORD spake unto Moses, saying,";
  const auto s = Create();
  const Streamed g = Generate(s.session_id(), prompt, 40);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.text, LocalGreedy(prompt, 40));
  ASSERT_EQ(g.messages.size(), 40u);  // one message per token
  EXPECT_EQ(g.messages.back().finish_reason(), "length");
  EXPECT_EQ(g.messages.back().usage().prompt_tokens(), TokenCount(prompt));
  EXPECT_EQ(g.messages.back().usage().completion_tokens(), 40u);
  EXPECT_EQ(g.messages.back().position(), TokenCount(prompt) + 40);
}

// Penalties and min_p reach the engine as sent: the stream is the local
// engine's with the same settings, and the penalties change greedy text.
TEST_F(GenerationServiceTest, PenaltiesAndMinPReachTheSampler) {
  const std::string prompt = "And the LORD spake unto Moses, saying,";
  const SamplingParams penalised{.temperature = 0.7f,
                                 .seed = 9,
                                 .max_tokens = 48,
                                 .min_p = 0.05f,
                                 .presence_penalty = 0.4f,
                                 .frequency_penalty = 0.3f,
                                 .repetition_penalty = 1.2f,
                                 .penalty_last_n = 32};
  grpc::ClientContext ctx;
  v1::GenerateRequest req;
  req.set_session_id(Create().session_id());
  req.set_prompt(prompt);
  v1::SamplingParams* p = req.mutable_sampling();
  p->set_temperature(0.7f);
  p->set_seed(9);
  p->set_max_tokens(48);
  p->set_min_p(0.05f);
  p->set_presence_penalty(0.4f);
  p->set_frequency_penalty(0.3f);
  p->set_repetition_penalty(1.2f);
  p->set_penalty_last_n(32);
  auto reader = stub_->Generate(&ctx, req);
  std::string text;
  for (v1::GenerateResponse r; reader->Read(&r);) text += r.text();
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(text, LocalWith(prompt, penalised));
  const SamplingParams greedy{.max_tokens = 48};
  SamplingParams greedy_penalised = greedy;
  greedy_penalised.presence_penalty = 2.0f;
  EXPECT_NE(LocalWith(prompt, greedy), LocalWith(prompt, greedy_penalised));
  // An out-of-range penalty is refused, naming the field.
  grpc::ClientContext bad_ctx;
  p->set_repetition_penalty(0.0f);
  auto bad = stub_->Generate(&bad_ctx, req);
  for (v1::GenerateResponse r; bad->Read(&r);) {
  }
  const grpc::Status refused = bad->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("repetition_penalty"));
}

TEST_F(GenerationServiceTest, ConcurrentStreamsEachGetTheirOwnContinuation) {
  const std::vector<std::string> prompts = {"In the beginning", "Jesus wept.",
                                            "The LORD is my shepherd",
                                            "And it came to pass"};
  std::vector<std::string> local;
  for (const auto& p : prompts) local.push_back(LocalGreedy(p, 32));
  std::vector<std::thread> threads;
  std::vector<std::string> remote(8);
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      const auto s = Create();
      remote[i] = Generate(s.session_id(), prompts[i % 4], 32).text;
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 8; ++i) EXPECT_EQ(remote[i], local[i % 4]) << i;
}

TEST_F(GenerationServiceTest, AppendForkSnapshotRestoreDelete) {
  const std::string text = "Honour thy father and thy mother:";
  const uint64_t appended = TokenCount(text);
  const auto s = Create("main");
  EXPECT_EQ(s.session_id(), "main");
  {
    grpc::ClientContext ctx;
    v1::AppendRequest req;
    req.set_session_id("main");
    req.set_text(text);
    v1::ModelSession resp;
    ASSERT_TRUE(stub_->Append(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.position(), appended);
  }
  v1::ModelSession fork;
  {
    grpc::ClientContext ctx;
    v1::ForkModelSessionRequest req;
    req.set_session_id("main");
    ASSERT_TRUE(stub_->Fork(&ctx, req, &fork).ok());
    EXPECT_EQ(fork.position(), appended);
  }
  std::string state;
  {
    grpc::ClientContext ctx;
    v1::SnapshotModelSessionRequest req;
    req.set_session_id("main");
    v1::SnapshotModelSessionResponse resp;
    ASSERT_TRUE(stub_->Snapshot(&ctx, req, &resp).ok());
    state = resp.state();
  }
  v1::ModelSession restored;
  {
    grpc::ClientContext ctx;
    v1::RestoreModelSessionRequest req;
    req.set_state(state);
    req.set_session_id("restored");
    ASSERT_TRUE(stub_->Restore(&ctx, req, &restored).ok());
    EXPECT_EQ(restored.position(), appended);
  }
  const std::string expected = LocalGreedy(text, 24);
  EXPECT_EQ(Generate("main", "", 24).text, expected);
  EXPECT_EQ(Generate(fork.session_id(), "", 24).text, expected);
  EXPECT_EQ(Generate("restored", "", 24).text, expected);
  {
    grpc::ClientContext ctx;
    v1::DeleteModelSessionRequest req;
    req.set_session_id("main");
    v1::DeleteModelSessionResponse resp;
    ASSERT_TRUE(stub_->DeleteSession(&ctx, req, &resp).ok());
    grpc::ClientContext ctx2;
    v1::GetModelSessionRequest get;
    get.set_session_id("main");
    v1::ModelSession gone;
    EXPECT_EQ(stub_->GetSession(&ctx2, get, &gone).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
}

// A session that is generating is snapshotted and forked at the next token
// boundary, not after its Generate (a client checkpointing a long reply, or
// forking a conversation mid-reply): both answer within a 2 s deadline while
// the stream runs, and the fork and a restore of the snapshot continue
// exactly as the original stream does from the token they hold, greedy and
// seeded alike.
TEST_F(GenerationServiceTest, SnapshotAndForkOfAGeneratingSessionAnswerAtOnce) {
  for (const float temperature : {0.0f, 0.9f}) {
    SCOPED_TRACE(temperature);
    const auto s = Create();
    grpc::ClientContext gen_ctx;
    v1::GenerateRequest gen;
    gen.set_session_id(s.session_id());
    gen.set_prompt("And God said");
    gen.mutable_sampling()->set_max_tokens(3000);
    gen.mutable_sampling()->set_temperature(temperature);
    gen.mutable_sampling()->set_seed(17);
    auto reader = stub_->Generate(&gen_ctx, gen);
    std::vector<v1::GenerateResponse> original;
    v1::GenerateResponse r;
    while (original.size() < 8 && reader->Read(&r)) original.push_back(r);
    ASSERT_EQ(original.size(), 8u);

    auto within = [](grpc::ClientContext& ctx) {
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(2));
    };
    std::string blob;
    {
      grpc::ClientContext ctx;
      within(ctx);
      v1::SnapshotModelSessionRequest req;
      req.set_session_id(s.session_id());
      v1::SnapshotModelSessionResponse resp;
      const grpc::Status st = stub_->Snapshot(&ctx, req, &resp);
      ASSERT_TRUE(st.ok()) << st.error_message();
      blob = resp.state();
    }
    v1::ModelSession fork;
    {
      grpc::ClientContext ctx;
      within(ctx);
      v1::ForkModelSessionRequest req;
      req.set_session_id(s.session_id());
      const grpc::Status st = stub_->Fork(&ctx, req, &fork);
      ASSERT_TRUE(st.ok()) << st.error_message();
    }
    v1::ModelSession restored;
    {
      grpc::ClientContext ctx;
      v1::RestoreModelSessionRequest req;
      req.set_state(blob);
      ASSERT_TRUE(stub_->Restore(&ctx, req, &restored).ok());
    }
    while (reader->Read(&r)) original.push_back(r);
    const grpc::Status finished = reader->Finish();
    ASSERT_TRUE(finished.ok()) << finished.error_message();
    ASSERT_EQ(original.size(), 3000u);

    // Each holds the prompt and a prefix of the stream (at least what was
    // read but its last message: the server counts a message delivered when
    // its write completes, which the client may see before the server does;
    // the next write starts only after that, so the lag is one message), and
    // continues with the stream's next tokens.
    auto continues = [&](const v1::ModelSession& session) {
      auto at = std::find_if(original.begin(), original.end(),
                             [&](const v1::GenerateResponse& m) {
                               return m.position() == session.position();
                             });
      ASSERT_NE(at, original.end()) << "position " << session.position();
      ASSERT_GE(at - original.begin(), 6);
      const size_t more = std::min<size_t>(40, original.end() - std::next(at));
      ASSERT_GT(more, 0u);
      grpc::ClientContext ctx;
      v1::GenerateRequest req;
      req.set_session_id(session.session_id());
      req.mutable_sampling()->set_max_tokens(more);
      req.mutable_sampling()->set_temperature(temperature);
      req.mutable_sampling()->set_resume_stream(temperature > 0.0f);
      auto next = stub_->Generate(&ctx, req);
      std::vector<int32_t> got, want;
      while (next->Read(&r)) got.push_back(r.token_id());
      ASSERT_TRUE(next->Finish().ok());
      for (size_t i = 1; i <= more; ++i) want.push_back((at + i)->token_id());
      EXPECT_EQ(got, want);
    };
    continues(fork);
    continues(restored);
  }
}

TEST_F(GenerationServiceTest, BadRequestsGetClearErrorsAndChangeNothing) {
  const auto s = Create();
  auto append = [&](const std::string& text, std::vector<int32_t> ids) {
    grpc::ClientContext ctx;
    v1::AppendRequest req;
    req.set_session_id(s.session_id());
    req.set_text(text);
    for (int32_t id : ids) req.add_token_ids(id);
    v1::ModelSession resp;
    return stub_->Append(&ctx, req, &resp);
  };
  ASSERT_TRUE(append("Amen.", {}).ok());
  grpc::Status both = append("x", {1});
  EXPECT_EQ(both.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(both.error_message(), HasSubstr("token_ids"));
  const int32_t past_vocabulary = BuiltinModel()->config().vocab_size;
  grpc::Status range = append("", {65, past_vocabulary});
  EXPECT_EQ(range.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(range.error_message(), HasSubstr("token_ids[1]"));
  EXPECT_EQ(append("", {}).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  {
    grpc::ClientContext ctx;
    v1::GenerateRequest req;
    req.set_session_id(s.session_id());
    req.mutable_sampling()->set_temperature(-1);
    auto reader = stub_->Generate(&ctx, req);
    v1::GenerateResponse r;
    EXPECT_FALSE(reader->Read(&r));
    grpc::Status st = reader->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(st.error_message(), HasSubstr("sampling.temperature"));
  }
  {
    grpc::ClientContext ctx;
    v1::GetModelSessionRequest req;
    req.set_session_id(s.session_id());
    v1::ModelSession resp;
    ASSERT_TRUE(stub_->GetSession(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.position(), TokenCount("Amen."));
  }
  {
    grpc::ClientContext ctx;
    v1::CreateModelSessionRequest req;
    req.set_model("gpt");
    v1::ModelSession resp;
    EXPECT_EQ(stub_->CreateSession(&ctx, req, &resp).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext ctx;
    v1::RestoreModelSessionRequest req;
    // The magic and version, then no checksum.
    req.set_state(std::string("LNATSNAP\x02\0\0\0", 12) + std::string(40, 'x'));
    v1::ModelSession resp;
    EXPECT_EQ(stub_->Restore(&ctx, req, &resp).error_code(),
              grpc::StatusCode::DATA_LOSS);
  }
  EXPECT_EQ(Generate("nope", "x", 4).status.error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST_F(GenerationServiceTest, CancellingAStreamKeepsTheSessionUsable) {
  const auto s = Create();
  const Streamed g = Generate(s.session_id(), "Selah", 5000, 3);
  EXPECT_EQ(g.status.error_code(), grpc::StatusCode::CANCELLED);
  // The server noticed: the session takes new work, at a position that
  // counts the prompt and at least the tokens that were read.
  const Streamed after = Generate(s.session_id(), "", 4);
  ASSERT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_GE(after.messages.back().position(), TokenCount("Selah") + 3u + 4u);
}

// `linattn generate` at its defaults samples with the settings of
// clients/cli/generate.h, which reach the server as they are; --temperature 0
// without the repeat penalty is plain greedy.
TEST_F(GenerationServiceTest, GenerateCommandStreamsTheContinuation) {
  testing::TempDir tmp;
  const std::string out = tmp.Path("out.txt");
  auto run = [&](const std::string& flags) {
    const std::string cmd = std::string(LINATTN_BINARY) +
                            " generate --server " + server_->address() +
                            " --max-tokens 30 " + flags +
                            " 'Blessed are the poor' > " + out;
    EXPECT_EQ(0, std::system(cmd.c_str())) << cmd;
    std::ifstream in(out);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  };
  const GenerateOptions cli;
  ASSERT_GT(cli.temperature, 0);
  const SamplingParams defaults{.temperature = cli.temperature,
                                .top_k = cli.top_k,
                                .top_p = cli.top_p,
                                .seed = cli.seed,
                                .max_tokens = 30,
                                .min_p = cli.min_p,
                                .presence_penalty = cli.presence_penalty,
                                .frequency_penalty = cli.frequency_penalty,
                                .repetition_penalty = cli.repeat_penalty,
                                .penalty_last_n = cli.repeat_last_n};
  const std::string sampled = run("");
  EXPECT_EQ(sampled, LocalWith("Blessed are the poor", defaults) + "\n");
  const std::string greedy = run("--temperature 0 --repeat-penalty 1");
  EXPECT_EQ(greedy, LocalGreedy("Blessed are the poor", 30) + "\n");
}

// A model whose bytes are not UTF-8 (it only ever says 0xFF): the stream
// carries U+FFFD as text and the bytes as token ids, so gRPC clients can
// parse every message, and `linattn generate` ends with the text.
TEST(GenerationServerTextTest, BytesThatAreNotUtf8ReachClientsAsValidText) {
  testing::TempDir tmp;
  const nlohmann::json config = testing::SmallConfig();
  testing::WriteModel(tmp.Path("ff"), config,
                      testing::OneTokenModelTensors(config, 0xFF));
  auto server = testing::ServerProcess::Start({"--model", tmp.Path("ff")});
  ASSERT_NE(server, nullptr);
  auto stub = v1::GenerationService::NewStub(server->Channel());
  grpc::ClientContext create_ctx;
  v1::ModelSession session;
  ASSERT_TRUE(stub->CreateSession(&create_ctx, {}, &session).ok());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  v1::GenerateRequest req;
  req.set_session_id(session.session_id());
  req.set_prompt("hi");
  req.mutable_sampling()->set_max_tokens(3);
  auto reader = stub->Generate(&ctx, req);
  std::string text;
  int messages = 0;
  v1::GenerateResponse r;
  while (reader->Read(&r)) {
    EXPECT_EQ(r.token_id(), 0xFF);
    text += r.text();
    ++messages;
  }
  const grpc::Status status = reader->Finish();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(messages, 3);
  EXPECT_EQ(text, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");

  const std::string out = tmp.Path("out.txt");
  const std::string cmd = "timeout 20 " + std::string(LINATTN_BINARY) +
                          " generate --server " + server->address() +
                          " --max-tokens 2 --temperature 0 hi > " + out;
  const int code = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(code));
  EXPECT_EQ(WEXITSTATUS(code), 0);
  std::ifstream in(out);
  std::string printed((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(printed, "\xEF\xBF\xBD\xEF\xBF\xBD\n");
}

// A server that sends a message standard clients cannot parse (text that is
// not UTF-8) and then keeps its stream open: `linattn generate` must not
// wait for it for ever, but cancel and fail.
TEST(GenerateClientTest, AnUnreadableMessageEndsTheCallWithAnError) {
  class Unreadable final : public v1::GenerationService::CallbackService {
    grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
        grpc::CallbackServerContext*, const v1::GenerateRequest*) override {
      class Reactor : public grpc::ServerWriteReactor<v1::GenerateResponse> {
       public:
        Reactor() {
          message_.set_token_id(0xFF);
          message_.set_text("\xFF");
          StartWrite(&message_);
        }
        void OnWriteDone(bool) override {}  // and never Finish on its own
        void OnCancel() override { Finish(grpc::Status::CANCELLED); }
        void OnDone() override { delete this; }

       private:
        v1::GenerateResponse message_;
      };
      return new Reactor();
    }
  } service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  GenerateOptions options;
  options.server = "127.0.0.1:" + std::to_string(port);
  options.session_id = "any";  // no CreateSession call
  options.prompt = "hi";
  std::ostringstream out, info;
  const auto start = std::chrono::steady_clock::now();
  const absl::Status s = linattn::Generate(options, out, info);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));
  server->Shutdown(std::chrono::system_clock::now());
}

// --weights bf16|int8: the server streams what the model packed that way
// gives in process.
void ExpectServerStreamsTheLocalModel(WeightType weights) {
  auto server =
      testing::ServerProcess::Start({"--model", LINATTN_BUILTIN_MODEL_DIR,
                                     "--weights", WeightTypeName(weights)});
  ASSERT_NE(server, nullptr);
  auto stub = v1::GenerationService::NewStub(server->Channel());
  grpc::ClientContext create_ctx;
  v1::ModelSession session;
  ASSERT_TRUE(stub->CreateSession(&create_ctx, {}, &session).ok());
  const std::string prompt = "In the beginning God created";
  grpc::ClientContext ctx;
  v1::GenerateRequest req;
  req.set_session_id(session.session_id());
  req.set_prompt(prompt);
  req.mutable_sampling()->set_max_tokens(24);
  auto reader = stub->Generate(&ctx, req);
  std::string text;
  v1::GenerateResponse r;
  while (reader->Read(&r)) text += r.text();
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(text, LocalGreedy(prompt, 24, weights));
}

TEST(GenerationServerWeightsTest, Bf16ServerStreamsTheBf16Model) {
  if (!Bf16Supported().ok()) GTEST_SKIP() << Bf16Supported().message();
  ExpectServerStreamsTheLocalModel(WeightType::kBf16);
}

TEST(GenerationServerWeightsTest, Int8ServerStreamsTheInt8Model) {
  if (!Int8Supported().ok()) GTEST_SKIP() << Int8Supported().message();
  ExpectServerStreamsTheLocalModel(WeightType::kInt8);
}

TEST(GenerationServerStartTest, UnknownWeightTypeIsRefusedNamingTheFlag) {
  testing::TempDir tmp;
  const std::string log = tmp.Path("log.txt");
  // `timeout`: a server that ignored the flag would start and serve.
  const std::string cmd =
      "timeout 20 " + std::string(LINATTN_SERVER_BINARY) +
      " --listen 127.0.0.1:0 --http-listen none --weights fp8 > " + log +
      " 2>&1";
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_NE(WEXITSTATUS(status), 0);
  EXPECT_NE(WEXITSTATUS(status), 124) << "the server started";
  std::ifstream in(log);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_THAT(text, HasSubstr("--weights")) << text;
}

// A server given a broken model directory refuses to start, says why, and
// exits 1 (no crash).
TEST(GenerationServerStartTest, BrokenModelsStopTheServerWithAMessage) {
  testing::TempDir tmp;
  nlohmann::json config = testing::SmallConfig();
  testing::WriteRandomModel(tmp.Path("truncated"), config, 1);
  std::filesystem::resize_file(tmp.Path("truncated/model.safetensors"), 5000);
  testing::WriteRandomModel(tmp.Path("badconfig"), config, 1);
  config["feature_map"] = "rebased";
  std::ofstream(tmp.Path("badconfig/config.json")) << config.dump();
  struct Case {
    std::string dir, expect;
  };
  for (const Case& c : {Case{tmp.Path("truncated"), "model.safetensors"},
                        Case{tmp.Path("badconfig"), "feature_map"},
                        Case{tmp.Path("missing"), "config.json"}}) {
    const std::string log = tmp.Path("log.txt");
    const std::string cmd =
        std::string(LINATTN_SERVER_BINARY) +
        " --listen 127.0.0.1:0 --http-listen none --model " + c.dir + " > " +
        log + " 2>&1";
    const int status = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(status)) << c.dir;
    EXPECT_EQ(WEXITSTATUS(status), 1) << c.dir;
    std::ifstream in(log);
    std::string text((std::istreambuf_iterator<char>(in)), {});
    EXPECT_THAT(text, HasSubstr("cannot start")) << text;
    EXPECT_THAT(text, HasSubstr(c.expect)) << text;
  }
}

}  // namespace
}  // namespace linattn
