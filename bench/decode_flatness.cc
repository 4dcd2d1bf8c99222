// decode_flatness: decode time per token of one session at several
// positions of that same session (default 1,000 and 1,000,000), in this
// process or through a linattn-server, as JSON.
//
//   decode_flatness [--server ADDR] [--heads 8] [--dim 64] [--rule R]
//                   [--positions 1000,1000000] [--steps 100] [--repeats 41]
//
// The session is advanced to each position by real prefills of random
// tokens (chunkwise; through the server in Prefill requests of 4,096
// tokens) and forked there (in process: a copy of the state; through the
// server: Fork), so each position keeps a session with exactly that
// history. The forks are then timed in alternation, `repeats` rounds of
// `steps` tokens each, one call per token (in process: Step; through the
// server: one Decode stream, one message per token), so that the drift of
// a shared machine falls on every position alike (in alternating order).
// Reported: each position's best round, and (last_over_first) the median
// over rounds of the last position's time over the first's within the same
// round. The session's first min(steps, first position) tokens are decoded
// untimed as a warm-up. Nothing about the state depends on the position:
// its size is H·(d² + d) floats (H·d² for the gated and delta rules)
// whatever the context, which is what this measures.
#include <algorithm>
#include <chrono>
#include <functional>
#include <iostream>
#include <random>

#include "CLI/CLI.hpp"
#include "clients/cli/remote.h"
#include "clients/load/load.h"
#include "core/attention/chunkwise.h"
#include "core/attention/recurrent.h"
#include "core/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace linattn {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kPoolTokens = 4096;
constexpr uint64_t kPrefillPiece = 4096;

[[noreturn]] void Fail(const absl::Status& s) {
  std::cerr << "decode_flatness: " << s << "\n";
  std::exit(1);
}
void Check(const absl::Status& s) {
  if (!s.ok()) Fail(s);
}

// kPoolTokens random tokens; token t of the session is row t % kPoolTokens.
struct TokenPool {
  TokenPool(const AttentionSpec& spec, uint64_t seed)
      : qk(uint64_t(spec.num_heads) * spec.key_dim),
        vv(uint64_t(spec.num_heads) * spec.value_dim),
        gg(uint64_t(spec.num_heads) * GatesPerHead(spec)),
        bb(HasBeta(spec.rule) ? spec.num_heads : 0) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> dist(-1, 1);
    for (auto* x : {&q, &k}) x->resize(kPoolTokens * qk);
    v.resize(kPoolTokens * vv);
    g.resize(kPoolTokens * gg);
    beta.resize(kPoolTokens * bb);
    for (auto* x : {&q, &k, &v}) {
      for (float& f : *x) f = dist(rng);
    }
    // Log-gates in [−0.1, 0], β in [0, 1].
    for (float& f : g) f = -0.05f * (dist(rng) + 1.0f);
    for (float& f : beta) f = 0.5f * (dist(rng) + 1.0f);
  }
  // Tokens [first, first + n) copied into contiguous buffers.
  void Fill(uint64_t first, uint64_t n, std::vector<float>& bq,
            std::vector<float>& bk, std::vector<float>& bv,
            std::vector<float>& bg, std::vector<float>& bbeta) const {
    bq.resize(n * qk);
    bk.resize(n * qk);
    bv.resize(n * vv);
    bg.resize(n * gg);
    bbeta.resize(n * bb);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t r = (first + i) % kPoolTokens;
      std::copy_n(q.begin() + r * qk, qk, bq.begin() + i * qk);
      std::copy_n(k.begin() + r * qk, qk, bk.begin() + i * qk);
      std::copy_n(v.begin() + r * vv, vv, bv.begin() + i * vv);
      std::copy_n(g.begin() + r * gg, gg, bg.begin() + i * gg);
      std::copy_n(beta.begin() + r * bb, bb, bbeta.begin() + i * bb);
    }
  }
  const uint64_t qk, vv, gg, bb;
  std::vector<float> q, k, v, g, beta;
};

// One session, local or remote: advance by prefill, decode one by one.
class Target {
 public:
  virtual ~Target() = default;
  virtual absl::Status Prefill(const SequenceInput& in,
                               const SequenceOutput& out) = 0;
  virtual absl::Status Decode(const SequenceInput& in,
                              const SequenceOutput& out) = 0;
  // A second session with this one's state and position.
  virtual std::unique_ptr<Target> Fork() = 0;
};

class LocalTarget : public Target {
 public:
  explicit LocalTarget(const AttentionSpec& spec)
      : attention_(*Attention::Create(spec)), state_(attention_.NewState()) {}
  std::unique_ptr<Target> Fork() override {
    auto fork = std::make_unique<LocalTarget>(attention_.spec());
    fork->state_ = state_.Copy();
    return fork;
  }
  absl::Status Prefill(const SequenceInput& in,
                       const SequenceOutput& out) override {
    return runner_.Run(attention_, state_, in, out);
  }
  absl::Status Decode(const SequenceInput& in,
                      const SequenceOutput& out) override {
    const uint32_t H = attention_.num_heads();
    const uint64_t vv = uint64_t(H) * attention_.value_dim();
    for (uint64_t t = 0; t < in.tokens; ++t) {
      LINATTN_RETURN_IF_ERROR(
          Step(attention_, state_, TokenOf(attention_.spec(), in, t),
               {out.output + t * vv, out.denominator + t * H,
                out.available + t * H}));
    }
    return absl::OkStatus();
  }

 private:
  Attention attention_;
  AttentionState state_;
  ChunkwiseRunner runner_;
};

class RemoteTarget : public Target {
 public:
  RemoteTarget(const std::string& server, const AttentionSpec& spec,
               const std::string& fork_of = "")
      : remote_(server), server_(server), spec_(spec) {
    absl::StatusOr<v1::Session> s =
        fork_of.empty() ? remote_.CreateSession(spec, std::nullopt)
                        : remote_.Fork(fork_of);
    if (!s.ok()) Fail(s.status());
    id_ = s->session_id();
  }
  std::unique_ptr<Target> Fork() override {
    return std::make_unique<RemoteTarget>(server_, spec_, id_);
  }
  ~RemoteTarget() override { (void)remote_.DeleteSession(id_); }
  absl::Status Prefill(const SequenceInput& in,
                       const SequenceOutput& out) override {
    return remote_.Prefill(id_, spec_, in, out, kPrefillPiece);
  }
  absl::Status Decode(const SequenceInput& in,
                      const SequenceOutput& out) override {
    return remote_.Decode(id_, spec_, in, out);
  }

 private:
  RemoteAttention remote_;
  const std::string server_;
  const AttentionSpec spec_;
  std::string id_;
};

int Main(int argc, char** argv) {
  CLI::App app{
      "decode_flatness: decode time per token at several positions of one "
      "session"};
  std::string server;
  std::vector<uint64_t> positions = {1000, 1000000};
  uint32_t heads = 8, dim = 64, steps = 100, repeats = 41;
  app.add_option("--server", server,
                 "linattn-server address (loopback); in process if unset");
  app.add_option("--heads", heads)->capture_default_str();
  app.add_option("--dim", dim, "key and value width")->capture_default_str();
  std::string rule = "linear";
  app.add_option("--rule", rule,
                 "update rule: linear | gated | delta | gated_delta (the "
                 "delta rules with L2-normalised q and k)")
      ->check(CLI::IsMember({"linear", "gated", "delta", "gated_delta"}))
      ->capture_default_str();
  app.add_option("--positions", positions, "increasing positions")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--steps", steps, "tokens decoded per round")
      ->check(CLI::Range(1u, 1u << 20))
      ->capture_default_str();
  app.add_option("--repeats", repeats, "rounds")
      ->check(CLI::Range(1u, 100000u))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (!server.empty() && !IsLoopbackAddress(server)) {
    Fail(absl::InvalidArgumentError("--server: loopback addresses only"));
  }
  if (positions.empty() ||
      std::adjacent_find(positions.begin(), positions.end(),
                         std::greater_equal<uint64_t>()) != positions.end()) {
    Fail(absl::InvalidArgumentError(
        "--positions: strictly increasing, comma-separated"));
  }

  AttentionSpec spec{.rule = *ParseUpdateRule(rule),
                     .num_heads = heads,
                     .key_dim = dim,
                     .value_dim = dim};
  if (spec.rule != UpdateRule::kLinear) {
    spec.feature_map = FeatureMapKind::kIdentity;
    spec.unnormalized = true;
    spec.qk_l2norm = HasBeta(spec.rule);
  }
  const TokenPool pool(spec, 1);
  std::unique_ptr<Target> target;
  if (server.empty()) {
    target = std::make_unique<LocalTarget>(spec);
  } else {
    target = std::make_unique<RemoteTarget>(server, spec);
  }
  std::vector<float> q, k, v, g, beta, y, den;
  std::vector<uint8_t> avail;
  auto run = [&](Target& t, uint64_t first, uint64_t n, bool decode) {
    pool.Fill(first, n, q, k, v, g, beta);
    y.resize(n * pool.vv);
    den.resize(n * heads);
    avail.resize(n * heads);
    SequenceInput in{q.data(), k.data(), v.data(), n};
    if (!g.empty()) in.g = g.data();
    if (!beta.empty()) in.beta = beta.data();
    const SequenceOutput out{y.data(), den.data(), avail.data()};
    Check(decode ? t.Decode(in, out) : t.Prefill(in, out));
  };

  // Warm-up (connection, threads, caches), untimed: the first tokens of the
  // session are decoded, up to the first position.
  uint64_t position = std::min<uint64_t>(steps, positions.front());
  if (position > 0) run(*target, 0, position, true);
  double prefill_seconds = 0;
  std::vector<std::unique_ptr<Target>> forks;
  for (uint64_t p : positions) {
    const auto start = Clock::now();
    while (position < p) {
      const uint64_t n = std::min<uint64_t>(p - position, 1 << 16);
      run(*target, position, n, false);
      position += n;
    }
    prefill_seconds +=
        std::chrono::duration<double>(Clock::now() - start).count();
    forks.push_back(target->Fork());
  }
  std::vector<double> best(positions.size(), 1e30);
  std::vector<double> round_ratios;  // last / first, within each round
  for (uint32_t r = 0; r < repeats; ++r) {
    std::vector<double> seconds(forks.size());
    for (size_t n = 0; n < forks.size(); ++n) {
      // Odd rounds go last to first: neither position always goes first.
      const size_t i = r % 2 == 0 ? n : forks.size() - 1 - n;
      const auto t0 = Clock::now();
      run(*forks[i], positions[i] + uint64_t(r) * steps, steps, true);
      seconds[i] = std::chrono::duration<double>(Clock::now() - t0).count();
      best[i] = std::min(best[i], seconds[i]);
    }
    round_ratios.push_back(seconds.back() / seconds.front());
  }
  std::sort(round_ratios.begin(), round_ratios.end());
  const double median_ratio = round_ratios[round_ratios.size() / 2];
  nlohmann::json points = nlohmann::json::array();
  for (size_t i = 0; i < positions.size(); ++i) {
    points.push_back({{"position", positions[i]},
                      {"seconds_per_token", best[i] / steps},
                      {"steps", steps},
                      {"repeats", repeats}});
  }
  nlohmann::json out = {
      {"where", server.empty() ? "in-process" : "server"},
      {"heads", heads},
      {"dim", dim},
      {"rule", rule},
      {"points", points},
      {"prefill_seconds", prefill_seconds},
      {"last_over_first", median_ratio},
      {"last_over_first_best",
       points.back()["seconds_per_token"].get<double>() /
           points.front()["seconds_per_token"].get<double>()}};
  std::cout << out.dump() << "\n";
  return 0;
}

}  // namespace
}  // namespace linattn

int main(int argc, char** argv) { return linattn::Main(argc, argv); }
