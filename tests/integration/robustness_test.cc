// What hostile or careless clients cannot do to a real server: stall it with
// an expensive spec, overflow a session's state, or have work applied after
// they stopped waiting for it.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <optional>
#include <thread>

#include "core/session/snapshot.h"
#include "linattn/v1/attention.grpc.pb.h"
#include "linattn/v1/generation.grpc.pb.h"
#include "tests/integration/server_process.h"

namespace linattn {
namespace {

using ::testing::HasSubstr;

class RobustnessTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ =
        testing::ServerProcess::Start({"--model", LINATTN_BUILTIN_MODEL_DIR})
            .release();
  }
  static void TearDownTestSuite() { delete server_; }
  void SetUp() override {
    ASSERT_NE(server_, nullptr);
    attention_ = v1::AttentionService::NewStub(server_->Channel());
    generation_ = v1::GenerationService::NewStub(server_->Channel());
  }

  absl::StatusOr<v1::Session> Create(const v1::AttentionSpec& spec) {
    grpc::ClientContext ctx;
    v1::CreateSessionRequest req;
    *req.mutable_spec() = spec;
    v1::Session session;
    grpc::Status s = attention_->CreateSession(&ctx, req, &session);
    if (!s.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                          s.error_message());
    }
    return session;
  }
  uint64_t Position(const std::string& id) {
    grpc::ClientContext ctx;
    v1::GetSessionRequest req;
    req.set_session_id(id);
    v1::Session session;
    EXPECT_TRUE(attention_->GetSession(&ctx, req, &session).ok());
    return session.position();
  }

  static testing::ServerProcess* server_;
  std::unique_ptr<v1::AttentionService::Stub> attention_;
  std::unique_ptr<v1::GenerationService::Stub> generation_;
};
testing::ServerProcess* RobustnessTest::server_ = nullptr;

v1::AttentionSpec Favor(uint32_t key_dim, uint32_t feature_dim, uint64_t seed) {
  v1::AttentionSpec spec;
  spec.set_num_heads(1);
  spec.set_key_dim(key_dim);
  spec.set_value_dim(1);
  spec.set_feature_map("favor");
  spec.set_feature_dim(feature_dim);
  spec.set_seed(seed);
  return spec;
}

// FAVOR+ dimensions are bounded (the setup grows as m·d_k²), the bound is
// named, and a large accepted setup runs while the server goes on
// answering everyone else.
TEST_F(RobustnessTest, FavorSetupIsBoundedAndDoesNotStallTheServer) {
  auto refused = Create(Favor(2048, 0, 1));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("spec.key_dim"));

  // A snapshot can name the same spec in 174 bytes: refused the same way.
  const AttentionSpec small{.num_heads = 1,
                            .key_dim = 4,
                            .value_dim = 1,
                            .feature_map = FeatureMapKind::kFavor,
                            .epsilon = 1e-6f,
                            .feature_dim = 8};
  std::string blob = SerializeSnapshot(small, AttentionState(small));
  const uint32_t huge = 65536;
  const uint64_t spec_at =
      OpenSnapshot(blob, SnapshotKind::kAttentionSession).value()[0].offset;
  std::memcpy(blob.data() + spec_at + 4, &huge, 4);  // SPEC's key_dim
  const uint32_t crc =
      Crc32(absl::string_view(blob).substr(0, blob.size() - 4));
  std::memcpy(blob.data() + blob.size() - 4, &crc, 4);
  grpc::ClientContext restore_ctx;
  v1::RestoreRequest restore;
  restore.set_state(blob);
  v1::Session restored;
  const grpc::Status r = attention_->Restore(&restore_ctx, restore, &restored);
  EXPECT_EQ(r.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(r.error_message(), HasSubstr("key_dim"));

  // The largest accepted setup takes a second or so of one core; the table
  // is not locked meanwhile.
  std::atomic<bool> created{false};
  std::thread creator([&] {
    EXPECT_TRUE(Create(Favor(kMaxFavorKeyDim, kMaxFavorFeatureDim, 2)).ok());
    created = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  v1::AttentionSpec plain;
  plain.set_num_heads(1);
  plain.set_key_dim(2);
  plain.set_value_dim(2);
  EXPECT_TRUE(Create(plain).ok());
  grpc::ClientContext list_ctx;
  v1::ListSessionsResponse list;
  EXPECT_TRUE(attention_->ListSessions(&list_ctx, {}, &list).ok());
  EXPECT_FALSE(created) << "the server answered only after the setup";
  creator.join();
}

// Finite inputs so large that S would overflow are refused, name k and v,
// and leave the session exactly as it was: still readable, snapshottable
// and restorable.
TEST_F(RobustnessTest, HugeInputsAreRefusedAndTheSessionStaysUsable) {
  v1::AttentionSpec spec;
  spec.set_num_heads(1);
  spec.set_key_dim(1);
  spec.set_value_dim(1);
  auto session = Create(spec);
  ASSERT_TRUE(session.ok());
  const std::string id = session->session_id();
  grpc::ClientContext ctx;
  auto stream = attention_->Decode(&ctx);
  v1::DecodeRequest step;
  step.set_session_id(id);
  step.add_q(1.0f);
  step.add_k(1e19f);  // φ(k)·v = 1e38 per step: three fit in fp32
  step.add_v(1e19f);
  v1::DecodeResponse resp;
  for (int t = 0; t < 3; ++t) {
    ASSERT_TRUE(stream->Write(step) && stream->Read(&resp)) << t;
  }
  EXPECT_TRUE(stream->Write(step));
  EXPECT_FALSE(stream->Read(&resp));
  const grpc::Status s = stream->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_THAT(s.error_message(), HasSubstr("k, v"));
  EXPECT_EQ(Position(id), 3u);

  grpc::ClientContext pre_ctx;
  v1::PrefillRequest pre;
  pre.set_session_id(id);
  pre.set_tokens(2);
  for (int t = 0; t < 2; ++t)
    pre.add_q(1.0f), pre.add_k(1e20f), pre.add_v(1e20f);
  v1::PrefillResponse pre_resp;
  const grpc::Status p = attention_->Prefill(&pre_ctx, pre, &pre_resp);
  EXPECT_EQ(p.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_EQ(Position(id), 3u);

  grpc::ClientContext snap_ctx;
  v1::SnapshotRequest snap;
  snap.set_session_id(id);
  v1::SnapshotResponse blob;
  ASSERT_TRUE(attention_->Snapshot(&snap_ctx, snap, &blob).ok());
  grpc::ClientContext restore_ctx;
  v1::RestoreRequest restore;
  restore.set_state(blob.state());
  v1::Session restored;
  EXPECT_TRUE(attention_->Restore(&restore_ctx, restore, &restored).ok());
  EXPECT_EQ(restored.position(), 3u);
}

// An Append whose deadline passes before it is done appends nothing, and a
// Fork whose deadline passes while it waits behind a long Append does not
// run when its turn comes: a retry can never apply input twice.
TEST_F(RobustnessTest, WorkWhoseDeadlinePassedIsNotApplied) {
  auto create = [&](const std::string& id) {
    grpc::ClientContext ctx;
    v1::CreateModelSessionRequest req;
    req.set_session_id(id);
    v1::ModelSession session;
    EXPECT_TRUE(generation_->CreateSession(&ctx, req, &session).ok());
  };
  auto position = [&](const std::string& id) -> std::optional<uint64_t> {
    grpc::ClientContext ctx;
    v1::GetModelSessionRequest req;
    req.set_session_id(id);
    v1::ModelSession session;
    if (!generation_->GetSession(&ctx, req, &session).ok()) return {};
    return session.position();
  };
  v1::AppendRequest long_append;
  for (int i = 0; i < 200000; ++i) long_append.add_token_ids('a' + i % 26);

  create("expiring");
  long_append.set_session_id("expiring");
  grpc::ClientContext append_ctx;
  append_ctx.set_deadline(std::chrono::system_clock::now() +
                          std::chrono::milliseconds(500));
  v1::ModelSession appended;
  EXPECT_EQ(
      generation_->Append(&append_ctx, long_append, &appended).error_code(),
      grpc::StatusCode::DEADLINE_EXCEEDED);
  // A request queued after it runs once it is resolved: nothing appended.
  grpc::ClientContext snap_ctx;
  v1::SnapshotModelSessionRequest snap;
  snap.set_session_id("expiring");
  v1::SnapshotModelSessionResponse snapped;
  ASSERT_TRUE(generation_->Snapshot(&snap_ctx, snap, &snapped).ok());
  EXPECT_EQ(position("expiring"), 0u) << "the expired Append was applied";

  create("busy");
  long_append.set_session_id("busy");
  long_append.mutable_token_ids()->Truncate(20000);  // about a second
  grpc::Status long_status;
  std::thread appender([&] {
    grpc::ClientContext ctx;
    v1::ModelSession out;
    long_status = generation_->Append(&ctx, long_append, &out);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  grpc::ClientContext fork_ctx;
  fork_ctx.set_deadline(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(200));
  v1::ForkModelSessionRequest fork;
  fork.set_session_id("busy");
  fork.set_new_session_id("late-fork");
  v1::ModelSession forked;
  EXPECT_EQ(generation_->Fork(&fork_ctx, fork, &forked).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  appender.join();
  EXPECT_TRUE(long_status.ok()) << long_status.error_message();
  EXPECT_EQ(position("busy"), 20000u);
  EXPECT_EQ(position("late-fork"), std::nullopt) << "the expired Fork ran";
}

}  // namespace
}  // namespace linattn
