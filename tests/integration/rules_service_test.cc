// AttentionService with the gated, delta, rwkv7 and rwkv6 rules, end to end: a
// real linattn-server on 127.0.0.1, every RPC, against the local engine and the
// float64 reference.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/attention/recurrent.h"
#include "core/attention/reference.h"
#include "linattn/v1/attention.grpc.pb.h"
#include "tests/attention/rule_bounds.h"
#include "tests/integration/attention_calls.h"
#include "tests/integration/server_process.h"
#include "tests/util/temp_dir.h"

namespace linattn {
namespace {

using ::testing::HasSubstr;
using testing::RuleTokens;
using testing::ServerProcess;
using Stub = v1::AttentionService::Stub;

struct RuleCase {
  std::string name, rule, gate;
  bool l2norm;
};

const RuleCase kCases[] = {
    {"gated_head", "gated", "", false},
    {"gated_key", "gated", "key", false},
    {"delta", "delta", "", true},
    {"gated_delta", "gated_delta", "", true},
    {"rwkv7", "rwkv7", "", false},  // gate key by default
    {"rwkv6", "rwkv6", "", false},  // likewise; its bonus in the spec
};

void PrintTo(const RuleCase& c, std::ostream* os) { *os << c.name; }

constexpr uint32_t kHeads = 2, kDim = 8;

AttentionSpec CoreSpecOf(const RuleCase& c);

v1::AttentionSpec ProtoSpecOf(const RuleCase& c) {
  v1::AttentionSpec s;
  const std::vector<float> bonus = CoreSpecOf(c).bonus;
  s.mutable_bonus()->Assign(bonus.begin(), bonus.end());
  s.set_num_heads(kHeads);
  s.set_key_dim(kDim);
  s.set_value_dim(kDim);
  s.set_rule(c.rule);
  s.set_gate(c.gate);
  s.set_qk_l2norm(c.l2norm);
  s.set_scale(0.5f);
  return s;
}

AttentionSpec CoreSpecOf(const RuleCase& c) {
  AttentionSpec s{.rule = *ParseUpdateRule(c.rule),
                  .num_heads = kHeads,
                  .key_dim = kDim,
                  .value_dim = kDim,
                  .feature_map = FeatureMapKind::kIdentity,
                  .unnormalized = true};
  if (s.rule == UpdateRule::kRwkv7 || s.rule == UpdateRule::kRwkv6) {
    s.gate = GateShape::kKey;
  }
  if (!c.gate.empty()) s.gate = *ParseGateShape(c.gate);
  s.qk_l2norm = c.l2norm;
  s.scale = 0.5f;
  if (s.rule == UpdateRule::kRwkv6) s.bonus = testing::RandomBonus(s, 3);
  return s;
}

// Token t of `data` as a Decode step of session `id`.
v1::DecodeRequest StepOf(const std::string& id, const AttentionSpec& spec,
                         const RuleTokens& data, uint64_t t) {
  const SequenceInput in = data.slice(spec, t, 1);
  const uint64_t qk = uint64_t{kHeads} * kDim, vv = qk;
  v1::DecodeRequest req;
  req.set_session_id(id);
  req.mutable_q()->Add(in.q, in.q + qk);
  req.mutable_k()->Add(in.k, in.k + qk);
  req.mutable_v()->Add(in.v, in.v + vv);
  if (in.g != nullptr)
    req.mutable_g()->Add(in.g, in.g + kHeads * GatesPerHead(spec));
  if (in.beta != nullptr) req.mutable_beta()->Add(in.beta, in.beta + kHeads);
  if (in.a != nullptr) {
    req.mutable_a()->Add(in.a, in.a + qk);
    req.mutable_b()->Add(in.b, in.b + qk);
  }
  return req;
}

v1::PrefillRequest PrefillOf(const std::string& id, const AttentionSpec& spec,
                             const RuleTokens& data, uint64_t first,
                             uint64_t n) {
  const SequenceInput in = data.slice(spec, first, n);
  const uint64_t qk = n * kHeads * kDim;
  v1::PrefillRequest req;
  req.set_session_id(id);
  req.set_tokens(static_cast<uint32_t>(n));
  req.mutable_q()->Add(in.q, in.q + qk);
  req.mutable_k()->Add(in.k, in.k + qk);
  req.mutable_v()->Add(in.v, in.v + qk);
  if (in.g != nullptr) {
    req.mutable_g()->Add(in.g, in.g + n * kHeads * GatesPerHead(spec));
  }
  if (in.beta != nullptr)
    req.mutable_beta()->Add(in.beta, in.beta + n * kHeads);
  if (in.a != nullptr) {
    req.mutable_a()->Add(in.a, in.a + qk);
    req.mutable_b()->Add(in.b, in.b + qk);
  }
  return req;
}

class RulesServiceTest : public ::testing::TestWithParam<RuleCase> {
 protected:
  void SetUp() override {
    server_ = ServerProcess::Start({"--model", "none"});
    ASSERT_NE(server_, nullptr);
    stub_ = v1::AttentionService::NewStub(server_->Channel());
  }
  v1::Session Create(const std::string& id) {
    grpc::ClientContext ctx;
    v1::CreateSessionRequest req;
    *req.mutable_spec() = ProtoSpecOf(GetParam());
    req.set_session_id(id);
    v1::Session session;
    const grpc::Status st = stub_->CreateSession(&ctx, req, &session);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return session;
  }
  // Decodes tokens [first, first + n) of `data` on one stream.
  grpc::Status Decode(const std::string& id, const RuleTokens& data,
                      uint64_t first, uint64_t n, std::vector<float>* out) {
    grpc::ClientContext ctx;
    auto stream = stub_->Decode(&ctx);
    const AttentionSpec spec = CoreSpecOf(GetParam());
    for (uint64_t t = first; t < first + n; ++t) {
      v1::DecodeResponse resp;
      if (!stream->Write(StepOf(id, spec, data, t)) || !stream->Read(&resp)) {
        break;
      }
      if (out != nullptr) {
        out->insert(out->end(), resp.output().begin(), resp.output().end());
      }
    }
    stream->WritesDone();
    return stream->Finish();
  }
  v1::InspectResponse Inspect(const std::string& id) {
    grpc::ClientContext ctx;
    v1::InspectRequest req;
    req.set_session_id(id);
    v1::InspectResponse resp;
    EXPECT_TRUE(stub_->Inspect(&ctx, req, &resp).ok());
    return resp;
  }
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<Stub> stub_;
};

// The session reports its rule; Decode equals the local recurrent order bit
// for bit; Prefill then Decode stays within the bound of the reference;
// Inspect shows S alone.
TEST_P(RulesServiceTest, DecodeAndPrefillMatchTheEngineAndTheReference) {
  const RuleCase& c = GetParam();
  const AttentionSpec spec = CoreSpecOf(c);
  const v1::Session a = Create("a");
  EXPECT_EQ(a.spec().rule(), c.rule);
  EXPECT_EQ(a.spec().qk_l2norm(), c.l2norm);
  EXPECT_EQ(a.spec().feature_map(), "identity");
  EXPECT_TRUE(a.spec().unnormalized());
  EXPECT_EQ(a.spec().epsilon(), 0.0f);
  EXPECT_EQ(a.state_bytes(), uint64_t{kHeads} * kDim * kDim * 4);
  const RuleTokens data = testing::RandomRuleTokens(spec, 60, 4, {});

  std::vector<float> served;
  ASSERT_TRUE(Decode("a", data, 0, 20, &served).ok());
  Attention attention = *Attention::Create(spec);
  AttentionState local = attention.NewState();
  testing::Outputs out(spec, 20);
  ASSERT_TRUE(
      StepSequence(attention, local, data.slice(spec, 0, 20), out.view()).ok());
  ASSERT_EQ(served.size(), out.output.size());
  EXPECT_EQ(0, std::memcmp(served.data(), out.output.data(),
                           served.size() * sizeof(float)));

  // Another session: a prefill of 40 tokens, then 20 steps, against the
  // double reference over all 60.
  Create("b");
  grpc::ClientContext ctx;
  v1::PrefillResponse pre;
  ASSERT_TRUE(
      stub_->Prefill(&ctx, PrefillOf("b", spec, data, 0, 40), &pre).ok());
  EXPECT_EQ(pre.position(), 40u);
  for (float d : pre.denominator()) EXPECT_EQ(d, 0.0f);
  std::vector<float> rest;
  ASSERT_TRUE(Decode("b", data, 40, 20, &rest).ok());
  testing::Outputs all(spec, 60);
  std::copy(pre.output().begin(), pre.output().end(), all.output.begin());
  std::copy(rest.begin(), rest.end(), all.output.begin() + pre.output_size());
  std::fill(all.available.begin(), all.available.end(), 1);
  const RuleReferenceResult ref = ReferenceRule(spec, data.input());
  testing::ExpectRuleMatchesReference(spec, data, ref, all, 64,
                                      c.name + " prefill + decode (server)");

  const v1::InspectResponse inspected = Inspect("b");
  EXPECT_EQ(inspected.s_size(), int(kHeads * kDim * kDim));
  EXPECT_EQ(inspected.z_size(), 0);
  EXPECT_EQ(inspected.position(), 60u);
}

// DecodeBatch of two sessions equals their Decode streams; Snapshot,
// Restore and Fork continue bit for bit.
TEST_P(RulesServiceTest, BatchSnapshotRestoreAndFork) {
  const AttentionSpec spec = CoreSpecOf(GetParam());
  const RuleTokens data = testing::RandomRuleTokens(spec, 30, 8, {});
  Create("x");
  Create("y");
  Create("z");
  ASSERT_TRUE(Decode("x", data, 0, 10, nullptr).ok());
  ASSERT_TRUE(Decode("y", data, 0, 10, nullptr).ok());
  {  // x and y together, z alone from the same inputs after its own 10.
    ASSERT_TRUE(Decode("z", data, 0, 10, nullptr).ok());
    grpc::ClientContext ctx;
    auto stream = stub_->DecodeBatch(&ctx);
    v1::DecodeBatchRequest req;
    *req.add_steps() = StepOf("x", spec, data, 10);
    *req.add_steps() = StepOf("y", spec, data, 10);
    v1::DecodeBatchResponse resp;
    ASSERT_TRUE(stream->Write(req) && stream->Read(&resp));
    stream->WritesDone();
    ASSERT_TRUE(stream->Finish().ok());
    std::vector<float> alone;
    ASSERT_TRUE(Decode("z", data, 10, 1, &alone).ok());
    ASSERT_EQ(resp.steps_size(), 2);
    for (const v1::DecodeResponse& r : resp.steps()) {
      EXPECT_EQ(std::vector<float>(r.output().begin(), r.output().end()),
                alone);
    }
  }
  const v1::Session restored =
      testing::SnapshotAndRestore(*stub_, "x", "restored");
  EXPECT_EQ(restored.spec().rule(), GetParam().rule);
  const v1::Session forked = testing::ForkOf(*stub_, "x", "forked");
  std::vector<std::vector<float>> next(3);
  const std::string ids[] = {"x", "restored", "forked"};
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(Decode(ids[i], data, 11, 19, &next[i]).ok());
  }
  EXPECT_EQ(next[0], next[1]) << "restored differs";
  EXPECT_EQ(next[0], next[2]) << "fork differs";
}

// Bad per-token inputs are refused naming the field; the session is as it
// was.
TEST_P(RulesServiceTest, BadInputsAreRefusedNamingTheFieldAndChangeNothing) {
  const RuleCase& c = GetParam();
  const AttentionSpec spec = CoreSpecOf(c);
  const RuleTokens data = testing::RandomRuleTokens(spec, 12, 5, {});
  Create("s");
  ASSERT_TRUE(Decode("s", data, 0, 4, nullptr).ok());
  const v1::InspectResponse before = Inspect("s");
  struct Bad {
    std::string where;  // expected at the start of the message
    std::function<void(v1::DecodeRequest&)> edit;
  };
  std::vector<Bad> bads;
  if (HasGates(spec.rule)) {
    bads.push_back({"g[1]", [](v1::DecodeRequest& r) { r.set_g(1, 0.25f); }});
    bads.push_back({"g: expected",
                    [](v1::DecodeRequest& r) { r.mutable_g()->RemoveLast(); }});
  } else {
    bads.push_back({"g: rule", [](v1::DecodeRequest& r) { r.add_g(-1.0f); }});
  }
  if (HasBeta(spec.rule)) {
    bads.push_back(
        {"beta[0]", [](v1::DecodeRequest& r) { r.set_beta(0, 3.0f); }});
    bads.push_back({"beta: expected",
                    [](v1::DecodeRequest& r) { r.mutable_beta()->Clear(); }});
  } else {
    bads.push_back(
        {"beta: rule", [](v1::DecodeRequest& r) { r.add_beta(1.0f); }});
  }
  if (HasLowRank(spec.rule)) {
    bads.push_back({"a[3]", [](v1::DecodeRequest& r) { r.set_a(3, NAN); }});
    bads.push_back({"b: expected",
                    [](v1::DecodeRequest& r) { r.mutable_b()->RemoveLast(); }});
  } else {
    bads.push_back({"a: rule", [](v1::DecodeRequest& r) { r.add_a(1.0f); }});
  }
  for (const Bad& bad : bads) {
    grpc::ClientContext ctx;
    auto stream = stub_->Decode(&ctx);
    v1::DecodeRequest req = StepOf("s", spec, data, 4);
    bad.edit(req);
    v1::DecodeResponse resp;
    stream->Write(req);
    EXPECT_FALSE(stream->Read(&resp));
    stream->WritesDone();
    const grpc::Status st = stream->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad.where;
    EXPECT_THAT(st.error_message(), HasSubstr(bad.where));
    // And as a Prefill of the same token.
    v1::PrefillRequest pre = PrefillOf("s", spec, data, 4, 1);
    pre.mutable_g()->Assign(req.g().begin(), req.g().end());
    pre.mutable_beta()->Assign(req.beta().begin(), req.beta().end());
    pre.mutable_a()->Assign(req.a().begin(), req.a().end());
    pre.mutable_b()->Assign(req.b().begin(), req.b().end());
    grpc::ClientContext pctx;
    v1::PrefillResponse presp;
    const grpc::Status pst = stub_->Prefill(&pctx, pre, &presp);
    EXPECT_EQ(pst.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << bad.where;
    EXPECT_THAT(pst.error_message(), HasSubstr(bad.where));
  }
  const v1::InspectResponse after = Inspect("s");
  EXPECT_EQ(after.position(), before.position());
  EXPECT_EQ(std::vector<float>(after.s().begin(), after.s().end()),
            std::vector<float>(before.s().begin(), before.s().end()));
}

// Durable (--state-dir): steps (their gates and β journaled) and a
// prefill survive a kill -9; the recovered state is the one acknowledged.
TEST_P(RulesServiceTest, DurableSessionsRecoverTheirStateAfterKillNine) {
  const AttentionSpec spec = CoreSpecOf(GetParam());
  const RuleTokens data = testing::RandomRuleTokens(spec, 30, 6, {});
  testing::TempDir tmp;
  const std::string state = tmp.Path("state");
  server_ = ServerProcess::Start({"--state-dir", state, "--model", "none"});
  ASSERT_NE(server_, nullptr);
  stub_ = v1::AttentionService::NewStub(server_->Channel());
  Create("durable");
  ASSERT_TRUE(Decode("durable", data, 0, 10, nullptr).ok());
  grpc::ClientContext ctx;
  v1::PrefillResponse pre;
  ASSERT_TRUE(
      stub_->Prefill(&ctx, PrefillOf("durable", spec, data, 10, 12), &pre)
          .ok());
  ASSERT_TRUE(Decode("durable", data, 22, 8, nullptr).ok());
  const v1::InspectResponse before = Inspect("durable");
  server_->Kill();
  server_ = ServerProcess::Start({"--state-dir", state, "--model", "none"});
  ASSERT_NE(server_, nullptr);
  stub_ = v1::AttentionService::NewStub(server_->Channel());
  const v1::InspectResponse after = Inspect("durable");
  EXPECT_EQ(after.position(), 30u);
  EXPECT_EQ(after.session().spec().rule(), GetParam().rule);
  EXPECT_EQ(std::vector<float>(after.s().begin(), after.s().end()),
            std::vector<float>(before.s().begin(), before.s().end()));
}

INSTANTIATE_TEST_SUITE_P(Rules, RulesServiceTest, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<RuleCase>& p) {
                           return p.param.name;
                         });

// A spec that mixes the rules' fields with the linear rule's is refused
// naming the field.
TEST(RulesServiceSpecs, MixedSpecsAreRefusedNamingTheField) {
  auto server = ServerProcess::Start({"--model", "none"});
  ASSERT_NE(server, nullptr);
  auto stub = v1::AttentionService::NewStub(server->Channel());
  auto refused = [&](v1::AttentionSpec spec) {
    grpc::ClientContext ctx;
    v1::CreateSessionRequest req;
    *req.mutable_spec() = spec;
    v1::Session session;
    return stub->CreateSession(&ctx, req, &session);
  };
  v1::AttentionSpec s = ProtoSpecOf(kCases[2]);
  s.set_feature_map("elu1");
  EXPECT_THAT(refused(s).error_message(), HasSubstr("spec.feature_map"));
  s = ProtoSpecOf(kCases[3]);
  s.set_gate("key");
  EXPECT_THAT(refused(s).error_message(), HasSubstr("spec.gate"));
  s = ProtoSpecOf(kCases[0]);
  s.set_rule("mamba");
  EXPECT_THAT(refused(s).error_message(), HasSubstr("spec.rule"));
  s = ProtoSpecOf(kCases[0]);
  s.set_epsilon(1e-6f);
  EXPECT_THAT(refused(s).error_message(), HasSubstr("spec.epsilon"));
  // rwkv6 takes exactly num_heads × key_dim finite bonus values; the other
  // rules none.
  s = ProtoSpecOf(kCases[5]);
  ASSERT_EQ(s.rule(), "rwkv6");
  s.mutable_bonus()->RemoveLast();
  EXPECT_THAT(refused(s).error_message(), HasSubstr("spec.bonus: rule rwkv6"));
  s = ProtoSpecOf(kCases[5]);
  s.set_bonus(3, INFINITY);
  EXPECT_THAT(refused(s).error_message(), HasSubstr("spec.bonus[3]"));
  s = ProtoSpecOf(kCases[0]);
  s.add_bonus(1.0f);
  EXPECT_THAT(refused(s).error_message(), HasSubstr("spec.bonus: only"));
  v1::AttentionSpec linear;
  linear.set_num_heads(1);
  linear.set_key_dim(4);
  linear.set_value_dim(4);
  linear.set_qk_l2norm(true);
  EXPECT_THAT(refused(linear).error_message(), HasSubstr("spec.qk_l2norm"));
}

}  // namespace
}  // namespace linattn
