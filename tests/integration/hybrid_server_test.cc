// Hybrid models (softmax-attention layers with a key/value cache beside the
// recurrent ones; tests/python/make_model_fixtures.py's hybrid_* fixtures)
// behind a real linattn-server: what sessions do for every model — greedy
// streams, forks, snapshots and restores, cancels, the OpenAI endpoints,
// kill -9 and recovery, a takeover through Redis — against the same models run
// in this process, and a session's keys and values charged against
// --max-state-memory as they grow.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/model/forward.h"
#include "core/model/model.h"
#include "core/session/snapshot.h"
#include "linattn/v1/generation.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "server/api_keys.h"
#include "tests/integration/http_call.h"
#include "tests/integration/model_server_calls.h"
#include "tests/integration/server_process.h"
#include "tests/model/fixtures.h"
#include "tests/util/files.h"
#include "tests/util/redis_server.h"
#include "tests/util/temp_dir.h"

namespace linattn {
namespace {

// Full attention (its cache grows), a window that wraps its ring, a list of
// specs with GQA, every layer attention, an F16 file with a window of one,
// and rwkv6's attention block.
const char* const kModels[] = {
    "hybrid_linear_attn_full",     "hybrid_gla_window_gqa_bias",
    "hybrid_gated_deltanet_specs", "hybrid_retnet_all_attention",
    "hybrid_delta_net_f16",        "hybrid_rwkv6_first_window"};

using testing::Append;
using testing::CreateSession;
using testing::ExpectForkAndRestoreContinueAlike;
using testing::Fork;
using testing::GenerateGreedy;
using testing::Get;
using testing::LocalGreedy;
using testing::Streamed;

std::string Dir(const std::string& name) { return testing::FixtureDir(name); }

// A context long enough to fill two blocks of 64 positions and wrap every
// fixture's window.
std::string LongContext() {
  std::string text;
  for (int i = 0; text.size() < 150; ++i) {
    absl::StrAppend(&text, "line ", i, " of the hybrid's context; ");
  }
  return text.substr(0, 150);
}

// linattn_state_bytes from the server's /metrics (-1 if absent).
double StateBytesMetric(int http_port) {
  const testing::HttpReply r = testing::HttpCall(http_port, "GET", "/metrics");
  const std::string key = "\nlinattn_state_bytes ";
  const size_t at = r.raw.find(key);
  if (at == std::string::npos) return -1;
  return std::stod(r.raw.substr(at + key.size()));
}

// Polls the metric until it is `want` (a request's end is accounted once
// its last message is delivered, just after the client reads it).
bool StateBytesBecome(int http_port, double want) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (StateBytesMetric(http_port) != want) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

struct HybridServerTestModels {
  static constexpr auto& kNames = kModels;
};
class HybridServerTest
    : public testing::FixtureServerTest<HybridServerTestModels> {};

TEST_F(HybridServerTest, ListModelsAndSessionsReportTheKeysAndValues) {
  grpc::ClientContext ctx;
  v1::ListModelsResponse resp;
  ASSERT_TRUE(stub_->ListModels(&ctx, {}, &resp).ok());
  ASSERT_EQ(resp.models_size(), static_cast<int>(std::size(kModels)));
  for (int i = 0; i < resp.models_size(); ++i) {
    const v1::ModelInfo& m = resp.models(i);
    SCOPED_TRACE(m.name());
    auto local = Model::Load(Dir(kModels[i])).value();
    EXPECT_EQ(m.state_bytes(), local->state_bytes());
    EXPECT_EQ(m.kv_bytes_per_token(), local->kv_bytes_per_token());
    EXPECT_GT(m.kv_bytes_per_token(), 0u);
    std::vector<uint32_t> layers;
    bool full = false;
    for (uint32_t l = 0; l < local->config().num_hidden_layers; ++l) {
      if (const auto* a = local->config().attention_layer(l)) {
        layers.push_back(l);
        full |= a->window == 0;
      }
    }
    EXPECT_THAT(m.attention_layers(), ::testing::ElementsAreArray(layers));
    // Windowed layers only: the cache stops at its rings.
    EXPECT_EQ(m.kv_bytes_max(), full ? 0 : local->kv_bytes_at(1u << 30));
  }
  // A session's state grows with its context, a block of 64 positions at a
  // time; a windowed model's stops at its rings.
  for (const char* name :
       {"hybrid_linear_attn_full", "hybrid_rwkv6_first_window"}) {
    SCOPED_TRACE(name);
    auto local = Model::Load(Dir(name)).value();
    const std::string id = Create(name);
    EXPECT_EQ(Get(*stub_, id).state_bytes(), local->state_bytes());
    v1::ModelSession s;
    ASSERT_TRUE(Append(*stub_, id, LongContext(), &s).ok());
    // The last token is pending: the state holds the ones before it.
    EXPECT_EQ(s.state_bytes(), local->state_bytes_at(149));
    EXPECT_EQ(Get(*stub_, id).state_bytes(), local->state_bytes_at(149));
    EXPECT_GT(local->state_bytes_at(149), local->state_bytes());
  }
}

TEST_F(HybridServerTest, GreedyStreamsAreTheModelsOwn) {
  for (const char* name : kModels) {
    SCOPED_TRACE(name);
    const Streamed g = GenerateGreedy(*stub_, Create(name), LongContext(), 12);
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    EXPECT_EQ(g.ids, LocalGreedy(name, LongContext(), 12));
  }
}

// A fork shares the parent's key/value blocks copy-on-write, and a snapshot
// carries them: the original, its fork and a restored copy continue alike,
// and continuing one leaves the others' caches as they were.
TEST_F(HybridServerTest, ForksAndRestoredSnapshotsContinueAlike) {
  const std::string context = LongContext();
  for (const char* name : kModels) {
    SCOPED_TRACE(name);
    ExpectForkAndRestoreContinueAlike(*stub_, name, Create(name), context);
  }
}

// A cancelled stream keeps exactly the delivered tokens (paced generation's
// rollback restores the key/value caches too): the session continues as the
// model does from there.
TEST_F(HybridServerTest, ACancelledStreamContinuesFromWhatWasDelivered) {
  const std::string prompt = LongContext();
  for (const char* name : kModels) {
    SCOPED_TRACE(name);
    const std::vector<int32_t> whole = LocalGreedy(name, prompt, 40);
    if (whole.size() < 40) continue;  // the model ended its text early
    const std::string id = Create(name);
    const Streamed g = GenerateGreedy(*stub_, id, prompt, 30, 3);
    EXPECT_EQ(g.status.error_code(), grpc::StatusCode::CANCELLED);
    // Queued behind the cancelled request: it runs once that one ended.
    const Streamed next = GenerateGreedy(*stub_, id, "", 6);
    ASSERT_TRUE(next.status.ok()) << next.status.error_message();
    const uint64_t kept =
        next.last_position - 6 - static_cast<uint64_t>(prompt.size());
    ASSERT_GE(kept, 3u);
    ASSERT_LE(kept + 6, whole.size());
    EXPECT_EQ(next.ids, std::vector<int32_t>(whole.begin() + kept,
                                             whole.begin() + kept + 6));
  }
}

TEST_F(HybridServerTest, OpenAiCompletionsServeHybrids) {
  for (const char* name : kModels) {
    SCOPED_TRACE(name);
    const Streamed g = GenerateGreedy(*stub_, Create(name), LongContext(), 12);
    const nlohmann::json body = {{"model", name},
                                 {"prompt", LongContext()},
                                 {"max_tokens", 12},
                                 {"temperature", 0}};
    const testing::HttpReply r = testing::HttpCall(
        server_->http_port(), "POST", "/v1/completions", body.dump());
    ASSERT_EQ(r.status, 200) << r.raw;
    EXPECT_EQ(r.body["choices"][0]["text"], g.text);
  }
}

// Stored responses keep their session (keys and values included): two
// follow-ups of one response branch from the same state, which neither
// changes.
TEST(HybridResponsesTest, PreviousResponseIdContinuesFromTheState) {
  testing::TempDir tmp;
  const std::string dir = tmp.Path("chat_hybrid");
  std::filesystem::copy(Dir("hybrid_gated_deltanet_specs"), dir);
  testing::WriteFile(
      dir + "/chat_template.jinja",
      "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n"
      "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}");
  auto server =
      testing::ServerProcess::Start({"--model", dir}, tmp.Path("server.log"));
  ASSERT_NE(server, nullptr);
  const int port = server->http_port();
  const testing::HttpReply r1 =
      testing::HttpCall(port, "POST", "/v1/responses",
                        nlohmann::json{{"input", LongContext()},
                                       {"max_output_tokens", 10},
                                       {"temperature", 0}}
                            .dump());
  ASSERT_EQ(r1.status, 200) << r1.raw;
  const std::string id1 = r1.body["id"];
  const auto position = [&](const std::string& id) {
    return testing::HttpCall(port, "GET", "/v1/sessions/" + id)
        .body.value("position", uint64_t{0});
  };
  const uint64_t end1 = position(id1);
  ASSERT_GT(end1, 150u);
  const std::string follow = nlohmann::json{
      {"previous_response_id", id1},
      {"input", "And then?"},
      {"max_output_tokens", 10},
      {"temperature", 0}}.dump();
  const testing::HttpReply a =
      testing::HttpCall(port, "POST", "/v1/responses", follow);
  const testing::HttpReply b =
      testing::HttpCall(port, "POST", "/v1/responses", follow);
  ASSERT_EQ(a.status, 200) << a.raw;
  ASSERT_EQ(b.status, 200) << b.raw;
  EXPECT_EQ(a.body["output"][0]["content"], b.body["output"][0]["content"]);
  EXPECT_EQ(a.body["usage"]["input_tokens_details"]["cached_tokens"], end1);
  EXPECT_EQ(position(id1), end1);
  // The same as a gRPC fork of r1's session fed the follow-up's turn.
  auto stub = v1::GenerationService::NewStub(server->Channel());
  v1::ModelSession fork;
  ASSERT_TRUE(Fork(*stub, id1, &fork).ok());
  const Streamed g = GenerateGreedy(*stub, fork.session_id(),
                                    "\n<user>And then?\n<assistant>", 10);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(a.body["output"][0]["content"][0]["text"], g.text);
}

// --max-state-memory counts a session's keys and values as they grow: a
// request that could take the session past it is refused before anything
// changes, naming what it needed; what a request did not reach is given
// back; a fork is charged its parent's context.
TEST(HybridMemoryTest, KeysAndValuesAreChargedAsTheyGrow) {
  testing::TempDir tmp;
  const std::string name = "hybrid_linear_attn_full";
  auto local = Model::Load(Dir(name)).value();
  ASSERT_EQ(local->kv_bytes_max(), std::nullopt);
  // Room for two sessions at 325 positions (6 blocks each), a paced
  // request's working copies and two more blocks; not for three sessions.
  const uint64_t at325 = local->state_bytes_at(325);
  const uint64_t block = local->kv_bytes_at(1);
  const uint64_t budget =
      2 * at325 + 3 * local->working_copy_bytes() + 2 * block + 4096;
  ASSERT_LT(budget, 3 * at325);
  ASSERT_LT(budget, local->state_bytes_at(2005));
  auto server = testing::ServerProcess::Start(
      {"--model", Dir(name), "--max-state-memory", std::to_string(budget)},
      tmp.Path("server.log"));
  ASSERT_NE(server, nullptr);
  auto stub = v1::GenerationService::NewStub(server->Channel());
  const int http = server->http_port();
  v1::ModelSession s;
  ASSERT_TRUE(CreateSession(*stub, name, &s, "grows").ok());
  EXPECT_TRUE(StateBytesBecome(http, local->state_bytes()));

  // 2,000 tokens would need 32 blocks: refused before the prompt is fed.
  const Streamed big = GenerateGreedy(*stub, "grows", "Hello", 2000);
  EXPECT_EQ(big.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(big.status.error_message(),
              ::testing::HasSubstr("position 2005"));
  EXPECT_THAT(big.status.error_message(),
              ::testing::HasSubstr(absl::StrCat(local->kv_bytes_at(2005))));
  EXPECT_TRUE(big.ids.empty());
  EXPECT_EQ(Get(*stub, "grows").position(), 0u);
  EXPECT_TRUE(StateBytesBecome(http, local->state_bytes()));

  // What fits runs, as the model does, and is charged its position.
  const std::string context = LongContext() + LongContext() + "and more text";
  ASSERT_EQ(context.size(), 313u);
  const Streamed g = GenerateGreedy(*stub, "grows", context, 12);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.ids, LocalGreedy(name, context, 12));
  EXPECT_EQ(Get(*stub, "grows").position(), 325u);
  EXPECT_EQ(Get(*stub, "grows").state_bytes(), local->state_bytes_at(324));
  EXPECT_TRUE(StateBytesBecome(http, local->state_bytes_at(324)));

  // One fork fits beside it; a second does not, and says what it needed.
  v1::ModelSession fork;
  ASSERT_TRUE(Fork(*stub, "grows", &fork).ok());
  EXPECT_TRUE(StateBytesBecome(http, 2 * local->state_bytes_at(324)));
  v1::ModelSession refused;
  const grpc::Status second = Fork(*stub, "grows", &refused);
  EXPECT_EQ(second.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(second.error_message(),
              ::testing::HasSubstr("keys and values of 324 positions"));
  EXPECT_TRUE(StateBytesBecome(http, 2 * local->state_bytes_at(324)));

  // A cancelled request gives back what it reserved beyond what it kept.
  // It asks for nearly as many tokens as the budget's two spare blocks
  // allow (the fork's 6 blocks grow to 8): a paced stream waits for the
  // transport to take each message, not for the client to read it, so a
  // server on a loaded machine may run a short request to its end before
  // it sees the cancel.
  constexpr int kAsked = 180;
  const uint64_t reach = 325 + kAsked;  // the pending token, then kAsked
  ASSERT_LE(local->kv_bytes_at(reach), 8 * block);
  const Streamed cancelled =
      GenerateGreedy(*stub, fork.session_id(), /*prompt=*/"", kAsked,
                     /*cancel_after=*/2);
  EXPECT_EQ(cancelled.status.error_code(), grpc::StatusCode::CANCELLED);
  // It reserved up to position `reach`; the server sees the cancel soon
  // after the client, and then holds the blocks of what it kept.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  uint64_t kept = 0;
  double charged = -1;
  while (std::chrono::steady_clock::now() < deadline) {
    kept = Get(*stub, fork.session_id()).position();
    charged = StateBytesMetric(http);
    if (charged == static_cast<double>(local->state_bytes_at(324) +
                                       local->state_bytes_at(kept - 1))) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GE(kept, 327u);
  EXPECT_LT(kept, reach);
  EXPECT_EQ(charged, static_cast<double>(local->state_bytes_at(324) +
                                         local->state_bytes_at(kept - 1)));
  EXPECT_LT(local->state_bytes_at(kept - 1), local->state_bytes_at(reach));

  // Deleted sessions give everything back.
  for (const std::string& id : {std::string("grows"), fork.session_id()}) {
    grpc::ClientContext ctx;
    v1::DeleteModelSessionRequest req;
    req.set_session_id(id);
    v1::DeleteModelSessionResponse resp;
    ASSERT_TRUE(stub->DeleteSession(&ctx, req, &resp).ok());
  }
  EXPECT_TRUE(StateBytesBecome(http, 0));
}

// A request that a tenant's own quota refuses is answered at once, even
// while another tenant's request holds memory (the quota is not what that
// request gives back).
TEST(HybridMemoryTest, ATenantsQuotaRefusesAtOnceWhileOthersRun) {
  testing::TempDir tmp;
  const std::string name = "hybrid_linear_attn_full";
  auto local = Model::Load(Dir(name)).value();
  const std::string keys = tmp.Path("keys.json");
  testing::WriteFile(
      keys,
      nlohmann::json{{"keys",
                      {{{"sha256", Sha256Hex("key-small")},
                        {"tenant", "small"},
                        {"max_state_bytes", 64 << 10}},
                       {{"sha256", Sha256Hex("key-big")}, {"tenant", "big"}}}}}
          .dump());
  auto server = testing::ServerProcess::Start(
      {"--model", Dir(name), "--api-keys", keys}, tmp.Path("server.log"));
  ASSERT_NE(server, nullptr);
  auto stub = v1::GenerationService::NewStub(server->Channel());
  const auto create = [&](const std::string& key, const std::string& id) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + key);
    v1::CreateModelSessionRequest req;
    req.set_session_id(id);
    v1::ModelSession s;
    return stub->CreateSession(&ctx, req, &s);
  };
  ASSERT_TRUE(create("key-big", "big").ok());
  ASSERT_TRUE(create("key-small", "small").ok());
  // big's stream is not read: paced, its request holds its working copies.
  grpc::ClientContext big_ctx;
  big_ctx.AddMetadata("authorization", "Bearer key-big");
  v1::GenerateRequest big_req;
  big_req.set_session_id("big");
  big_req.set_prompt("In the beginning");
  big_req.mutable_sampling()->set_max_tokens(2000);
  auto big = stub->Generate(&big_ctx, big_req);
  v1::GenerateResponse first;
  ASSERT_TRUE(big->Read(&first));
  // 500 tokens would take small past its 64 KiB quota.
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer key-small");
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::GenerateRequest req;
  req.set_session_id("small");
  req.set_prompt("Hello");
  req.mutable_sampling()->set_max_tokens(500);
  auto reader = stub->Generate(&ctx, req);
  for (v1::GenerateResponse r; reader->Read(&r);) {
  }
  const grpc::Status refused = reader->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << refused.error_message();
  EXPECT_THAT(refused.error_message(), ::testing::HasSubstr("'small'"));
  big_ctx.TryCancel();
  for (v1::GenerateResponse r; big->Read(&r);) {
  }
  (void)big->Finish();
}

// Sessions of hybrids in a server with a state dir survive kill -9: the
// journal's tokens rebuild their caches, and each continues its greedy
// stream as if uncrashed, charged its position again.
TEST(HybridDurableTest, SessionsContinueAfterKillNine) {
  testing::TempDir tmp;
  const std::vector<std::string> names = {"hybrid_linear_attn_full",
                                          "hybrid_gla_window_gqa_bias"};
  std::vector<std::string> args = {"--state-dir", tmp.Path("state")};
  for (const std::string& name : names) {
    args.push_back("--model");
    args.push_back(Dir(name));
  }
  const std::string context = LongContext();
  std::map<std::string, std::vector<int32_t>> first;
  {
    auto server = testing::ServerProcess::Start(args, tmp.Path("server.log"));
    ASSERT_NE(server, nullptr);
    auto stub = v1::GenerationService::NewStub(server->Channel());
    for (const std::string& name : names) {
      v1::ModelSession s;
      ASSERT_TRUE(CreateSession(*stub, name, &s, "d-" + name).ok());
      const Streamed g = GenerateGreedy(*stub, s.session_id(), context, 5);
      ASSERT_TRUE(g.status.ok()) << g.status.error_message();
      first[name] = g.ids;
    }
    server->Kill();
  }
  auto server = testing::ServerProcess::Start(args, tmp.Path("server2.log"));
  ASSERT_NE(server, nullptr);
  auto stub = v1::GenerationService::NewStub(server->Channel());
  double charged = 0;
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    auto local = Model::Load(Dir(name)).value();
    const std::vector<int32_t> whole = LocalGreedy(name, context, 13);
    ASSERT_EQ(whole.size(), 13u) << "the model ended its text early";
    ASSERT_EQ(first[name],
              std::vector<int32_t>(whole.begin(), whole.begin() + 5));
    const v1::ModelSession s = Get(*stub, "d-" + name);
    EXPECT_EQ(s.position(), context.size() + 5);
    EXPECT_EQ(s.state_bytes(), local->state_bytes_at(context.size() + 4));
    charged += static_cast<double>(s.state_bytes());
    const Streamed next = GenerateGreedy(*stub, "d-" + name, "", 8);
    ASSERT_TRUE(next.status.ok()) << next.status.error_message();
    EXPECT_EQ(next.ids, std::vector<int32_t>(whole.begin() + 5, whole.end()));
    charged += static_cast<double>(local->state_bytes_at(context.size() + 12)) -
               static_cast<double>(s.state_bytes());
  }
  EXPECT_TRUE(StateBytesBecome(server->http_port(), charged))
      << StateBytesMetric(server->http_port());
}

// Two replicas sharing sessions through a real Redis: a hybrid session
// generated on one continues on the other after its replica dies (the
// takeover rebuilds its caches from the recorded tokens), as the model
// does.
TEST(HybridReplicaTest, ASessionTakenOverThroughRedisContinues) {
  testing::TempDir tmp;
  testing::RedisServer redis(tmp.Path(""));
  const std::string name = "hybrid_gated_deltanet_specs";
  const std::vector<std::string> args = {
      "--model", Dir(name), "--state-store", redis.url(), "--lease-ms", "300"};
  const std::string context = LongContext();
  const std::vector<int32_t> whole = LocalGreedy(name, context, 13);
  ASSERT_EQ(whole.size(), 13u) << "the model ended its text early";
  auto a = testing::ServerProcess::Start(args, tmp.Path("a.log"));
  auto b = testing::ServerProcess::Start(args, tmp.Path("b.log"));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  {
    auto stub = v1::GenerationService::NewStub(a->Channel());
    v1::ModelSession s;
    ASSERT_TRUE(CreateSession(*stub, name, &s, "moves").ok());
    const Streamed g = GenerateGreedy(*stub, "moves", context, 5);
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    EXPECT_EQ(g.ids, std::vector<int32_t>(whole.begin(), whole.begin() + 5));
  }
  a->Kill();
  auto stub = v1::GenerationService::NewStub(b->Channel());
  const Streamed next = GenerateGreedy(*stub, "moves", "", 8);
  ASSERT_TRUE(next.status.ok()) << next.status.error_message();
  EXPECT_EQ(next.ids, std::vector<int32_t>(whole.begin() + 5, whole.end()));
}

// A snapshot that one message could not carry is refused by name (Fork
// copies such a session within the server); --check describes the layers.
TEST(HybridLimitsTest, SnapshotsLargerThanAMessageAreRefusedByName) {
  testing::TempDir tmp;
  const std::string name = "hybrid_retnet_all_attention";
  auto local = Model::Load(Dir(name)).value();
  // A message holds a session's snapshot at 64 positions, not at 300.
  const uint64_t limit = ModelSnapshotBytesAt(*local, 64) + 4096;
  ASSERT_GT(ModelSnapshotBytesAt(*local, 300), limit);
  auto server = testing::ServerProcess::Start(
      {"--model", Dir(name), "--max-message-bytes", std::to_string(limit)},
      tmp.Path("server.log"));
  ASSERT_NE(server, nullptr);
  auto stub = v1::GenerationService::NewStub(server->Channel());
  v1::ModelSession s;
  ASSERT_TRUE(CreateSession(*stub, name, &s, "big").ok());
  const auto snapshot = [&](std::string* blob) {
    grpc::ClientContext ctx;
    v1::SnapshotModelSessionRequest req;
    req.set_session_id("big");
    v1::SnapshotModelSessionResponse resp;
    grpc::Status st = stub->Snapshot(&ctx, req, &resp);
    *blob = resp.state();
    return st;
  };
  std::string blob;
  ASSERT_TRUE(Append(*stub, "big", LongContext().substr(0, 40), &s).ok());
  EXPECT_TRUE(snapshot(&blob).ok());
  EXPECT_FALSE(blob.empty());
  std::string text;
  while (text.size() < 300) text += LongContext();
  ASSERT_TRUE(Append(*stub, "big", text.substr(0, 300), &s).ok());
  const grpc::Status refused = snapshot(&blob);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(),
              ::testing::HasSubstr("--max-message-bytes"));
  EXPECT_THAT(refused.error_message(), ::testing::HasSubstr("position 339"));
  v1::ModelSession fork;
  EXPECT_TRUE(Fork(*stub, "big", &fork).ok());

  const std::string log = tmp.Path("check.log");
  const int status = std::system(
      absl::StrCat("timeout 20 ", LINATTN_SERVER_BINARY, " --model ", Dir(name),
                   " --check > ", log, " 2>&1")
          .c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_THAT(testing::ReadFile(log),
              ::testing::HasSubstr(absl::StrCat(
                  "softmax attention in layers 0 (full), 1 (full); keys and "
                  "values ",
                  local->kv_bytes_per_token(), " bytes per position")));
}

}  // namespace
}  // namespace linattn
