// Shared-memory tensors (PrefillRequest.shared_memory) end to end: a real
// linattn-server on a unix socket with --shared-memory, regions made as a
// client makes them (sealed memfds), and hostile ones.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "clients/common/shared_region.h"
#include "clients/load/load.h"
#include "linattn/v1/attention.grpc.pb.h"
#include "tests/attention/rule_bounds.h"
#include "tests/integration/server_process.h"
#include "tests/util/temp_dir.h"

namespace linattn {
namespace {

using ::testing::HasSubstr;
using testing::ServerProcess;
using Stub = v1::AttentionService::Stub;

constexpr uint32_t kHeads = 2, kDim = 8;

// The cases: "linear" (ELU+1, normalised), "gated_key" (the gated rule
// with a log-gate per key channel) and "gated_delta" (gates and β).
v1::AttentionSpec ProtoSpec(const std::string& name) {
  v1::AttentionSpec s;
  s.set_num_heads(kHeads);
  s.set_key_dim(kDim);
  s.set_value_dim(kDim);
  if (name == "linear") {
    s.set_feature_map("elu1");
    return s;
  }
  s.set_rule(name == "gated_key" ? "gated" : name);
  if (name == "gated_key") s.set_gate("key");
  s.set_qk_l2norm(name == "gated_delta");
  s.set_scale(0.5f);
  return s;
}

AttentionSpec CoreSpec(const std::string& name) {
  AttentionSpec s{.num_heads = kHeads, .key_dim = kDim, .value_dim = kDim};
  if (name == "linear") return s;
  s.rule = *ParseUpdateRule(name == "gated_key" ? "gated" : name);
  if (name == "gated_key") s.gate = GateShape::kKey;
  s.feature_map = FeatureMapKind::kIdentity;
  s.unnormalized = true;
  s.qk_l2norm = name == "gated_delta";
  s.scale = 0.5f;
  return s;
}

std::string Packed(const float* data, uint64_t n) {
  return std::string(reinterpret_cast<const char*>(data), n * sizeof(float));
}

bool SameBits(const float* a, const std::string& b, uint64_t n) {
  return b.size() == n * sizeof(float) &&
         std::memcmp(a, b.data(), b.size()) == 0;
}

// Where a prefill of T tokens puts its tensors in a region (bytes).
struct Layout {
  uint64_t q, k, v, g, beta, output, denominator, end;
};
Layout LayoutOf(const AttentionSpec& spec, uint64_t T) {
  const uint64_t rows = T * spec.num_heads;
  Layout l;
  l.q = 0;
  l.k = l.q + rows * spec.key_dim * 4;
  l.v = l.k + rows * spec.key_dim * 4;
  l.g = l.v + rows * spec.value_dim * 4;
  l.beta = l.g + rows * GatesPerHead(spec) * 4;
  l.output = l.beta + (HasBeta(spec.rule) ? rows * 4 : 0);
  l.denominator = l.output + rows * spec.value_dim * 4;
  l.end = l.denominator + rows * 4;
  return l;
}

// Writes tokens' inputs into `region` at `l` and names them in `shm`.
void Place(const AttentionSpec& spec, const testing::RuleTokens& data,
           const Layout& l, const ClientSharedRegion& region,
           v1::SharedMemoryTensors* shm) {
  std::memcpy(region.floats(l.q), data.q.data(), data.q.size() * 4);
  std::memcpy(region.floats(l.k), data.k.data(), data.k.size() * 4);
  std::memcpy(region.floats(l.v), data.v.data(), data.v.size() * 4);
  if (!data.g.empty())
    std::memcpy(region.floats(l.g), data.g.data(), data.g.size() * 4);
  if (!data.beta.empty())
    std::memcpy(region.floats(l.beta), data.beta.data(), data.beta.size() * 4);
  shm->set_path(region.path());
  shm->set_q_offset(l.q);
  shm->set_k_offset(l.k);
  shm->set_v_offset(l.v);
  if (GatesPerHead(spec) != 0) shm->set_g_offset(l.g);
  if (HasBeta(spec.rule)) shm->set_beta_offset(l.beta);
  shm->set_output_offset(l.output);
  shm->set_denominator_offset(l.denominator);
}

class SharedMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ =
        ServerProcess::StartOn("unix:" + tmp_.Path("linattn.sock"),
                               {"--http-listen", "none", "--shared-memory"});
    ASSERT_NE(server_, nullptr);
    stub_ = v1::AttentionService::NewStub(server_->Channel());
  }
  std::string Create(const std::string& rule) {
    grpc::ClientContext ctx;
    v1::CreateSessionRequest req;
    *req.mutable_spec() = ProtoSpec(rule);
    v1::Session session;
    const grpc::Status s = stub_->CreateSession(&ctx, req, &session);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return session.session_id();
  }
  v1::InspectResponse Inspect(const std::string& id) {
    grpc::ClientContext ctx;
    v1::InspectRequest req;
    req.set_session_id(id);
    v1::InspectResponse resp;
    EXPECT_TRUE(stub_->Inspect(&ctx, req, &resp).ok());
    return resp;
  }
  testing::TempDir tmp_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<Stub> stub_;
};

// The same prefill as bytes in the message and through a region gives the
// same bits: outputs and denominators (written into the region, none in the
// response), availability, and the state; for the linear rule, the gated
// rule with a gate per key channel, and one that takes gates and β. Long
// enough (200 tokens) for the chunkwise path.
TEST_F(SharedMemoryTest, APrefillThroughARegionGivesTheMessagesBits) {
  for (const std::string rule : {"linear", "gated_key", "gated_delta"}) {
    SCOPED_TRACE(rule);
    const AttentionSpec spec = CoreSpec(rule);
    constexpr uint64_t T = 200;
    const testing::RuleTokens data = testing::RandomRuleTokens(spec, T, 17, {});
    const uint64_t rows = T * kHeads;
    const std::string by_bytes = Create(rule), by_region = Create(rule);

    v1::PrefillResponse expected;
    {
      grpc::ClientContext ctx;
      v1::PrefillRequest req;
      req.set_session_id(by_bytes);
      req.set_tokens(T);
      req.set_q_bytes(Packed(data.q.data(), data.q.size()));
      req.set_k_bytes(Packed(data.k.data(), data.k.size()));
      req.set_v_bytes(Packed(data.v.data(), data.v.size()));
      if (!data.g.empty())
        req.set_g_bytes(Packed(data.g.data(), data.g.size()));
      if (!data.beta.empty())
        req.set_beta_bytes(Packed(data.beta.data(), data.beta.size()));
      const grpc::Status s = stub_->Prefill(&ctx, req, &expected);
      ASSERT_TRUE(s.ok()) << s.error_message();
    }
    const Layout l = LayoutOf(spec, T);
    auto region = ClientSharedRegion::Create("linattn-test", l.end);
    ASSERT_TRUE(region.ok()) << region.status();
    // Outputs' room starts as NaN: every value must be written.
    std::fill(region->floats(l.output), region->floats(l.end),
              std::numeric_limits<float>::quiet_NaN());
    v1::PrefillResponse got;
    {
      grpc::ClientContext ctx;
      v1::PrefillRequest req;
      req.set_session_id(by_region);
      req.set_tokens(T);
      Place(spec, data, l, *region, req.mutable_shared_memory());
      const grpc::Status s = stub_->Prefill(&ctx, req, &got);
      ASSERT_TRUE(s.ok()) << s.error_message();
    }
    EXPECT_TRUE(got.output().empty() && got.output_bytes().empty());
    EXPECT_TRUE(got.denominator().empty() && got.denominator_bytes().empty());
    EXPECT_EQ(got.position(), T);
    EXPECT_TRUE(SameBits(region->floats(l.output), expected.output_bytes(),
                         rows * kDim));
    EXPECT_TRUE(SameBits(region->floats(l.denominator),
                         expected.denominator_bytes(), rows));
    EXPECT_TRUE(std::equal(got.available().begin(), got.available().end(),
                           expected.available().begin(),
                           expected.available().end()));
    const v1::InspectResponse a = Inspect(by_bytes), b = Inspect(by_region);
    EXPECT_EQ(b.position(), T);
    ASSERT_EQ(a.s_size(), b.s_size());
    EXPECT_EQ(std::memcmp(a.s().data(), b.s().data(), a.s_size() * 4), 0);
    ASSERT_EQ(a.z_size(), b.z_size());
    EXPECT_EQ(std::memcmp(a.z().data(), b.z().data(), a.z_size() * 4), 0);
  }
}

// A memfd made by hand: `name`, `bytes` long, with `seals` added.
struct RawMemfd {
  int fd = -1;
  RawMemfd(const char* name, uint64_t bytes, int seals) {
    fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
    if (seals != 0) {
      EXPECT_EQ(fcntl(fd, F_ADD_SEALS, seals), 0);
    }
  }
  ~RawMemfd() { close(fd); }
  std::string path() const {
    return "/proc/" + std::to_string(getpid()) + "/fd/" + std::to_string(fd);
  }
};

// Every refusal names its field, comes before the state is touched, and
// leaves the session and the region's output room as they were.
TEST_F(SharedMemoryTest, BadRegionsAndRangesAreRefusedNamingTheField) {
  const AttentionSpec spec = CoreSpec("linear");
  constexpr uint64_t T = 100;
  const testing::RuleTokens data = testing::RandomRuleTokens(spec, T, 5, {});
  const std::string id = Create("linear");
  const Layout l = LayoutOf(spec, T);
  auto region = ClientSharedRegion::Create("linattn-test", l.end);
  ASSERT_TRUE(region.ok()) << region.status();
  std::fill(region->floats(l.output), region->floats(l.end), -7.0f);
  auto prefill = [&](const std::function<void(v1::PrefillRequest&)>& edit) {
    grpc::ClientContext ctx;
    v1::PrefillRequest req;
    req.set_session_id(id);
    req.set_tokens(T);
    Place(spec, data, l, *region, req.mutable_shared_memory());
    edit(req);
    v1::PrefillResponse resp;
    return stub_->Prefill(&ctx, req, &resp);
  };
  auto refused = [&](grpc::StatusCode code, const std::string& says,
                     const std::function<void(v1::PrefillRequest&)>& edit) {
    const grpc::Status s = prefill(edit);
    EXPECT_EQ(s.error_code(), code) << says << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(says));
  };
  const v1::InspectResponse before = Inspect(id);

  testing::TempDir files;
  const std::string plain = files.Path("plain");
  std::ofstream(plain) << std::string(l.end, '\0');
  const RawMemfd unsealed("linattn-unsealed", l.end, 0);
  const RawMemfd misnamed("other", l.end, F_SEAL_SHRINK);
  const RawMemfd write_sealed("linattn-ro", l.end,
                              F_SEAL_SHRINK | F_SEAL_WRITE);
  const std::string gone = "/proc/" + std::to_string(getpid()) + "/fd/999999";
  using C = grpc::StatusCode;
  // Paths that are not /proc/<pid>/fd/<fd> of a linattn memfd, named
  // without a word about what they are: a file, a symlink whose target
  // reads like a memfd's link, a descriptor that does not exist, a pipe
  // (opened with O_PATH only: nothing blocks), and the server's own
  // descriptors.
  const std::string lookalike = files.Path("lookalike");
  ASSERT_EQ(symlink("/memfd:linattn-x (deleted)", lookalike.c_str()), 0);
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const std::string a_pipe = "/proc/" + std::to_string(getpid()) + "/fd/" +
                             std::to_string(pipe_fds[0]);
  const std::string servers =
      "/proc/" + std::to_string(server_->pid()) + "/fd/0";
  for (const std::string& path : {plain, lookalike, gone, a_pipe, servers}) {
    refused(C::INVALID_ARGUMENT,
            "shared_memory.path: " + path +
                " is not a memfd named linattn… that this server can open",
            [&](auto& r) { r.mutable_shared_memory()->set_path(path); });
  }
  close(pipe_fds[0]);
  close(pipe_fds[1]);
  refused(C::INVALID_ARGUMENT, "not sealed against shrinking", [&](auto& r) {
    r.mutable_shared_memory()->set_path(unsealed.path());
  });
  refused(C::INVALID_ARGUMENT, "not a memfd named linattn", [&](auto& r) {
    r.mutable_shared_memory()->set_path(misnamed.path());
  });
  refused(C::INVALID_ARGUMENT, "sealed against writes", [&](auto& r) {
    r.mutable_shared_memory()->set_path(write_sealed.path());
  });
  // A region not all allocated (half of it never written).
  const RawMemfd holes("linattn-holes", l.end, F_SEAL_SHRINK);
  ASSERT_EQ(pwrite(holes.fd, region->floats(0), l.output, 0),
            static_cast<ssize_t>(l.output));
  refused(C::INVALID_ARGUMENT,
          "shared_memory.path: " + holes.path() + " is not all allocated",
          [&](auto& r) { r.mutable_shared_memory()->set_path(holes.path()); });
  refused(C::INVALID_ARGUMENT, "shared_memory.v_offset: ", [&](auto& r) {
    r.mutable_shared_memory()->set_v_offset(l.end - 4);
  });
  refused(C::INVALID_ARGUMENT,
          "shared_memory.denominator_offset: 800 bytes from offset "
          "18446744073709551612 pass the region's end",
          [&](auto& r) {
            r.mutable_shared_memory()->set_denominator_offset(
                std::numeric_limits<uint64_t>::max() - 3);
          });
  refused(C::INVALID_ARGUMENT, "shared_memory.k_offset: 6 is not a multiple",
          [&](auto& r) { r.mutable_shared_memory()->set_k_offset(6); });
  refused(C::INVALID_ARGUMENT, "q: given beside shared_memory", [&](auto& r) {
    r.set_q_bytes(Packed(data.q.data(), data.q.size()));
  });
  refused(C::INVALID_ARGUMENT,
          "shared_memory.g_offset: rule linear takes no log-gates",
          [&](auto& r) { r.mutable_shared_memory()->set_g_offset(l.g); });
  refused(C::INVALID_ARGUMENT, "tokens: 4294967295 tokens",
          [&](auto& r) { r.set_tokens(4294967295u); });
  // A value that is not finite, read out of the region, is named as in a
  // message (after Place has written the good inputs).
  refused(C::INVALID_ARGUMENT, "k[53]: must be finite", [&](auto&) {
    region->floats(l.k)[3 * kHeads * kDim + 5] =
        std::numeric_limits<float>::infinity();
  });

  const v1::InspectResponse after = Inspect(id);
  EXPECT_EQ(after.position(), before.position());
  ASSERT_EQ(after.s_size(), before.s_size());
  EXPECT_EQ(
      std::memcmp(after.s().data(), before.s().data(), after.s_size() * 4), 0);
  for (const float* p = region->floats(l.output); p != region->floats(l.end);
       ++p) {
    ASSERT_EQ(*p, -7.0f) << "a refused call wrote into the region";
  }
  EXPECT_TRUE(prefill([](auto&) {}).ok());
  EXPECT_EQ(Inspect(id).position(), T);
}

// The gates' and β's offsets are there exactly when the rule takes them
// (an offset left out would otherwise read as 0, q's bytes).
TEST_F(SharedMemoryTest, GateAndBetaOffsetsAreThereExactlyWhenTaken) {
  const AttentionSpec spec = CoreSpec("gated_delta");
  constexpr uint64_t T = 70;
  const testing::RuleTokens data = testing::RandomRuleTokens(spec, T, 8, {});
  const std::string id = Create("gated_delta");
  const Layout l = LayoutOf(spec, T);
  auto region = ClientSharedRegion::Create("linattn-test", l.end);
  ASSERT_TRUE(region.ok()) << region.status();
  auto prefill =
      [&](const std::function<void(v1::SharedMemoryTensors&)>& edit) {
        grpc::ClientContext ctx;
        v1::PrefillRequest req;
        req.set_session_id(id);
        req.set_tokens(T);
        Place(spec, data, l, *region, req.mutable_shared_memory());
        edit(*req.mutable_shared_memory());
        v1::PrefillResponse resp;
        return stub_->Prefill(&ctx, req, &resp);
      };
  grpc::Status s = prefill([](auto& m) { m.clear_g_offset(); });
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              HasSubstr("shared_memory.g_offset: rule gated_delta takes "
                        "log-gates; give their offset"));
  s = prefill([](auto& m) { m.clear_beta_offset(); });
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              HasSubstr("shared_memory.beta_offset: rule gated_delta takes "
                        "beta; give its offset"));
  EXPECT_EQ(Inspect(id).position(), 0u);
  s = prefill([](auto&) {});
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(Inspect(id).position(), T);
}

// A region sealed against writes while the prefill runs (after the server
// checked it) cannot take the outputs: the prefill is applied all the same
// and the outputs come back in the response. The seal is added a few
// milliseconds into a long prefill; a seal that lands before the check is
// refused instead, and the attempt is made again.
TEST_F(SharedMemoryTest, OutputsTheRegionRefusesComeBackInTheResponse) {
#ifndef F_SEAL_FUTURE_WRITE
  GTEST_SKIP() << "F_SEAL_FUTURE_WRITE is not defined here";
#else
  bool came_back = false;
  for (int attempt = 0; attempt < 10 && !came_back; ++attempt) {
    SCOPED_TRACE(attempt);
    grpc::ClientContext create_ctx;
    v1::CreateSessionRequest create;
    v1::AttentionSpec* p = create.mutable_spec();
    p->set_num_heads(8);
    p->set_key_dim(64);
    p->set_value_dim(64);
    p->set_feature_map("elu1");
    v1::Session session;
    ASSERT_TRUE(stub_->CreateSession(&create_ctx, create, &session).ok());
    const AttentionSpec spec{.num_heads = 8, .key_dim = 64, .value_dim = 64};
    constexpr uint64_t T = 5000;
    const testing::RuleTokens data =
        testing::RandomRuleTokens(spec, T, 40 + attempt, {});
    const Layout l = LayoutOf(spec, T);
    auto region = ClientSharedRegion::Create("linattn-test", l.end);
    ASSERT_TRUE(region.ok()) << region.status();
    grpc::ClientContext ctx;
    v1::PrefillRequest req;
    req.set_session_id(session.session_id());
    req.set_tokens(T);
    Place(spec, data, l, *region, req.mutable_shared_memory());
    v1::PrefillResponse resp;
    std::thread sealer([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(2 + 2 * attempt));
      const int fd = open(region->path().c_str(), O_RDWR | O_CLOEXEC);
      ASSERT_GE(fd, 0);
      EXPECT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE), 0);
      close(fd);
    });
    const grpc::Status s = stub_->Prefill(&ctx, req, &resp);
    sealer.join();
    if (!s.ok()) {  // sealed before the check
      EXPECT_THAT(s.error_message(), HasSubstr("sealed against writes"));
      EXPECT_EQ(Inspect(session.session_id()).position(), 0u);
      continue;
    }
    EXPECT_EQ(resp.position(), T);
    if (resp.output_bytes().empty()) continue;  // written before the seal
    came_back = true;
    // The same prefill through a message gives the same bits.
    grpc::ClientContext c2;
    v1::CreateSessionRequest create2 = create;
    v1::Session other;
    ASSERT_TRUE(stub_->CreateSession(&c2, create2, &other).ok());
    grpc::ClientContext c3;
    v1::PrefillRequest by_bytes;
    by_bytes.set_session_id(other.session_id());
    by_bytes.set_tokens(T);
    by_bytes.set_q_bytes(Packed(data.q.data(), data.q.size()));
    by_bytes.set_k_bytes(Packed(data.k.data(), data.k.size()));
    by_bytes.set_v_bytes(Packed(data.v.data(), data.v.size()));
    v1::PrefillResponse expected;
    ASSERT_TRUE(stub_->Prefill(&c3, by_bytes, &expected).ok());
    EXPECT_EQ(resp.output_bytes(), expected.output_bytes());
    EXPECT_EQ(resp.denominator_bytes(), expected.denominator_bytes());
  }
  EXPECT_TRUE(came_back) << "no attempt sealed the region mid-prefill";
#endif
}

// Without --shared-memory a server refuses such a Prefill; the flag itself
// is refused on a TCP listener.
TEST(SharedMemoryOff, RefusedWithoutTheFlagAndOnTcp) {
  auto server = ServerProcess::Start({"--http-listen", "none"});
  ASSERT_NE(server, nullptr);
  auto stub = v1::AttentionService::NewStub(server->Channel());
  v1::Session session;
  {
    grpc::ClientContext ctx;
    v1::CreateSessionRequest req;
    *req.mutable_spec() = ProtoSpec("linear");
    ASSERT_TRUE(stub->CreateSession(&ctx, req, &session).ok());
  }
  auto region = ClientSharedRegion::Create("linattn-test", 4096);
  ASSERT_TRUE(region.ok());
  grpc::ClientContext ctx;
  v1::PrefillRequest req;
  req.set_session_id(session.session_id());
  req.set_tokens(1);
  req.mutable_shared_memory()->set_path(region->path());
  v1::PrefillResponse resp;
  const grpc::Status s = stub->Prefill(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(),
              HasSubstr("shared_memory: this server takes no"));

  testing::TempDir tmp;
  const std::string log = tmp.Path("log");
  EXPECT_EQ(ServerProcess::Start({"--shared-memory"}, log), nullptr);
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)),
                         std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("--shared-memory: needs --listen unix:PATH"));
  // Nor with API keys: a tenant could name another tenant's region.
  const std::string keys = tmp.Path("keys");
  std::ofstream(keys) << "";
  const std::string log2 = tmp.Path("log2");
  EXPECT_EQ(
      ServerProcess::StartOn("unix:" + tmp.Path("s.sock"),
                             {"--shared-memory", "--api-keys", keys}, log2),
      nullptr);
  std::ifstream in2(log2);
  const std::string text2((std::istreambuf_iterator<char>(in2)),
                          std::istreambuf_iterator<char>());
  EXPECT_THAT(text2, HasSubstr("--shared-memory: not with --api-keys"));
}

// The buffers shared-memory prefills hold at once stay within
// --transport-memory: a call that would pass it is refused, changing
// nothing, and what a finished call held is returned (calls of just over
// half the bound, one after another, all pass).
TEST(SharedMemoryBound, BuffersInFlightStayWithinTheTransportBound) {
  testing::TempDir tmp;
  auto server =
      ServerProcess::StartOn("unix:" + tmp.Path("linattn.sock"),
                             {"--http-listen", "none", "--shared-memory",
                              "--transport-memory", "1MiB"});
  ASSERT_NE(server, nullptr);
  auto stub = v1::AttentionService::NewStub(server->Channel());
  std::string id;
  {
    grpc::ClientContext ctx;
    v1::CreateSessionRequest req;
    *req.mutable_spec() = ProtoSpec("linear");
    v1::Session session;
    ASSERT_TRUE(stub->CreateSession(&ctx, req, &session).ok());
    id = session.session_id();
  }
  const AttentionSpec spec = CoreSpec("linear");
  // Per token: 2 heads × (3·8 floats in, 9 out, 1 byte of availability)
  // = 266 bytes.
  constexpr uint64_t kBig = 4000, kHalf = 2000;  // 1,064,000 and 532,000
  const testing::RuleTokens data = testing::RandomRuleTokens(spec, kBig, 3, {});
  const Layout l = LayoutOf(spec, kBig);
  auto region = ClientSharedRegion::Create("linattn-test", l.end);
  ASSERT_TRUE(region.ok()) << region.status();
  auto prefill = [&](uint64_t T) {
    grpc::ClientContext ctx;
    v1::PrefillRequest req;
    req.set_session_id(id);
    req.set_tokens(T);
    Place(spec, data, l, *region, req.mutable_shared_memory());
    v1::PrefillResponse resp;
    return stub->Prefill(&ctx, req, &resp);
  };
  const grpc::Status s = prefill(kBig);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(),
              HasSubstr("shared_memory: the server holds as many"));
  EXPECT_THAT(s.error_message(), HasSubstr("this one needs 1064000"));
  for (int i = 0; i < 4; ++i) {
    const grpc::Status ok = prefill(kHalf);
    EXPECT_TRUE(ok.ok()) << i << ": " << ok.error_message();
  }
  grpc::ClientContext ctx;
  v1::InspectRequest req;
  req.set_session_id(id);
  v1::InspectResponse resp;
  ASSERT_TRUE(stub->Inspect(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.position(), 4 * kHalf);
}

// linattn-load --shared-memory: its prefills through regions (rwkv7's a
// and b among them), checked session by session.
TEST_F(SharedMemoryTest, TheLoadToolsPrefillsThroughRegionsVerify) {
  for (const std::string rule : {"linear", "rwkv7"}) {
    LoadOptions o;
    o.server = server_->address();
    o.rule = rule;
    o.sessions = 6;
    o.steps = 10;
    o.prefill = 300;
    o.batch = 3;
    o.duration_s = 120;
    o.progress = false;
    o.shared_memory = true;
    auto summary = RunLoad(o);
    ASSERT_TRUE(summary.ok()) << rule << ": " << summary.status();
    EXPECT_TRUE(summary->ok()) << rule;
    EXPECT_EQ(summary->prefill_tokens, 6u * 300u) << rule;
    EXPECT_EQ(summary->verified_sessions, 6u) << rule;
    EXPECT_EQ(summary->mismatched_sessions, 0u) << rule;
  }
}

}  // namespace
}  // namespace linattn
