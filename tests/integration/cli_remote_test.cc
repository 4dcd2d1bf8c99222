// The `linattn` client commands against a real server: attend --server in
// both modes, explain --server, health.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "clients/cli/attend.h"
#include "clients/cli/explain.h"
#include "clients/cli/npy.h"
#include "clients/cli/remote.h"
#include "clients/load/load.h"
#include "core/attention/recurrent.h"
#include "core/attention/reference.h"
#include "tests/attention/test_util.h"
#include "tests/integration/server_process.h"
#include "tests/util/temp_dir.h"

namespace linattn {
namespace {

using ::testing::HasSubstr;

class CliRemoteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = testing::ServerProcess::Start();
    ASSERT_NE(server_, nullptr);
  }
  std::string Path(const std::string& name) const { return dir_.Path(name); }

  std::unique_ptr<testing::ServerProcess> server_;
  testing::TempDir dir_;
};

TEST_F(CliRemoteTest, AttendThroughServerSessions) {
  const AttentionSpec spec{
      .num_heads = 3, .key_dim = 8, .value_dim = 5, .epsilon = 0.0f};
  const uint64_t T = 150;
  const testing::Tokens data = testing::RandomTokens(spec, T, 21);
  ASSERT_TRUE(WriteNpy(Path("q.npy"), {int64_t(T), 3, 8}, data.q.data()).ok());
  ASSERT_TRUE(WriteNpy(Path("k.npy"), {int64_t(T), 3, 8}, data.k.data()).ok());
  ASSERT_TRUE(WriteNpy(Path("v.npy"), {int64_t(T), 3, 5}, data.v.data()).ok());
  AttendOptions o;
  o.q_path = Path("q.npy");
  o.k_path = Path("k.npy");
  o.v_path = Path("v.npy");
  o.server = server_->address();
  o.epsilon = 0.0f;

  o.mode = "decode";
  o.out_path = Path("decode.npy");
  ASSERT_TRUE(Attend(o).ok());
  o.mode = "prefill";
  o.out_path = Path("prefill.npy");
  ASSERT_TRUE(Attend(o).ok());

  // Decode equals the local recurrent step bit for bit; prefill matches the
  // reference within the fp32 bound.
  Attention attention = *Attention::Create(spec);
  AttentionState state = attention.NewState();
  testing::Outputs local(spec, T);
  ASSERT_TRUE(StepSequence(attention, state, data.input(), local.view()).ok());
  auto decoded = ReadNpy(Path("decode.npy"));
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(0, std::memcmp(decoded->data.data(), local.output.data(),
                           local.output.size() * 4));
  auto prefilled = ReadNpy(Path("prefill.npy"));
  ASSERT_TRUE(prefilled.ok());
  const ReferenceResult ref = ReferenceAttention(attention, data.input());
  testing::Outputs via_prefill(spec, T);
  via_prefill.output = prefilled->data;
  via_prefill.available = local.available;
  for (size_t i = 0; i < via_prefill.denominator.size(); ++i) {
    via_prefill.denominator[i] = float(ref.denominator[i]);
  }
  testing::ExpectMatchesReference(attention, ref, via_prefill,
                                  "attend --mode prefill");

  o.server.clear();
  EXPECT_THAT(std::string(Attend(o).message()), HasSubstr("give --server"));
  o.server = server_->address();
  o.mode = "recurrent";
  EXPECT_THAT(std::string(Attend(o).message()), HasSubstr("computes locally"));
}

// A Decode stream the server ends early: the client ends its call too and
// reports the server's own status (not CANCELLED, not a silent success).
TEST_F(CliRemoteTest, DecodeStreamEndedByTheServerReportsItsStatus) {
  RemoteAttention remote(server_->address());
  const AttentionSpec spec{.num_heads = 1, .key_dim = 2, .value_dim = 2};
  const testing::Tokens data = testing::RandomTokens(spec, 4, 3);
  std::vector<float> y(4 * 2), den(4);
  std::vector<uint8_t> available(4);
  const absl::Status s = remote.Decode(
      "no-such-session", spec, {data.q.data(), data.k.data(), data.v.data(), 4},
      {y.data(), den.data(), available.data()});
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), HasSubstr("session_id"));
}

TEST_F(CliRemoteTest, ExplainThroughInspectMatchesLocal) {
  auto local = Explain({.prefix = 1});
  auto remote = Explain({.prefix = 1, .server = server_->address()});
  ASSERT_TRUE(remote.ok()) << remote.status();
  EXPECT_EQ(remote->z, local->z);
  EXPECT_EQ(remote->s, local->s);
  EXPECT_EQ(remote->numerator, 5.0f);
  EXPECT_EQ(remote->denominator, 5.0f);
  EXPECT_EQ(remote->output, 1.0f);
  auto negative = Explain({.preset = "negative",
                           .feature_map = "relu",
                           .server = server_->address()});
  ASSERT_TRUE(negative.ok());
  EXPECT_FALSE(negative->available);
}

TEST_F(CliRemoteTest, HealthCommandExitCodes) {
  const std::string bin = LINATTN_BINARY;
  EXPECT_EQ(0, std::system((bin + " health --server " + server_->address() +
                            " > /dev/null")
                               .c_str()));
  EXPECT_NE(
      0, std::system(
             (bin + " health --server 127.0.0.1:1 --timeout 0.5 2> /dev/null")
                 .c_str()));
}

// A short verified load run, as CI runs it: 32 sessions × 200 steps, plus a
// run with a prefill first; every sampled session recomputed locally.
TEST_F(CliRemoteTest, LoadRunVerifiesSessions) {
  LoadOptions o;
  o.server = server_->address();
  o.sessions = 32;
  o.steps = 200;
  o.duration_s = 120;
  o.progress = false;
  auto summary = RunLoad(o);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_TRUE(summary->ok()) << SummaryText(*summary, o);
  EXPECT_EQ(summary->steps, 32u * 200);
  EXPECT_EQ(summary->verified_sessions, 8u);
  EXPECT_EQ(summary->mismatched_sessions, 0u);
  EXPECT_GT(summary->p99_us, 0);

  o.sessions = 6;
  o.steps = 50;
  o.prefill = 130;
  o.feature_map = "favor";
  o.concurrency = 3;
  summary = RunLoad(o);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_TRUE(summary->ok()) << SummaryText(*summary, o);
  EXPECT_EQ(summary->prefill_tokens, 6u * 130);
  EXPECT_EQ(SummaryJson(*summary, o)["ok"], true);

  // Groups of sessions on DecodeBatch streams (the last group short), with
  // a prefill first and a verified sample spanning two groups.
  o.sessions = 10;
  o.batch = 4;
  o.concurrency = 2;
  o.feature_map = "elu1";
  o.steps = 40;
  o.prefill = 70;
  summary = RunLoad(o);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_TRUE(summary->ok()) << SummaryText(*summary, o);
  EXPECT_EQ(summary->steps, 10u * 40);
  EXPECT_EQ(summary->prefill_tokens, 10u * 70);
  EXPECT_EQ(summary->verified_sessions, 8u);
  EXPECT_EQ(summary->mismatched_sessions, 0u);
  EXPECT_EQ(SummaryJson(*summary, o)["concurrency"], 2);
  o.concurrency = 0;  // one stream per group: 3
  EXPECT_EQ(Streams(o), 3u);
  o.prefill = 0;
  summary = RunLoad(o);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_TRUE(summary->ok()) << SummaryText(*summary, o);
  EXPECT_EQ(summary->steps, 10u * 40);

  o.server = "192.168.1.1:50051";
  EXPECT_EQ(RunLoad(o).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(IsLoopbackAddress("localhost:1"));
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.2:1"));
  EXPECT_TRUE(IsLoopbackAddress("[::1]:1"));
  EXPECT_FALSE(IsLoopbackAddress("10.1.2.3:1"));
}

}  // namespace
}  // namespace linattn
