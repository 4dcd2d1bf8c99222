// AttentionService end to end: a real linattn-server process on 127.0.0.1
// with an ephemeral port, real gRPC clients.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <thread>

#include "core/attention/chunkwise.h"
#include "core/attention/recurrent.h"
#include "core/attention/reference.h"
#include "core/onednn/matmul.h"
#include "grpc_health/v1/health.grpc.pb.h"
#include "linattn/v1/attention.grpc.pb.h"
#include "tests/attention/test_util.h"
#include "tests/integration/attention_calls.h"
#include "tests/integration/http_call.h"
#include "tests/integration/server_process.h"
#include "tests/util/temp_dir.h"

namespace linattn {
namespace {

using ::testing::HasSubstr;
using testing::ServerProcess;
using Stub = v1::AttentionService::Stub;

v1::AttentionSpec ProtoSpec(uint32_t heads, uint32_t dk, uint32_t dv,
                            const std::string& map = "elu1",
                            std::optional<float> epsilon = 0.0f) {
  v1::AttentionSpec s;
  s.set_num_heads(heads);
  s.set_key_dim(dk);
  s.set_value_dim(dv);
  s.set_feature_map(map);
  if (epsilon) s.set_epsilon(*epsilon);
  return s;
}

// The core spec a session reports (as resolved by the server).
AttentionSpec CoreSpec(const v1::Session& session) {
  const v1::AttentionSpec& p = session.spec();
  AttentionSpec s;
  s.num_heads = p.num_heads();
  s.key_dim = p.key_dim();
  s.value_dim = p.value_dim();
  s.feature_map = *ParseFeatureMap(p.feature_map());
  s.unnormalized = p.unnormalized();
  s.epsilon = p.epsilon();
  s.decay.assign(p.decay().begin(), p.decay().end());
  s.feature_dim = s.feature_map == FeatureMapKind::kFavor ? p.feature_dim() : 0;
  s.seed = p.seed();
  s.horizon = p.horizon();
  return s;
}

v1::Session Create(Stub& stub, const v1::AttentionSpec& spec,
                   const std::string& id = "") {
  grpc::ClientContext ctx;
  v1::CreateSessionRequest req;
  *req.mutable_spec() = spec;
  req.set_session_id(id);
  v1::Session session;
  grpc::Status s = stub.CreateSession(&ctx, req, &session);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return session;
}

// One step of token t of `data` for session `id`.
v1::DecodeRequest StepOf(const std::string& id, const testing::Tokens& data,
                         const AttentionSpec& spec, uint64_t t) {
  const uint64_t qk = uint64_t(spec.num_heads) * spec.key_dim;
  const uint64_t vv = uint64_t(spec.num_heads) * spec.value_dim;
  v1::DecodeRequest req;
  req.set_session_id(id);
  req.mutable_q()->Add(data.q.begin() + t * qk, data.q.begin() + (t + 1) * qk);
  req.mutable_k()->Add(data.k.begin() + t * qk, data.k.begin() + (t + 1) * qk);
  req.mutable_v()->Add(data.v.begin() + t * vv, data.v.begin() + (t + 1) * vv);
  return req;
}

struct StreamResult {
  grpc::Status status;
  std::vector<float> output;  // tokens × H × d_v
  std::vector<uint8_t> available;
  uint64_t last_position = 0;
};

// Decodes `tokens` tokens [first, first+count) of `data` over one stream.
StreamResult DecodeStream(Stub& stub, const std::string& id,
                          const testing::Tokens& data,
                          const AttentionSpec& spec, uint64_t first,
                          uint64_t count,
                          grpc::ClientContext* ctx_in = nullptr) {
  grpc::ClientContext local;
  grpc::ClientContext* ctx = ctx_in != nullptr ? ctx_in : &local;
  auto stream = stub.Decode(ctx);
  StreamResult r;
  for (uint64_t t = first; t < first + count; ++t) {
    if (!stream->Write(StepOf(id, data, spec, t))) break;
    v1::DecodeResponse resp;
    if (!stream->Read(&resp)) break;
    r.output.insert(r.output.end(), resp.output().begin(), resp.output().end());
    for (bool a : resp.available()) r.available.push_back(a);
    r.last_position = resp.position();
  }
  stream->WritesDone();
  r.status = stream->Finish();
  return r;
}

v1::InspectResponse Inspect(Stub& stub, const std::string& id) {
  grpc::ClientContext ctx;
  v1::InspectRequest req;
  req.set_session_id(id);
  v1::InspectResponse resp;
  EXPECT_TRUE(stub.Inspect(&ctx, req, &resp).ok());
  return resp;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

class AttentionServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = ServerProcess::Start();
    ASSERT_NE(server_, nullptr) << "linattn-server did not start";
    stub_ = v1::AttentionService::NewStub(server_->Channel());
  }
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<Stub> stub_;
};

TEST_F(AttentionServiceTest, HealthIsServing) {
  auto health = grpc::health::v1::Health::NewStub(server_->Channel());
  for (const char* service : {"", "linattn.v1.AttentionService"}) {
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse resp;
    ASSERT_TRUE(health->Check(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING)
        << service;
  }
}

TEST_F(AttentionServiceTest, SessionLifecycle) {
  v1::Session a = Create(*stub_, ProtoSpec(8, 64, 64, "elu1", std::nullopt));
  EXPECT_EQ(a.session_id().size(), 32u);       // 128 random bits in hex
  EXPECT_FLOAT_EQ(a.spec().epsilon(), 1e-6f);  // the server default, reported
  EXPECT_EQ(a.state_bytes(), 8u * (64 * 64 + 64) * 4);
  EXPECT_EQ(a.position(), 0u);
  v1::Session b = Create(*stub_, ProtoSpec(2, 4, 4), "client.chosen-id_1");
  EXPECT_EQ(b.session_id(), "client.chosen-id_1");

  grpc::ClientContext dup_ctx;
  v1::CreateSessionRequest dup;
  *dup.mutable_spec() = ProtoSpec(2, 4, 4);
  dup.set_session_id("client.chosen-id_1");
  v1::Session ignored;
  EXPECT_EQ(stub_->CreateSession(&dup_ctx, dup, &ignored).error_code(),
            grpc::StatusCode::ALREADY_EXISTS);
  grpc::ClientContext bad_ctx;
  dup.set_session_id("no spaces allowed");
  grpc::Status bad = stub_->CreateSession(&bad_ctx, dup, &ignored);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.error_message(), HasSubstr("session_id"));

  grpc::ClientContext list_ctx;
  v1::ListSessionsResponse list;
  ASSERT_TRUE(stub_->ListSessions(&list_ctx, {}, &list).ok());
  EXPECT_EQ(list.sessions_size(), 2);

  grpc::ClientContext get_ctx;
  v1::GetSessionRequest get;
  get.set_session_id(a.session_id());
  v1::Session got;
  ASSERT_TRUE(stub_->GetSession(&get_ctx, get, &got).ok());
  EXPECT_EQ(got.state_bytes(), a.state_bytes());

  for (int round = 0; round < 2; ++round) {
    grpc::ClientContext del_ctx;
    v1::DeleteSessionRequest del;
    del.set_session_id(a.session_id());
    v1::DeleteSessionResponse del_resp;
    EXPECT_EQ(stub_->DeleteSession(&del_ctx, del, &del_resp).error_code(),
              round == 0 ? grpc::StatusCode::OK : grpc::StatusCode::NOT_FOUND);
  }
  grpc::ClientContext gone_ctx;
  EXPECT_EQ(stub_->GetSession(&gone_ctx, get, &got).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

// Several sessions of different specs decoding at once over concurrent
// streams: every output is bit-identical to the local recurrent step (the
// batched step runs the same kernel per head), so no state leaks between
// sessions and no step is lost.
// Sessions of four specs (elu1, FAVOR+ with a seed, relu with per-head
// decay, a wide one) and `tokens` random tokens for each.
struct MixedSessions {
  std::vector<v1::Session> sessions;
  std::vector<testing::Tokens> data;
};
MixedSessions CreateMixedSessions(Stub& stub, uint64_t tokens, uint64_t seed) {
  std::vector<v1::AttentionSpec> specs = {
      ProtoSpec(4, 16, 8), ProtoSpec(2, 8, 8, "favor"),
      ProtoSpec(3, 5, 7, "relu"), ProtoSpec(8, 32, 32)};
  specs[2].add_decay(0.9f);
  specs[2].add_decay(1.0f);
  specs[2].add_decay(0.5f);
  specs[1].set_seed(77);
  MixedSessions m;
  for (size_t i = 0; i < specs.size(); ++i) {
    m.sessions.push_back(Create(stub, specs[i]));
    m.data.push_back(
        testing::RandomTokens(CoreSpec(m.sessions[i]), tokens, seed + i));
  }
  return m;
}

// `got` (all of `data`'s tokens, stepped on the server) equals the local
// recurrent step bit for bit, and the session sits at the end of `data`.
void ExpectSameAsLocalSteps(Stub& stub, const v1::Session& session,
                            const testing::Tokens& data,
                            const std::vector<float>& got) {
  const AttentionSpec spec = CoreSpec(session);
  Attention attention = *Attention::Create(spec);
  AttentionState state = attention.NewState();
  testing::Outputs local(spec, data.tokens);
  ASSERT_TRUE(StepSequence(attention, state, data.input(), local.view()).ok());
  EXPECT_TRUE(SameBits(got, local.output)) << session.session_id();
  EXPECT_EQ(Inspect(stub, session.session_id()).position(), data.tokens);
}

TEST_F(AttentionServiceTest, ConcurrentDecodeMatchesLocalRecurrent) {
  constexpr uint64_t kTokens = 60;
  const MixedSessions m = CreateMixedSessions(*stub_, kTokens, 100);
  std::vector<StreamResult> results(m.sessions.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < m.sessions.size(); ++i) {
    threads.emplace_back([&, i] {
      results[i] = DecodeStream(*stub_, m.sessions[i].session_id(), m.data[i],
                                CoreSpec(m.sessions[i]), 0, kTokens);
    });
  }
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < m.sessions.size(); ++i) {
    ASSERT_TRUE(results[i].status.ok()) << results[i].status.error_message();
    EXPECT_EQ(results[i].last_position, kTokens);
    ExpectSameAsLocalSteps(*stub_, m.sessions[i], m.data[i], results[i].output);
  }
}

// DecodeBatch carries sessions of different specs in one message; each
// session's outputs are bit for bit those of the local recurrent step, and
// a batch stream and a per-session Decode stream interleave in order.
TEST_F(AttentionServiceTest, DecodeBatchMatchesLocalRecurrent) {
  constexpr uint64_t kTokens = 24;
  const MixedSessions m = CreateMixedSessions(*stub_, kTokens, 300);
  const std::vector<v1::Session>& sessions = m.sessions;
  const std::vector<testing::Tokens>& data = m.data;
  std::vector<std::vector<float>> got(sessions.size());
  grpc::ClientContext ctx;
  auto stream = stub_->DecodeBatch(&ctx);
  for (uint64_t t = 0; t < kTokens; ++t) {
    if (t == kTokens / 2) {
      // Session 0's middle tokens go through its own Decode stream.
      StreamResult r = DecodeStream(*stub_, sessions[0].session_id(), data[0],
                                    CoreSpec(sessions[0]), t, 3);
      ASSERT_TRUE(r.status.ok()) << r.status.error_message();
      got[0].insert(got[0].end(), r.output.begin(), r.output.end());
    }
    v1::DecodeBatchRequest req;
    std::vector<size_t> who;                      // the session of each step
    for (size_t i = sessions.size(); i-- > 0;) {  // any order works
      const uint64_t token = i == 0 && t >= kTokens / 2 ? t + 3 : t;
      if (token >= kTokens) continue;
      *req.add_steps() = StepOf(sessions[i].session_id(), data[i],
                                CoreSpec(sessions[i]), token);
      who.push_back(i);
    }
    ASSERT_TRUE(stream->Write(req));
    v1::DecodeBatchResponse resp;
    ASSERT_TRUE(stream->Read(&resp));
    ASSERT_EQ(resp.steps_size(), req.steps_size());
    for (int j = 0; j < resp.steps_size(); ++j) {
      got[who[j]].insert(got[who[j]].end(), resp.steps(j).output().begin(),
                         resp.steps(j).output().end());
    }
    EXPECT_EQ(resp.steps(0).position(), t + 1);  // the last session
  }
  stream->WritesDone();
  grpc::Status status = stream->Finish();
  ASSERT_TRUE(status.ok()) << status.error_message();
  for (size_t i = 0; i < sessions.size(); ++i) {
    ExpectSameAsLocalSteps(*stub_, sessions[i], data[i], got[i]);
  }
}

// A bad message names steps[i], ends the stream, and changes no session,
// not even those whose steps in the same message were fine.
TEST_F(AttentionServiceTest, DecodeBatchErrorsChangeNoSession) {
  const v1::Session a = Create(*stub_, ProtoSpec(2, 4, 4));
  const v1::Session b = Create(*stub_, ProtoSpec(2, 4, 4));
  const AttentionSpec spec = CoreSpec(a);
  const testing::Tokens data = testing::RandomTokens(spec, 4, 9);
  // Both sessions one token in, so "unchanged" is a non-trivial state.
  for (const v1::Session& s : {a, b}) {
    ASSERT_TRUE(
        DecodeStream(*stub_, s.session_id(), data, spec, 0, 1).status.ok());
  }
  const v1::InspectResponse a0 = Inspect(*stub_, a.session_id());
  const v1::InspectResponse b0 = Inspect(*stub_, b.session_id());

  struct Case {
    const char* name;
    std::function<void(v1::DecodeBatchRequest&)> mutate;
    grpc::StatusCode code;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"empty", [](v1::DecodeBatchRequest& r) { r.clear_steps(); },
       grpc::StatusCode::INVALID_ARGUMENT, "steps: at least one step"},
      {"unknown session",
       [](v1::DecodeBatchRequest& r) {
         r.mutable_steps(1)->set_session_id("no-such-session");
       },
       grpc::StatusCode::NOT_FOUND, "steps[1]."},
      {"wrong size",
       [](v1::DecodeBatchRequest& r) {
         r.mutable_steps(1)->mutable_v()->Add(1);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "steps[1].v: expected 8 floats"},
      {"non-finite",
       [](v1::DecodeBatchRequest& r) {
         r.mutable_steps(1)->set_k(3, std::nanf(""));
       },
       grpc::StatusCode::INVALID_ARGUMENT, "steps[1].k[3]: must be finite"},
      {"duplicate session",
       [&](v1::DecodeBatchRequest& r) {
         r.mutable_steps(1)->set_session_id(a.session_id());
       },
       grpc::StatusCode::INVALID_ARGUMENT, "steps[1].session_id: '"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    v1::DecodeBatchRequest req;
    *req.add_steps() = StepOf(a.session_id(), data, spec, 1);
    *req.add_steps() = StepOf(b.session_id(), data, spec, 1);
    c.mutate(req);
    grpc::ClientContext ctx;
    auto stream = stub_->DecodeBatch(&ctx);
    stream->Write(req);
    v1::DecodeBatchResponse resp;
    EXPECT_FALSE(stream->Read(&resp));
    stream->WritesDone();
    const grpc::Status status = stream->Finish();
    EXPECT_EQ(status.error_code(), c.code) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(c.message));
    for (const auto& [id, before] :
         {std::pair{a.session_id(), a0}, std::pair{b.session_id(), b0}}) {
      const v1::InspectResponse now = Inspect(*stub_, id);
      EXPECT_EQ(now.position(), before.position()) << id;
      EXPECT_TRUE(SameBits({now.s().begin(), now.s().end()},
                           {before.s().begin(), before.s().end()}))
          << id;
      EXPECT_TRUE(SameBits({now.z().begin(), now.z().end()},
                           {before.z().begin(), before.z().end()}))
          << id;
    }
  }
}

// Floats as packed little-endian float32 bytes, as a client writes them.
std::string Packed(const float* data, uint64_t n) {
  return std::string(reinterpret_cast<const char*>(data), n * sizeof(float));
}
std::vector<float> Unpacked(const std::string& bytes) {
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

// Tensors as bytes: the same session history sent as q_bytes/k_bytes/
// v_bytes (Prefill, Decode, DecodeBatch; one tensor per form mixed in too)
// gives the same bits as the repeated floats, and the answer comes as
// output_bytes/denominator_bytes exactly when q came as bytes.
TEST_F(AttentionServiceTest, TensorsAsBytesGiveTheSameBits) {
  const v1::Session floats = Create(*stub_, ProtoSpec(4, 16, 8));
  const v1::Session bytes = Create(*stub_, ProtoSpec(4, 16, 8));
  const AttentionSpec spec = CoreSpec(floats);
  constexpr uint64_t kPrefix = 40, kSteps = 6;
  const testing::Tokens data = testing::RandomTokens(spec, kPrefix + kSteps, 9);
  const uint64_t qk = 4 * 16, vv = 4 * 8;

  v1::PrefillResponse by_floats, by_bytes;
  {
    grpc::ClientContext ctx;
    v1::PrefillRequest req;
    req.set_session_id(floats.session_id());
    req.set_tokens(kPrefix);
    req.mutable_q()->Add(data.q.begin(), data.q.begin() + kPrefix * qk);
    req.mutable_k()->Add(data.k.begin(), data.k.begin() + kPrefix * qk);
    req.mutable_v()->Add(data.v.begin(), data.v.begin() + kPrefix * vv);
    ASSERT_TRUE(stub_->Prefill(&ctx, req, &by_floats).ok());
  }
  {
    grpc::ClientContext ctx;
    v1::PrefillRequest req;
    req.set_session_id(bytes.session_id());
    req.set_tokens(kPrefix);
    req.set_q_bytes(Packed(data.q.data(), kPrefix * qk));
    req.set_k_bytes(Packed(data.k.data(), kPrefix * qk));
    req.mutable_v()->Add(data.v.begin(), data.v.begin() + kPrefix * vv);
    ASSERT_TRUE(stub_->Prefill(&ctx, req, &by_bytes).ok());
  }
  EXPECT_TRUE(by_bytes.output().empty());
  EXPECT_TRUE(by_bytes.denominator().empty());
  EXPECT_EQ(by_floats.output_bytes(), "");
  EXPECT_TRUE(SameBits(Unpacked(by_bytes.output_bytes()),
                       {by_floats.output().begin(), by_floats.output().end()}));
  EXPECT_TRUE(SameBits(
      Unpacked(by_bytes.denominator_bytes()),
      {by_floats.denominator().begin(), by_floats.denominator().end()}));
  EXPECT_TRUE(
      std::equal(by_bytes.available().begin(), by_bytes.available().end(),
                 by_floats.available().begin(), by_floats.available().end()));

  // Decode: one step each way, then a DecodeBatch of both sessions.
  StreamResult reference =
      DecodeStream(*stub_, floats.session_id(), data, spec, kPrefix, 1);
  ASSERT_TRUE(reference.status.ok());
  {
    grpc::ClientContext ctx;
    auto stream = stub_->Decode(&ctx);
    v1::DecodeRequest step = StepOf(bytes.session_id(), data, spec, kPrefix);
    step.set_q_bytes(Packed(step.q().data(), step.q_size()));
    step.clear_q();
    step.set_v_bytes(Packed(step.v().data(), step.v_size()));
    step.clear_v();
    ASSERT_TRUE(stream->Write(step));
    v1::DecodeResponse resp;
    ASSERT_TRUE(stream->Read(&resp));
    EXPECT_TRUE(resp.output().empty());
    EXPECT_TRUE(SameBits(Unpacked(resp.output_bytes()), reference.output));
    stream->WritesDone();
    ASSERT_TRUE(stream->Finish().ok());
  }
  {
    grpc::ClientContext ctx;
    auto stream = stub_->DecodeBatch(&ctx);
    v1::DecodeBatchRequest batch;
    *batch.add_steps() = StepOf(floats.session_id(), data, spec, kPrefix + 1);
    v1::DecodeRequest* b = batch.add_steps();
    *b = StepOf(bytes.session_id(), data, spec, kPrefix + 1);
    b->set_q_bytes(Packed(b->q().data(), b->q_size()));
    b->clear_q();
    b->set_k_bytes(Packed(b->k().data(), b->k_size()));
    b->clear_k();
    b->set_v_bytes(Packed(b->v().data(), b->v_size()));
    b->clear_v();
    ASSERT_TRUE(stream->Write(batch));
    v1::DecodeBatchResponse resp;
    ASSERT_TRUE(stream->Read(&resp));
    ASSERT_EQ(resp.steps_size(), 2);
    EXPECT_FALSE(resp.steps(0).output().empty());
    EXPECT_TRUE(resp.steps(1).output().empty());
    EXPECT_TRUE(SameBits(
        Unpacked(resp.steps(1).output_bytes()),
        {resp.steps(0).output().begin(), resp.steps(0).output().end()}));
    EXPECT_TRUE(SameBits(Unpacked(resp.steps(1).denominator_bytes()),
                         {resp.steps(0).denominator().begin(),
                          resp.steps(0).denominator().end()}));
    stream->WritesDone();
    ASSERT_TRUE(stream->Finish().ok());
  }
  const v1::InspectResponse a = Inspect(*stub_, floats.session_id());
  const v1::InspectResponse c = Inspect(*stub_, bytes.session_id());
  EXPECT_EQ(c.position(), kPrefix + 2);
  EXPECT_TRUE(
      SameBits({a.s().begin(), a.s().end()}, {c.s().begin(), c.s().end()}));
  EXPECT_TRUE(
      SameBits({a.z().begin(), a.z().end()}, {c.z().begin(), c.z().end()}));
}

// Bytes tensors are checked like repeated ones, naming the field, and a
// refused request changes nothing: a length that is not the tensor's, a
// tensor given in both forms, and a gate the rule does not take.
TEST_F(AttentionServiceTest, BadBytesTensorsAreRefusedNamingTheField) {
  const v1::Session session = Create(*stub_, ProtoSpec(2, 8, 4));
  const AttentionSpec spec = CoreSpec(session);
  const testing::Tokens data = testing::RandomTokens(spec, 3, 4);
  auto prefill = [&](const std::function<void(v1::PrefillRequest&)>& edit) {
    grpc::ClientContext ctx;
    v1::PrefillRequest req;
    req.set_session_id(session.session_id());
    req.set_tokens(3);
    req.set_q_bytes(Packed(data.q.data(), 3 * 16));
    req.set_k_bytes(Packed(data.k.data(), 3 * 16));
    req.set_v_bytes(Packed(data.v.data(), 3 * 8));
    edit(req);
    v1::PrefillResponse resp;
    return stub_->Prefill(&ctx, req, &resp);
  };
  const v1::InspectResponse before = Inspect(*stub_, session.session_id());
  grpc::Status s =
      prefill([](v1::PrefillRequest& r) { r.mutable_k_bytes()->pop_back(); });
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              HasSubstr("k_bytes: expected 192 bytes (48 float32 values"));
  s = prefill([&](v1::PrefillRequest& r) {
    r.mutable_q()->Add(data.q.begin(), data.q.begin() + 3 * 16);
  });
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              HasSubstr("q, q_bytes: one tensor given twice"));
  s = prefill([](v1::PrefillRequest& r) {
    r.set_g_bytes(std::string(3 * 2 * sizeof(float), '\0'));
  });
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("g_bytes: rule linear takes no"));
  // A token count whose tensors no message could carry is refused before
  // any size is computed from it (4 bytes of q would otherwise pass a
  // wrapped-around length check).
  s = prefill([](v1::PrefillRequest& r) {
    r.set_tokens(4294967295u);
    r.set_q_bytes(std::string(4, '\0'));
  });
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("tokens: 4294967295 tokens"));
  const v1::InspectResponse after = Inspect(*stub_, session.session_id());
  EXPECT_EQ(after.position(), before.position());
  EXPECT_TRUE(SameBits({before.s().begin(), before.s().end()},
                       {after.s().begin(), after.s().end()}));
  EXPECT_TRUE(prefill([](v1::PrefillRequest&) {}).ok());
  EXPECT_EQ(Inspect(*stub_, session.session_id()).position(), 3u);
}

TEST_F(AttentionServiceTest, PrefillThenDecodeEqualsDecodeAlone) {
  const v1::Session a = Create(*stub_, ProtoSpec(4, 16, 16));
  const v1::Session b = Create(*stub_, ProtoSpec(4, 16, 16));
  const AttentionSpec spec = CoreSpec(a);
  constexpr uint64_t kTokens = 300, kPrefix = 230;
  const testing::Tokens data = testing::RandomTokens(spec, kTokens, 5);

  grpc::ClientContext ctx;
  v1::PrefillRequest req;
  req.set_session_id(a.session_id());
  req.set_tokens(kPrefix);
  const uint64_t qk = kPrefix * 4 * 16;
  req.mutable_q()->Add(data.q.begin(), data.q.begin() + qk);
  req.mutable_k()->Add(data.k.begin(), data.k.begin() + qk);
  req.mutable_v()->Add(data.v.begin(), data.v.begin() + qk);
  v1::PrefillResponse resp;
  ASSERT_TRUE(stub_->Prefill(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.position(), kPrefix);
  ASSERT_EQ(resp.output_size(), int(qk));
  ASSERT_EQ(resp.available_size(), int(kPrefix * 4));
  StreamResult rest = DecodeStream(*stub_, a.session_id(), data, spec, kPrefix,
                                   kTokens - kPrefix);
  ASSERT_TRUE(rest.status.ok());
  StreamResult alone =
      DecodeStream(*stub_, b.session_id(), data, spec, 0, kTokens);
  ASSERT_TRUE(alone.status.ok());

  // Both against the double reference, within the fp32 bound.
  Attention attention = *Attention::Create(spec);
  const ReferenceResult ref = ReferenceAttention(attention, data.input());
  testing::Outputs via_prefill(spec, kTokens), via_decode(spec, kTokens);
  std::copy(resp.output().begin(), resp.output().end(),
            via_prefill.output.begin());
  std::copy(resp.denominator().begin(), resp.denominator().end(),
            via_prefill.denominator.begin());
  std::copy(resp.available().begin(), resp.available().end(),
            via_prefill.available.begin());
  std::copy(rest.output.begin(), rest.output.end(),
            via_prefill.output.begin() + qk);
  std::copy(rest.available.begin(), rest.available.end(),
            via_prefill.available.begin() + kPrefix * 4);
  via_decode.output = alone.output;
  via_decode.available = alone.available;
  // Denominators of the streamed tokens are checked by the local tests;
  // here take the reference's so only outputs are compared.
  for (uint64_t i = kPrefix * 4; i < kTokens * 4; ++i) {
    via_prefill.denominator[i] = static_cast<float>(ref.denominator[i]);
  }
  for (uint64_t i = 0; i < kTokens * 4; ++i) {
    via_decode.denominator[i] = static_cast<float>(ref.denominator[i]);
  }
  testing::ExpectMatchesReference(attention, ref, via_prefill,
                                  "prefill then decode");
  testing::ExpectMatchesReference(attention, ref, via_decode, "decode alone");
}

// --prefill-precision bf16: a Prefill through the server is within the
// bf16 bound of the double reference (docs/design.md §1), and is not the
// fp32 prefill's result (the rounding happened); decode after it stays
// within the bound too.
TEST(AttentionServiceBf16Prefill, PrefillIsWithinTheBf16Bound) {
  if (!NativeBf16Products()) GTEST_SKIP() << "no native bf16 products here";
  auto server = ServerProcess::Start({"--prefill-precision", "bf16"});
  ASSERT_NE(server, nullptr);
  auto stub = v1::AttentionService::NewStub(server->Channel());
  v1::AttentionSpec proto = ProtoSpec(4, 32, 32);
  proto.add_decay(1.0f);
  proto.add_decay(0.99f);
  proto.add_decay(0.9f);
  proto.add_decay(1.0f);
  const v1::Session session = Create(*stub, proto);
  const AttentionSpec spec = CoreSpec(session);
  constexpr uint64_t kTokens = 700, kPrefix = 650;
  const testing::Tokens data = testing::RandomTokens(spec, kTokens, 9);
  const uint64_t qk = kPrefix * 4 * 32;

  grpc::ClientContext ctx;
  v1::PrefillRequest req;
  req.set_session_id(session.session_id());
  req.set_tokens(kPrefix);
  req.mutable_q()->Add(data.q.begin(), data.q.begin() + qk);
  req.mutable_k()->Add(data.k.begin(), data.k.begin() + qk);
  req.mutable_v()->Add(data.v.begin(), data.v.begin() + qk);
  v1::PrefillResponse resp;
  ASSERT_TRUE(stub->Prefill(&ctx, req, &resp).ok());
  ASSERT_EQ(resp.output_size(), int(qk));
  StreamResult rest = DecodeStream(*stub, session.session_id(), data, spec,
                                   kPrefix, kTokens - kPrefix);
  ASSERT_TRUE(rest.status.ok());

  Attention attention = *Attention::Create(spec);
  testing::Outputs got(spec, kTokens);
  std::copy(resp.output().begin(), resp.output().end(), got.output.begin());
  std::copy(resp.denominator().begin(), resp.denominator().end(),
            got.denominator.begin());
  std::copy(resp.available().begin(), resp.available().end(),
            got.available.begin());
  std::copy(rest.output.begin(), rest.output.end(), got.output.begin() + qk);
  std::copy(rest.available.begin(), rest.available.end(),
            got.available.begin() + kPrefix * 4);
  const ReferenceResult ref = ReferenceAttention(attention, data.input());
  for (uint64_t i = kPrefix * 4; i < kTokens * 4; ++i) {
    got.denominator[i] = static_cast<float>(ref.denominator[i]);
  }
  testing::ExpectMatchesReference(attention, ref, got, "bf16 prefill, decode",
                                  testing::Bf16Rounding(attention, data, 64));

  // The rounding happened: the server's outputs are farther from the fp32
  // prefill's than fp32's two forms of a round (one parallel region, or
  // pass by pass; the server may run either) are from each other.
  std::vector<float> f32[2];
  const int threads = omp_get_max_threads();
  for (int form = 0; form < 2; ++form) {
    omp_set_num_threads(form == 0 ? 1 : 2);  // pass by pass; fused
    testing::Outputs out(spec, kPrefix);
    AttentionState state = attention.NewState();
    ASSERT_TRUE(ChunkwiseRunner()
                    .Run(attention, state,
                         {data.q.data(), data.k.data(), data.v.data(), kPrefix},
                         out.view())
                    .ok());
    f32[form] = std::move(out.output);
  }
  omp_set_num_threads(threads);
  double forms = 0, from_f32 = 0;
  for (uint64_t i = 0; i < qk; ++i) {
    forms = std::max(forms, double(std::abs(f32[0][i] - f32[1][i])));
    from_f32 = std::max(from_f32,
                        double(std::min(std::abs(got.output[i] - f32[0][i]),
                                        std::abs(got.output[i] - f32[1][i]))));
  }
  EXPECT_GT(from_f32, 8 * forms)
      << "the server's prefill is an fp32 one: largest difference from fp32 "
      << from_f32 << ", between fp32's two forms " << forms;
}

// On a CPU without native bf16 products (oneDNN held to AVX512_CORE here),
// --prefill-precision bf16 is refused at start, naming the flag and what
// is missing.
TEST(AttentionServiceBf16Prefill, RefusedWithoutNativeBf16) {
  testing::TempDir tmp;
  const std::string log = tmp.Path("log.txt");
  const std::string cmd = "timeout 20 env ONEDNN_MAX_CPU_ISA=AVX512_CORE " +
                          std::string(LINATTN_SERVER_BINARY) +
                          " --listen 127.0.0.1:0 --http-listen none "
                          "--prefill-precision bf16 > " +
                          log + " 2>&1";
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_NE(WEXITSTATUS(status), 0);
  EXPECT_NE(WEXITSTATUS(status), 124) << "the server started";
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_THAT(text, HasSubstr("--prefill-precision: bf16 needs")) << text;
  EXPECT_THAT(text, HasSubstr("AVX512_BF16")) << text;
}

TEST_F(AttentionServiceTest, SnapshotRestoreAndForkContinueBitIdentically) {
  const v1::Session a = Create(*stub_, ProtoSpec(3, 8, 6, "favor"));
  const AttentionSpec spec = CoreSpec(a);
  const testing::Tokens data = testing::RandomTokens(spec, 40, 9);
  ASSERT_TRUE(
      DecodeStream(*stub_, a.session_id(), data, spec, 0, 25).status.ok());

  const v1::Session restored =
      testing::SnapshotAndRestore(*stub_, a.session_id(), "restored");
  EXPECT_EQ(restored.position(), 25u);
  const v1::Session forked = testing::ForkOf(*stub_, a.session_id());
  EXPECT_EQ(forked.position(), 25u);

  std::vector<StreamResult> next;
  for (const std::string& id :
       {a.session_id(), restored.session_id(), forked.session_id()}) {
    next.push_back(DecodeStream(*stub_, id, data, spec, 25, 15));
    ASSERT_TRUE(next.back().status.ok());
  }
  EXPECT_TRUE(SameBits(next[0].output, next[1].output)) << "restored differs";
  EXPECT_TRUE(SameBits(next[0].output, next[2].output)) << "fork differs";
  // Forks evolve independently: more tokens on the fork leave the parent.
  ASSERT_TRUE(
      DecodeStream(*stub_, forked.session_id(), data, spec, 0, 5).status.ok());
  EXPECT_EQ(Inspect(*stub_, a.session_id()).position(), 40u);
  EXPECT_EQ(Inspect(*stub_, forked.session_id()).position(), 45u);
}

TEST_F(AttentionServiceTest, RestoreRefusesDamagedSnapshots) {
  const v1::Session a = Create(*stub_, ProtoSpec(2, 4, 4));
  grpc::ClientContext ctx;
  v1::SnapshotRequest req;
  req.set_session_id(a.session_id());
  v1::SnapshotResponse snap;
  ASSERT_TRUE(stub_->Snapshot(&ctx, req, &snap).ok());
  std::string truncated = snap.state().substr(0, snap.state().size() - 9);
  std::string altered = snap.state();
  altered[altered.size() / 2] ^= 0x40;
  for (const std::string& blob : {truncated, altered, std::string("garbage")}) {
    grpc::ClientContext rctx;
    v1::RestoreRequest r;
    r.set_state(blob);
    v1::Session out;
    grpc::Status s = stub_->Restore(&rctx, r, &out);
    EXPECT_TRUE(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
                s.error_code() == grpc::StatusCode::DATA_LOSS)
        << s.error_code();
    EXPECT_THAT(s.error_message(), HasSubstr("state"));
  }
  grpc::ClientContext list_ctx;
  v1::ListSessionsResponse list;
  ASSERT_TRUE(stub_->ListSessions(&list_ctx, {}, &list).ok());
  EXPECT_EQ(list.sessions_size(), 1) << "a failed restore created a session";
}

// Every bad request names its field and leaves the session exactly as it
// was; a Decode stream ended by a bad message leaves the session usable.
TEST_F(AttentionServiceTest, ErrorsLeaveTheSessionUnchanged) {
  const v1::Session a = Create(*stub_, ProtoSpec(2, 4, 3));
  const AttentionSpec spec = CoreSpec(a);
  const testing::Tokens data = testing::RandomTokens(spec, 10, 3);
  ASSERT_TRUE(
      DecodeStream(*stub_, a.session_id(), data, spec, 0, 4).status.ok());
  const v1::InspectResponse before = Inspect(*stub_, a.session_id());

  auto expect_unchanged = [&](const std::string& what) {
    const v1::InspectResponse after = Inspect(*stub_, a.session_id());
    EXPECT_EQ(after.position(), before.position()) << what;
    EXPECT_TRUE(SameBits({after.s().begin(), after.s().end()},
                         {before.s().begin(), before.s().end()}))
        << what;
    EXPECT_TRUE(SameBits({after.z().begin(), after.z().end()},
                         {before.z().begin(), before.z().end()}))
        << what;
  };
  auto prefill = [&](int tokens, int q, int k, int v, float poison_k) {
    grpc::ClientContext ctx;
    v1::PrefillRequest req;
    req.set_session_id(a.session_id());
    req.set_tokens(tokens);
    for (int i = 0; i < q; ++i) req.add_q(0.1f);
    for (int i = 0; i < k; ++i) req.add_k(i == 5 ? poison_k : 0.2f);
    for (int i = 0; i < v; ++i) req.add_v(0.3f);
    v1::PrefillResponse resp;
    return stub_->Prefill(&ctx, req, &resp);
  };
  grpc::Status s = prefill(2, 15, 16, 12, 0.2f);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("q: expected 16 floats"));
  expect_unchanged("wrong q size");
  s = prefill(2, 16, 16, 12, NAN);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("k[5]"));
  expect_unchanged("NaN in k");
  s = prefill(0, 0, 0, 0, 0);
  EXPECT_THAT(s.error_message(), HasSubstr("tokens"));

  // A bad Decode message ends its stream with the status …
  grpc::ClientContext ctx;
  auto stream = stub_->Decode(&ctx);
  v1::DecodeRequest bad;
  bad.set_session_id(a.session_id());
  for (int i = 0; i < 8; ++i) bad.add_q(0.5f), bad.add_k(0.5f);
  for (int i = 0; i < 5; ++i) bad.add_v(0.5f);  // needs 6
  stream->Write(bad);
  v1::DecodeResponse resp;
  EXPECT_FALSE(stream->Read(&resp));
  s = stream->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("v: expected 6 floats"));
  expect_unchanged("bad decode message");
  // … and a new stream continues where the session was.
  StreamResult more = DecodeStream(*stub_, a.session_id(), data, spec, 4, 2);
  ASSERT_TRUE(more.status.ok());
  EXPECT_EQ(more.last_position, 6u);

  // Unknown session, bad spec, cosine horizon.
  StreamResult missing = DecodeStream(*stub_, "nope", data, spec, 0, 1);
  EXPECT_EQ(missing.status.error_code(), grpc::StatusCode::NOT_FOUND);
  grpc::ClientContext spec_ctx;
  v1::CreateSessionRequest create;
  *create.mutable_spec() = ProtoSpec(2, 4, 3, "softmax");
  v1::Session out;
  s = stub_->CreateSession(&spec_ctx, create, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("spec.feature_map"));
  grpc::ClientContext heads_ctx;
  *create.mutable_spec() = ProtoSpec(0, 4, 3);
  s = stub_->CreateSession(&heads_ctx, create, &out);
  EXPECT_THAT(s.error_message(), HasSubstr("spec.num_heads"));
  v1::AttentionSpec cosine = ProtoSpec(2, 4, 3, "cosine");
  cosine.set_horizon(3);
  const v1::Session c = Create(*stub_, cosine);
  StreamResult past =
      DecodeStream(*stub_, c.session_id(), data, CoreSpec(c), 0, 5);
  EXPECT_EQ(past.status.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_EQ(past.last_position, 3u);
  EXPECT_EQ(Inspect(*stub_, c.session_id()).position(), 3u);
}

TEST_F(AttentionServiceTest, DecodeDeadlineAndCancellation) {
  const v1::Session a = Create(*stub_, ProtoSpec(2, 4, 4));
  const AttentionSpec spec = CoreSpec(a);
  const testing::Tokens data = testing::RandomTokens(spec, 10, 4);
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(300));
    auto stream = stub_->Decode(&ctx);
    v1::DecodeRequest req;
    req.set_session_id(a.session_id());
    req.mutable_q()->Add(data.q.begin(), data.q.begin() + 8);
    req.mutable_k()->Add(data.k.begin(), data.k.begin() + 8);
    req.mutable_v()->Add(data.v.begin(), data.v.begin() + 8);
    ASSERT_TRUE(stream->Write(req));
    v1::DecodeResponse resp;
    ASSERT_TRUE(stream->Read(&resp));
    EXPECT_FALSE(stream->Read(&resp));  // blocks until the deadline passes
    EXPECT_EQ(stream->Finish().error_code(),
              grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  {
    grpc::ClientContext ctx;
    auto stream = stub_->Decode(&ctx);
    ctx.TryCancel();
    v1::DecodeResponse resp;
    EXPECT_FALSE(stream->Read(&resp));
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  // The session took exactly the one token and still works.
  StreamResult after = DecodeStream(*stub_, a.session_id(), data, spec, 1, 2);
  ASSERT_TRUE(after.status.ok());
  EXPECT_EQ(after.last_position, 3u);
}

TEST(AttentionServiceLimits, SessionsMemoryAndMessageSize) {
  auto server = ServerProcess::Start(
      {"--max-sessions", "3", "--max-state-memory", "100KiB",
       "--max-message-bytes", "65536", "--model", "none"});
  ASSERT_NE(server, nullptr);
  auto stub = v1::AttentionService::NewStub(server->Channel());
  const v1::Session a = Create(*stub, ProtoSpec(1, 4, 4));
  // 40,400 bytes of state each: two fit in 100 KiB, three do not.
  const v1::CreateSessionRequest mid = [] {
    v1::CreateSessionRequest r;
    *r.mutable_spec() = ProtoSpec(1, 100, 100);
    return r;
  }();
  v1::Session b, c, d;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->CreateSession(&ctx, mid, &b).ok());
  }
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->CreateSession(&ctx, mid, &c).ok());
  }
  {
    grpc::ClientContext ctx;  // the fourth session
    grpc::Status s = stub->CreateSession(&ctx, mid, &d);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(s.error_message(), HasSubstr("sessions"));
  }
  {
    grpc::ClientContext ctx;
    v1::DeleteSessionRequest del;
    del.set_session_id(a.session_id());
    v1::DeleteSessionResponse resp;
    ASSERT_TRUE(stub->DeleteSession(&ctx, del, &resp).ok());
  }
  {
    grpc::ClientContext ctx;  // a third 40 KB state is over 100 KiB
    grpc::Status s = stub->CreateSession(&ctx, mid, &d);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(s.error_message(), HasSubstr("bytes of state"));
    EXPECT_THAT(s.error_message(), HasSubstr("state memory limit 102400"));
  }
  {
    // A state no message could carry whole is refused at creation, naming
    // the limit, instead of a session that can never be snapshotted.
    grpc::ClientContext ctx;
    v1::CreateSessionRequest big;
    *big.mutable_spec() = ProtoSpec(8, 128, 128);
    grpc::Status s = stub->CreateSession(&ctx, big, &d);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(s.error_message(), HasSubstr("--max-message-bytes"));
  }

  // A prefill message over 64 KiB is refused by the transport.
  grpc::ClientContext pre_ctx;
  v1::PrefillRequest pre;
  pre.set_session_id(b.session_id());
  pre.set_tokens(60);
  for (int i = 0; i < 60 * 100; ++i)
    pre.add_q(0.f), pre.add_k(0.f), pre.add_v(0.f);
  v1::PrefillResponse pre_resp;
  EXPECT_EQ(stub->Prefill(&pre_ctx, pre, &pre_resp).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  // Every session that exists can be inspected and snapshotted.
  grpc::ClientContext inspect_ctx;
  v1::InspectRequest inspect;
  inspect.set_session_id(b.session_id());
  v1::InspectResponse inspect_resp;
  EXPECT_TRUE(stub->Inspect(&inspect_ctx, inspect, &inspect_resp).ok());
  grpc::ClientContext snap_ctx;
  v1::SnapshotRequest snap;
  snap.set_session_id(b.session_id());
  v1::SnapshotResponse snap_resp;
  EXPECT_TRUE(stub->Snapshot(&snap_ctx, snap, &snap_resp).ok());
  grpc::ClientContext get_ctx;
  v1::GetSessionRequest get;
  get.set_session_id(b.session_id());
  v1::Session got;
  ASSERT_TRUE(stub->GetSession(&get_ctx, get, &got).ok());
  EXPECT_EQ(got.position(), 0u);
}

TEST(AttentionServiceEviction, IdleSessionsExpire) {
  // A TTL ten times the gap between the busy session's uses, so that a slow
  // machine (sanitizers, a loaded CI) cannot make the busy one look idle.
  auto server = ServerProcess::Start({"--idle-ttl", "1"});
  ASSERT_NE(server, nullptr);
  auto stub = v1::AttentionService::NewStub(server->Channel());
  const v1::Session idle = Create(*stub, ProtoSpec(1, 2, 2));
  const v1::Session busy = Create(*stub, ProtoSpec(1, 2, 2));
  const testing::Tokens data = testing::RandomTokens(CoreSpec(busy), 30, 1);
  // Keep one session busy for ~2.5 s; the other idles past its TTL.
  for (int i = 0; i < 25; ++i) {
    ASSERT_TRUE(
        DecodeStream(*stub, busy.session_id(), data, CoreSpec(busy), i, 1)
            .status.ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  grpc::ClientContext ctx;
  v1::GetSessionRequest get;
  get.set_session_id(idle.session_id());
  v1::Session out;
  EXPECT_EQ(stub->GetSession(&ctx, get, &out).error_code(),
            grpc::StatusCode::NOT_FOUND);
  grpc::ClientContext ctx2;
  get.set_session_id(busy.session_id());
  ASSERT_TRUE(stub->GetSession(&ctx2, get, &out).ok());
  EXPECT_EQ(out.position(), 25u);
}

// SIGTERM: health turns NOT_SERVING, an open stream may finish its work,
// new calls are refused, and the process exits 0.
// SIGTERM: a Decode stream waiting for its client's next message is idle
// and ends at once (UNAVAILABLE saying why), and the server, with nothing in
// flight, exits without waiting out its grace period. Every step answered
// before is kept.
TEST(AttentionServiceDrain, SigtermEndsIdleStreamsAndExitsAtOnce) {
  auto server = ServerProcess::Start({"--grace-period", "30"});
  ASSERT_NE(server, nullptr);
  auto stub = v1::AttentionService::NewStub(server->Channel());
  const v1::Session a = Create(*stub, ProtoSpec(2, 4, 4));
  const AttentionSpec spec = CoreSpec(a);
  const testing::Tokens data = testing::RandomTokens(spec, 4, 8);
  grpc::ClientContext ctx;
  auto stream = stub->Decode(&ctx);
  v1::DecodeRequest req;
  req.set_session_id(a.session_id());
  req.mutable_q()->Add(data.q.begin(), data.q.begin() + 8);
  req.mutable_k()->Add(data.k.begin(), data.k.begin() + 8);
  req.mutable_v()->Add(data.v.begin(), data.v.begin() + 8);
  v1::DecodeResponse resp;
  ASSERT_TRUE(stream->Write(req) && stream->Read(&resp));
  ASSERT_EQ(resp.position(), 1u);
  // A second, idle connection (a channel of its own).
  auto idle = v1::AttentionService::NewStub(grpc::CreateCustomChannel(
      server->address(), grpc::InsecureChannelCredentials(),
      grpc::ChannelArguments()));
  grpc::ClientContext list_ctx;
  v1::ListSessionsResponse list;
  ASSERT_TRUE(idle->ListSessions(&list_ctx, {}, &list).ok());

  const auto signalled = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(server->pid(), SIGTERM), 0);
  EXPECT_FALSE(stream->Read(&resp));
  const grpc::Status ended = stream->Finish();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(ended.error_message(), HasSubstr("shutting down"));
  const int status = server->Wait(std::chrono::seconds(20));
  ASSERT_NE(status, -1) << "still running 20 s after SIGTERM";
  EXPECT_LT(std::chrono::steady_clock::now() - signalled,
            std::chrono::seconds(10))
      << "waited for its grace period with nothing in flight";
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// SIGTERM while a Decode step waits behind a long prefill of its session:
// the step is applied, so its response is written before the stream ends
// (UNAVAILABLE), and the client learns of every step that changed its
// session.
TEST(AttentionServiceDrain, AStepUnderWayIsAnsweredBeforeTheStreamEnds) {
  // A grace period far longer than the prefill: the step must be answered
  // because it ran, not because the grace ended.
  auto server =
      ServerProcess::Start({"--model", "none", "--prefill-tokens-per-round",
                            "1", "--grace-period", "600"});
  ASSERT_NE(server, nullptr);
  auto stub = v1::AttentionService::NewStub(server->Channel());
  const v1::Session a = Create(*stub, ProtoSpec(1, 2, 2));
  auto prefill_request = [](const std::string& id, int tokens) {
    v1::PrefillRequest r;
    r.set_session_id(id);
    r.set_tokens(tokens);
    for (int i = 0; i < tokens * 2; ++i) {
      r.add_q(0.5f), r.add_k(0.25f), r.add_v(1.0f);
    }
    return r;
  };
  // Rounds of one token take from 20 us to over half a millisecond (a
  // parallel test run): timed here first, on a scratch session, so that
  // the prefill lasts about 2 s at this moment's speed: still running
  // when the step written after it waits behind it.
  int kTokens = 0;
  {
    constexpr int kProbe = 5000;
    const v1::Session scratch = Create(*stub, ProtoSpec(1, 2, 2));
    grpc::ClientContext ctx;
    v1::PrefillResponse resp;
    const auto start = std::chrono::steady_clock::now();
    ASSERT_TRUE(stub->Prefill(&ctx,
                              prefill_request(scratch.session_id(), kProbe),
                              &resp)
                    .ok());
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    kTokens = static_cast<int>(
        std::clamp(2.0 / seconds * kProbe, 20000.0, 2000000.0));
  }
  const v1::PrefillRequest pre = prefill_request(a.session_id(), kTokens);
  grpc::Status prefilled;
  std::thread prefill([&] {
    grpc::ClientContext ctx;
    v1::PrefillResponse resp;
    prefilled = stub->Prefill(&ctx, pre, &resp);
  });
  // Joined however the test ends (a failed ASSERT returns early).
  struct Join {
    std::thread& t;
    ~Join() {
      if (t.joinable()) t.join();
    }
  } join{prefill};
  // The server's own gauges say when the prefill runs, and then when the
  // step waits behind it (it has been read: a step not yet read when the
  // drain begins would be refused).
  auto gauges_reach = [&](const std::string& sample) {
    for (int i = 0; i < 1000; ++i) {
      const auto m = testing::HttpCall(server->http_port(), "GET", "/metrics");
      if (m.raw.find("\n" + sample + "\n") != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  };
  ASSERT_TRUE(gauges_reach("linattn_num_requests_running 1"));
  grpc::ClientContext ctx;
  auto stream = stub->Decode(&ctx);
  v1::DecodeRequest step;
  step.set_session_id(a.session_id());
  for (int i = 0; i < 2; ++i)
    step.add_q(1.0f), step.add_k(1.0f), step.add_v(2.0f);
  ASSERT_TRUE(stream->Write(step));
  ASSERT_TRUE(gauges_reach("linattn_num_requests_waiting 1"));
  ASSERT_EQ(kill(server->pid(), SIGTERM), 0);
  v1::DecodeResponse resp;
  ASSERT_TRUE(stream->Read(&resp)) << "the applied step was not answered";
  EXPECT_EQ(resp.position(), kTokens + 1u);
  EXPECT_FALSE(stream->Read(&resp));
  const grpc::Status ended = stream->Finish();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::UNAVAILABLE);
  prefill.join();
  EXPECT_TRUE(prefilled.ok()) << prefilled.error_message();
  const int status = server->Wait(std::chrono::seconds(20));
  ASSERT_NE(status, -1);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace linattn
