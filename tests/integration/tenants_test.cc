// Tenants on a real linattn-server process started with --api-keys: calls
// without a valid key are refused (UNAUTHENTICATED / 401) before anything
// of them runs; a session belongs to the tenant that created it and is
// NOT_FOUND / 404 to every other tenant (in both services and over HTTP,
// for every call that names it); lists show one's own; an admin key sees
// and acts on all; quotas refuse with RESOURCE_EXHAUSTED naming the
// tenant; owners survive a restart from the state dir; SIGHUP reloads the
// keys without touching sessions. The clients connect through the
// project's own connection code (clients/common), as `linattn` does.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_replace.h"
#include "clients/common/connection.h"
#include "linattn/v1/attention.grpc.pb.h"
#include "linattn/v1/generation.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "server/api_keys.h"
#include "tests/integration/http_call.h"
#include "tests/integration/server_process.h"

namespace linattn {
namespace {

using testing::ServerProcess;

struct KeyFile {
  std::filesystem::path path;
  KeyFile() {
    path = std::filesystem::temp_directory_path() /
           ("linattn_keys_" + std::to_string(::getpid()) + "_" +
            std::to_string(counter++) + ".json");
  }
  ~KeyFile() { std::filesystem::remove(path); }
  void Write(const nlohmann::json& keys) {
    std::ofstream(path) << nlohmann::json{{"keys", keys}}.dump();
  }
  static inline int counter = 0;
};

nlohmann::json Key(const std::string& key, const std::string& tenant,
                   bool admin = false, uint64_t max_sessions = 0) {
  nlohmann::json k = {
      {"sha256", Sha256Hex(key)}, {"tenant", tenant}, {"admin", admin}};
  if (max_sessions != 0) k["max_sessions"] = max_sessions;
  return k;
}

nlohmann::json StandardKeys() {
  return {Key("key-a", "alpha", false, 3), Key("key-b", "beta"),
          Key("key-root", "ops", true)};
}

class Caller {
 public:
  Caller(const ServerProcess& server, const std::string& key) {
    ConnectionOptions options;
    options.api_key = key;
    auto channel = OpenChannel(server.address(), options);
    attention_ = v1::AttentionService::NewStub(channel);
    generation_ = v1::GenerationService::NewStub(channel);
  }
  v1::AttentionService::Stub& attention() { return *attention_; }
  v1::GenerationService::Stub& generation() { return *generation_; }

  grpc::Status Create(const std::string& id, v1::Session* out = nullptr) {
    grpc::ClientContext ctx;
    v1::CreateSessionRequest req;
    req.mutable_spec()->set_num_heads(1);
    req.mutable_spec()->set_key_dim(2);
    req.mutable_spec()->set_value_dim(2);
    req.set_session_id(id);
    v1::Session session;
    return attention_->CreateSession(&ctx, req, out ? out : &session);
  }
  grpc::Status Get(const std::string& id) {
    grpc::ClientContext ctx;
    v1::GetSessionRequest req;
    req.set_session_id(id);
    v1::Session out;
    return attention_->GetSession(&ctx, req, &out);
  }
  std::set<std::string> List() {
    grpc::ClientContext ctx;
    v1::ListSessionsResponse out;
    EXPECT_TRUE(
        attention_->ListSessions(&ctx, v1::ListSessionsRequest(), &out).ok());
    std::set<std::string> ids;
    for (const auto& s : out.sessions()) ids.insert(s.session_id());
    return ids;
  }

 private:
  std::unique_ptr<v1::AttentionService::Stub> attention_;
  std::unique_ptr<v1::GenerationService::Stub> generation_;
};

using Stub = v1::AttentionService::Stub;

// q, k and v of one token of the tests' sessions (1 head, d_k = d_v = 2).
template <typename Request>
void OneToken(Request& r) {
  for (int i = 0; i < 2; ++i) {
    r.add_q(1);
    r.add_k(1);
    r.add_v(1);
  }
}

// The status code of one unary call of `stub` about session `id`.
template <typename S, typename Request, typename Response>
grpc::StatusCode CodeOf(S& stub,
                        grpc::Status (S::*method)(grpc::ClientContext*,
                                                  const Request&, Response*),
                        const std::string& id, Request request = Request()) {
  request.set_session_id(id);
  grpc::ClientContext ctx;
  Response out;
  return (stub.*method)(&ctx, request, &out).error_code();
}

TEST(Tenants, CallsWithoutAValidKeyAreRefusedBeforeAnythingRuns) {
  KeyFile keys;
  keys.Write(StandardKeys());
  auto server = ServerProcess::Start({"--api-keys", keys.path.string()});
  ASSERT_NE(server, nullptr);
  for (const std::string key : {"", "key-wrong", "key-a "}) {
    Caller c(*server, key);
    const grpc::Status s = c.Create("s1");
    if (key == "key-a ") {
      // Trailing blanks are not part of a key (HTTP strips them too).
      EXPECT_TRUE(s.ok()) << s.error_message();
      continue;
    }
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << key;
    EXPECT_NE(s.error_message().find("authorization"), std::string::npos);
  }
  // Even a malformed request learns nothing but that it needs a key.
  Caller anonymous(*server, "");
  grpc::ClientContext ctx;
  v1::GetSessionRequest bad;
  bad.set_session_id(std::string(300, 'x'));
  v1::Session out;
  EXPECT_EQ(anonymous.attention().GetSession(&ctx, bad, &out).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // Health probes need no key.
  auto health = server->Channel();
  EXPECT_TRUE(health->WaitForConnected(std::chrono::system_clock::now() +
                                       std::chrono::seconds(5)));
}

TEST(Tenants, ASessionIsItsTenantsAloneAndAnAdminSeesAll) {
  KeyFile keys;
  keys.Write(StandardKeys());
  auto server = ServerProcess::Start({"--api-keys", keys.path.string()});
  ASSERT_NE(server, nullptr);
  Caller a(*server, "key-a"), b(*server, "key-b"), root(*server, "key-root");
  ASSERT_TRUE(a.Create("a1").ok());
  v1::Session generated;
  ASSERT_TRUE(a.Create("", &generated).ok());
  ASSERT_TRUE(b.Create("b1").ok());

  // Every call of another tenant naming a's session: as if it did not
  // exist, with the same message as an id no one holds.
  const grpc::Status missing = b.Get("nobody");
  ASSERT_EQ(missing.error_code(), grpc::StatusCode::NOT_FOUND);
  for (const std::string& id : {std::string("a1"), generated.session_id()}) {
    const grpc::Status s = b.Get(id);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(s.error_message(),
              absl::StrReplaceAll(missing.error_message(), {{"nobody", id}}));
    v1::PrefillRequest prefill;
    prefill.set_tokens(1);
    OneToken(prefill);
    for (const grpc::StatusCode code :
         {CodeOf(b.attention(), &Stub::DeleteSession, id),
          CodeOf(b.attention(), &Stub::Prefill, id, prefill),
          CodeOf(b.attention(), &Stub::Fork, id),
          CodeOf(b.attention(), &Stub::Snapshot, id),
          CodeOf(b.attention(), &Stub::Inspect, id)}) {
      EXPECT_EQ(code, grpc::StatusCode::NOT_FOUND);
    }
    {
      grpc::ClientContext ctx;
      auto stream = b.attention().Decode(&ctx);
      v1::DecodeRequest req;
      req.set_session_id(id);
      OneToken(req);
      stream->Write(req);
      stream->WritesDone();
      v1::DecodeResponse out;
      while (stream->Read(&out)) {
      }
      EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
    }
  }
  // a's session is untouched by all that.
  EXPECT_TRUE(a.Get("a1").ok());
  // A requested id another tenant holds cannot be taken.
  EXPECT_EQ(b.Create("a1").error_code(), grpc::StatusCode::ALREADY_EXISTS);

  EXPECT_EQ(a.List(), (std::set<std::string>{"a1", generated.session_id()}));
  EXPECT_EQ(b.List(), (std::set<std::string>{"b1"}));
  EXPECT_EQ(root.List(),
            (std::set<std::string>{"a1", "b1", generated.session_id()}));
  // The admin acts on any session; what it forks is its own.
  {
    grpc::ClientContext ctx;
    v1::ForkRequest req;
    req.set_session_id("a1");
    req.set_new_session_id("root-copy");
    v1::Session out;
    ASSERT_TRUE(root.attention().Fork(&ctx, req, &out).ok());
  }
  EXPECT_EQ(a.Get("root-copy").error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(root.Get("a1").ok());

  // Model sessions too (GenerationService).
  v1::ModelSession mine;
  {
    grpc::ClientContext ctx;
    v1::CreateModelSessionRequest req;
    ASSERT_TRUE(a.generation().CreateSession(&ctx, req, &mine).ok());
  }
  {
    grpc::ClientContext ctx;
    v1::GenerateRequest req;
    req.set_session_id(mine.session_id());
    req.set_prompt("hello");
    auto stream = b.generation().Generate(&ctx, req);
    v1::GenerateResponse out;
    while (stream->Read(&out)) {
    }
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext ctx;
    v1::ListModelSessionsResponse out;
    ASSERT_TRUE(b.generation()
                    .ListSessions(&ctx, v1::ListModelSessionsRequest(), &out)
                    .ok());
    EXPECT_EQ(out.sessions_size(), 0);
  }
  {
    grpc::ClientContext ctx;
    v1::GetModelSessionRequest req;
    req.set_session_id(mine.session_id());
    v1::ModelSession out;
    ASSERT_TRUE(a.generation().GetSession(&ctx, req, &out).ok());
    EXPECT_EQ(out.position(), 0u);  // b's Generate changed nothing
  }
}

TEST(Tenants, QuotasRefuseTheTenantAtItsLimitOnly) {
  KeyFile keys;
  keys.Write(StandardKeys());  // alpha: at most 3 sessions
  const std::string log = keys.path.string() + ".log";
  auto server = ServerProcess::Start(
      {"--api-keys", keys.path.string(), "--log-json", "--log-level", "info"},
      log);
  ASSERT_NE(server, nullptr);
  Caller a(*server, "key-a"), b(*server, "key-b");
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(a.Create("").ok());
  const grpc::Status s = a.Create("");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("tenant 'alpha'"), std::string::npos)
      << s.error_message();
  EXPECT_TRUE(b.Create("").ok());
  // A deleted session makes room again.
  const std::string first = *a.List().begin();
  grpc::ClientContext ctx;
  v1::DeleteSessionRequest req;
  req.set_session_id(first);
  v1::DeleteSessionResponse out;
  ASSERT_TRUE(a.attention().DeleteSession(&ctx, req, &out).ok());
  EXPECT_TRUE(a.Create("").ok());
  // The access log names the tenant of every call, the refused one too.
  ASSERT_EQ(server->Stop(std::chrono::seconds(20)), 0);
  std::ifstream in(log);
  std::string line;
  int refused = 0, created = 0;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.at("logger") != "access") continue;
    if (j.at("method") != "linattn.v1.AttentionService/CreateSession") continue;
    if (j.at("tenant") == "alpha") {
      ++(j.at("status") == "RESOURCE_EXHAUSTED" ? refused : created);
    }
  }
  EXPECT_EQ(refused, 1);
  EXPECT_EQ(created, 4);
  std::filesystem::remove(log);
}

TEST(Tenants, OwnersSurviveARestartFromTheStateDir) {
  KeyFile keys;
  keys.Write(StandardKeys());
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      ("linattn_tenants_state_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const std::vector<std::string> args = {"--api-keys", keys.path.string(),
                                         "--state-dir", dir.string()};
  {
    auto server = ServerProcess::Start(args);
    ASSERT_NE(server, nullptr);
    Caller a(*server, "key-a"), b(*server, "key-b");
    ASSERT_TRUE(a.Create("kept-a").ok());
    ASSERT_TRUE(b.Create("kept-b").ok());
    server->Kill();  // from the journal: no snapshot at exit
  }
  {
    auto server = ServerProcess::Start(args);
    ASSERT_NE(server, nullptr);
    Caller a(*server, "key-a"), b(*server, "key-b");
    EXPECT_EQ(a.List(), (std::set<std::string>{"kept-a"}));
    EXPECT_EQ(b.Get("kept-a").error_code(), grpc::StatusCode::NOT_FOUND);
    // A drain writes every session's snapshot file: owners go with them.
    ASSERT_EQ(server->Stop(std::chrono::seconds(20)), 0);
  }
  {
    auto server = ServerProcess::Start(args);
    ASSERT_NE(server, nullptr);
    Caller a(*server, "key-a"), b(*server, "key-b");
    EXPECT_EQ(a.List(), (std::set<std::string>{"kept-a"}));
    EXPECT_EQ(b.List(), (std::set<std::string>{"kept-b"}));
    EXPECT_EQ(a.Get("kept-b").error_code(), grpc::StatusCode::NOT_FOUND);
  }
  std::filesystem::remove_all(dir);
}

TEST(Tenants, SighupReloadsTheKeysAndKeepsSessions) {
  KeyFile keys;
  keys.Write(StandardKeys());
  auto server = ServerProcess::Start({"--api-keys", keys.path.string()});
  ASSERT_NE(server, nullptr);
  Caller a(*server, "key-a"), b(*server, "key-b");
  ASSERT_TRUE(a.Create("a1").ok());
  // beta's key is revoked, alpha gets a second key.
  keys.Write({Key("key-a", "alpha", false, 3), Key("key-a2", "alpha", false, 3),
              Key("key-root", "ops", true)});
  ASSERT_EQ(kill(server->pid(), SIGHUP), 0);
  Caller a2(*server, "key-a2");
  for (int i = 0; i < 200 && b.Create("").ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  EXPECT_EQ(b.Create("").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(a2.Get("a1").ok());  // the same tenant, the same sessions
  // A broken file is not taken: the keys in use stay.
  std::ofstream(keys.path) << "{\"keys\": [";
  ASSERT_EQ(kill(server->pid(), SIGHUP), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE(a.Get("a1").ok());
  EXPECT_EQ(server->Stop(std::chrono::seconds(20)), 0);
}

TEST(Tenants, OverHttpTooSessionsAndStoredResponsesAreTheTenants) {
  KeyFile keys;
  keys.Write(StandardKeys());
  auto server = ServerProcess::Start({"--api-keys", keys.path.string()});
  ASSERT_NE(server, nullptr);
  const int port = server->http_port();
  using testing::HttpCall;
  // No key, a wrong one: 401 with WWW-Authenticate, before the body is
  // read; the probes and the explorer stay open.
  for (const std::string key : {"", "key-wrong"}) {
    for (const std::string path :
         {"/v1/models", "/v1/sessions", "/v1/completions", "/nowhere"}) {
      const bool post = path == "/v1/completions";
      auto r = HttpCall(port, post ? "POST" : "GET", path,
                        post ? R"({"prompt":"a"})" : "", key);
      EXPECT_EQ(r.status, 401) << path << " " << key;
      EXPECT_EQ(r.body["error"]["code"], "invalid_api_key") << r.raw;
    }
  }
  EXPECT_EQ(HttpCall(port, "GET", "/health").status, 200);
  EXPECT_EQ(HttpCall(port, "GET", "/").status, 200);
  EXPECT_EQ(HttpCall(port, "GET", "/metrics").status, 200);
  EXPECT_EQ(HttpCall(port, "GET", "/v1/models", "", "key-a").status, 200);

  auto created = HttpCall(port, "POST", "/v1/sessions", "{}", "key-a");
  ASSERT_EQ(created.status, 200) << created.raw;
  const std::string id = created.body["id"];
  for (const auto& [method, path, body] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"GET", "/v1/sessions/" + id, ""},
           {"GET", "/v1/sessions/" + id + "/state", ""},
           {"POST", "/v1/sessions/" + id + "/fork", "{}"},
           {"POST", "/v1/sessions/" + id + "/append", R"({"prompt":"x"})"},
           {"POST", "/v1/completions",
            R"({"prompt":"x","max_tokens":2,"session_id":")" + id + "\"}"},
           {"DELETE", "/v1/sessions/" + id, ""}}) {
    auto r = HttpCall(port, method, path, body, "key-b");
    EXPECT_EQ(r.status, 404) << method << " " << path << ": " << r.raw;
  }
  auto listed = HttpCall(port, "GET", "/v1/sessions", "", "key-b");
  EXPECT_TRUE(listed.body["data"].empty()) << listed.raw;
  auto mine = HttpCall(port, "GET", "/v1/sessions/" + id, "", "key-a");
  EXPECT_EQ(mine.status, 200);
  EXPECT_EQ(mine.body["position"], 0) << "b's calls changed a's session";
  EXPECT_EQ(
      HttpCall(port, "GET", "/v1/sessions", "", "key-root").body["data"].size(),
      1u);

  // A stored response: its id, its follow-ups and its deletion are a's.
  auto response = HttpCall(port, "POST", "/v1/responses",
                           R"({"input":"hi","max_output_tokens":2})", "key-a");
  ASSERT_EQ(response.status, 200) << response.raw;
  const std::string rid = response.body["id"];
  EXPECT_EQ(HttpCall(port, "GET", "/v1/responses/" + rid, "", "key-b").status,
            404);
  EXPECT_EQ(HttpCall(port, "POST", "/v1/responses",
                     R"({"input":"and?","max_output_tokens":2,)"
                     R"("previous_response_id":")" +
                         rid + "\"}",
                     "key-b")
                .status,
            404);
  EXPECT_EQ(
      HttpCall(port, "DELETE", "/v1/responses/" + rid, "", "key-b").status,
      404);
  EXPECT_EQ(HttpCall(port, "GET", "/v1/responses/" + rid, "", "key-a").status,
            200);
}

// Stored responses are bounded per tenant and in all (a quarter of
// --max-sessions, and of a key's max_sessions): one tenant storing many
// pushes out its own oldest, or when the store is full the oldest of the
// tenant holding the most, never the response of a tenant holding fewer,
// its session or a follow-up of it.
TEST(Tenants, StoredResponsesOfOneTenantNeverEvictAnothers) {
  using testing::HttpCall;
  KeyFile keys;
  keys.Write({Key("key-a", "alpha"), Key("key-e", "eager", false, 12),
              Key("key-b", "bulk")});
  auto server = ServerProcess::Start(
      {"--api-keys", keys.path.string(), "--max-sessions", "40"});
  ASSERT_NE(server, nullptr);
  const int port = server->http_port();
  const auto respond = [&](const std::string& key, const std::string& extra) {
    return HttpCall(port, "POST", "/v1/responses",
                    R"({"input":"hi","max_output_tokens":1)" + extra + "}",
                    key);
  };
  auto kept = respond("key-a", "");
  ASSERT_EQ(kept.status, 200) << kept.raw;
  const std::string a_id = kept.body["id"];
  // eager's cap is a quarter of its quota of 12: 3.
  std::vector<std::string> eager;
  for (int i = 0; i < 10; ++i) {
    auto r = respond("key-e", "");
    ASSERT_EQ(r.status, 200) << r.raw;
    eager.push_back(r.body["id"]);
  }
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(
        HttpCall(port, "GET", "/v1/responses/" + eager[i], "", "key-e").status,
        i < 7 ? 404 : 200)
        << i;
  }
  // The store holds 10 in all: bulk, holding the most, gives up its own
  // oldest once alpha's one and eager's three are in.
  for (int i = 0; i < 12; ++i) {
    ASSERT_EQ(respond("key-b", "").status, 200);
  }
  // An evicted response's session is deleted in the background.
  size_t held = 0;
  for (int i = 0; i < 100; ++i) {
    held =
        HttpCall(port, "GET", "/v1/sessions", "", "key-b").body["data"].size();
    if (held == 6) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(held, 6u);
  for (int i = 7; i < 10; ++i) {
    EXPECT_EQ(
        HttpCall(port, "GET", "/v1/responses/" + eager[i], "", "key-e").status,
        200)
        << i;
  }
  // alpha's response, its session and a follow-up of it are all there.
  EXPECT_EQ(HttpCall(port, "GET", "/v1/responses/" + a_id, "", "key-a").status,
            200);
  EXPECT_EQ(HttpCall(port, "GET", "/v1/sessions/" + a_id, "", "key-a").status,
            200);
  auto follow = respond("key-a", R"(,"previous_response_id":")" + a_id + "\"");
  EXPECT_EQ(follow.status, 200) << follow.raw;
}

// Two tenants on one server with rounds of eight requests. A tenant
// flooding past its token rate is refused (RESOURCE_EXHAUSTED with
// retry-after-ms) and takes no more than its rate; a tenant with no rate
// flooding the scheduler with long prefills gets its share of each round,
// not all of it. Meanwhile every decode step of the other tenant, each
// with a deadline of one second (the bound), is answered in time.
TEST(Tenants, AFloodingTenantCannotPushAnothersStepsPastTheirDeadlines) {
  KeyFile keys;
  nlohmann::json flood = Key("key-flood", "flood");
  flood["tokens_per_second"] = 20000;
  keys.Write({flood, Key("key-hog", "hog"), Key("key-steady", "steady")});
  auto server = ServerProcess::Start({"--api-keys", keys.path.string(),
                                      "--model", "none", "--max-batch", "8",
                                      "--prefill-tokens-per-round", "4096"});
  ASSERT_NE(server, nullptr);
  Caller steady(*server, "key-steady");
  v1::Session mine;
  ASSERT_TRUE(steady.Create("steady", &mine).ok());

  struct Flooded {
    std::atomic<uint64_t> admitted_tokens{0}, refused{0}, hinted{0};
  };
  constexpr int kThreads = 12;
  constexpr int kTokens = 4000;
  // Floods for `seconds` with prefills of kTokens from kThreads threads,
  // each on a session of its own, as the tenant of `key`.
  auto flood_with = [&](const std::string& key, double seconds, Flooded& out) {
    std::vector<std::thread> threads;
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::duration<double>(seconds);
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&server, &out, until, key] {
        Caller c(*server, key);
        v1::Session s;
        if (!c.Create("", &s).ok()) return;
        v1::PrefillRequest req;
        req.set_session_id(s.session_id());
        req.set_tokens(kTokens);
        for (int i = 0; i < kTokens * 2; ++i) {
          req.add_q(0.25f), req.add_k(0.5f), req.add_v(1.0f);
        }
        while (std::chrono::steady_clock::now() < until) {
          grpc::ClientContext ctx;
          v1::PrefillResponse resp;
          const grpc::Status st = c.attention().Prefill(&ctx, req, &resp);
          if (st.ok()) {
            out.admitted_tokens += kTokens;
          } else if (st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
            ++out.refused;
            if (ctx.GetServerTrailingMetadata().count("retry-after-ms") != 0) {
              ++out.hinted;
            }
          }
        }
      });
    }
    return threads;
  };
  // The other tenant's decode steps, one stream each, deadline 1 s.
  auto steps_within_deadline = [&](int n) {
    int late = 0;
    for (int i = 0; i < n; ++i) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(1));
      auto stream = steady.attention().Decode(&ctx);
      v1::DecodeRequest step;
      step.set_session_id(mine.session_id());
      OneToken(step);
      v1::DecodeResponse out;
      const bool answered = stream->Write(step) && stream->Read(&out);
      stream->WritesDone();
      if (!answered || !stream->Finish().ok()) ++late;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return late;
  };

  {  // Past its rate: refused, with a hint, and held to the rate.
    Flooded f;
    const auto start = std::chrono::steady_clock::now();
    auto threads = flood_with("key-flood", 3.0, f);
    EXPECT_EQ(steps_within_deadline(40), 0);
    for (auto& t : threads) t.join();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    EXPECT_GT(f.refused.load(), 0u);
    EXPECT_EQ(f.hinted.load(), f.refused.load());
    // A second's burst, the rate since, and the requests admitted while
    // the bucket was not yet in debt (at most one per thread at a time).
    EXPECT_LE(f.admitted_tokens.load(),
              20000 * (1 + seconds) + kThreads * kTokens)
        << "in " << seconds << " s";
  }
  {  // No rate, but many long prefills: the scheduler shares its rounds.
    Flooded f;
    auto threads = flood_with("key-hog", 3.0, f);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_EQ(steps_within_deadline(40), 0);
    for (auto& t : threads) t.join();
    EXPECT_EQ(f.refused.load(), 0u);
    EXPECT_GT(f.admitted_tokens.load(), 0u);
  }
}

TEST(Tenants, OverHttpARateRefusalIs429WithRetryAfter) {
  KeyFile keys;
  nlohmann::json slow = Key("key-slow", "slow");
  slow["tokens_per_second"] = 10;
  keys.Write(nlohmann::json::array({slow}));
  auto server = ServerProcess::Start({"--api-keys", keys.path.string()});
  ASSERT_NE(server, nullptr);
  const std::string body =
      R"({"prompt":"In the beginning","max_tokens":20,"temperature":0})";
  // Admitted with a full bucket (10 tokens); charged 16 + 20, so the next
  // request finds the bucket in debt.
  auto first = testing::HttpCall(server->http_port(), "POST", "/v1/completions",
                                 body, "key-slow");
  ASSERT_EQ(first.status, 200) << first.raw;
  httplib::Client c("127.0.0.1", server->http_port());
  c.set_bearer_token_auth("key-slow");
  auto second = c.Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(second);
  EXPECT_EQ(second->status, 429) << second->body;
  int retry = 0;
  ASSERT_TRUE(absl::SimpleAtoi(second->get_header_value("Retry-After"), &retry))
      << second->body;
  EXPECT_GE(retry, 1);
  EXPECT_LE(retry, 4);  // a debt of at most 26 tokens at 10 per second
  EXPECT_NE(second->body.find("past its rate"), std::string::npos);
}

// A listener other machines can reach checks credentials, or the operator
// says it need not: 0.0.0.0 without keys or client certificates is refused
// at start, naming the flag and what to give.
TEST(Tenants, ANonLoopbackListenerNeedsCredentials) {
  KeyFile keys;
  keys.Write(StandardKeys());
  const std::string log = keys.path.string() + ".log";
  for (const std::vector<std::string>& listen :
       {std::vector<std::string>{"--listen", "0.0.0.0:0"},
        std::vector<std::string>{"--http-listen", "0.0.0.0:0"}}) {
    std::vector<std::string> args = listen;
    args.insert(args.end(), {"--model", "none"});
    EXPECT_EQ(ServerProcess::Start(args, log), nullptr);
    std::ifstream in(log);
    const std::string text((std::istreambuf_iterator<char>(in)),
                           std::istreambuf_iterator<char>());
    EXPECT_NE(text.find(listen[0] + ": 0.0.0.0:0 is not a loopback address"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("--api-keys"), std::string::npos);
    for (const std::vector<std::string>& allowed :
         {std::vector<std::string>{"--allow-unauthenticated"},
          std::vector<std::string>{"--api-keys", keys.path.string()}}) {
      std::vector<std::string> ok = args;
      ok.insert(ok.end(), allowed.begin(), allowed.end());
      EXPECT_NE(ServerProcess::Start(ok), nullptr) << allowed[0];
    }
  }
  std::filesystem::remove(log);
}

}  // namespace
}  // namespace linattn
