#include "clients/load/generation_load.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "clients/cli/remote.h"
#include "clients/load/load.h"
#include "core/model/forward.h"
#include "linattn/v1/generation.grpc.pb.h"

namespace linattn {
namespace {

using Clock = std::chrono::steady_clock;
using Stub = v1::GenerationService::Stub;

double Millis(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  const size_t i =
      std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  std::nth_element(v.begin(), v.begin() + i, v.end());
  return v[i];
}

// What one session sent and got: per turn the user ids and the reply.
struct SessionLog {
  std::string id;
  std::vector<std::vector<int32_t>> user, reply;
};

// The user ids of turn `turn` of session `session`: the same for every run
// with the same seed.
std::vector<int32_t> UserTurn(uint64_t seed, uint32_t session, uint32_t turn,
                              uint32_t tokens, uint32_t vocab) {
  std::mt19937_64 rng(seed ^ (uint64_t{session} << 32) ^ (uint64_t{turn} << 8));
  std::vector<int32_t> ids(tokens);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng() % vocab);
  return ids;
}

class GenerationRun {
 public:
  GenerationRun(const GenerationLoadOptions& o, Stub* stub, uint32_t vocab)
      : o_(o), stub_(stub), vocab_(vocab), logs_(o.sessions) {}

  void Run() {
    start_ = Clock::now();
    deadline_ = start_ + std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double>(o_.duration_s));
    const uint32_t workers = o_.rate > 0 || o_.concurrency == 0
                                 ? o_.sessions
                                 : std::min(o_.concurrency, o_.sessions);
    std::atomic<uint32_t> next{0};
    std::vector<std::thread> threads;
    for (uint32_t w = 0; w < workers; ++w) {
      threads.emplace_back([&] {
        for (uint32_t s; (s = next.fetch_add(1)) < o_.sessions;) Session(s);
      });
    }
    for (std::thread& t : threads) t.join();
    end_ = Clock::now();
  }

  // Deletes every session this run created.
  void Cleanup() {
    for (const SessionLog& log : logs_) {
      if (log.id.empty()) continue;
      grpc::ClientContext ctx;
      NameSession(ctx, log.id);  // routed to the replica that holds it
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
      v1::DeleteModelSessionRequest req;
      req.set_session_id(log.id);
      v1::DeleteModelSessionResponse resp;
      stub_->DeleteSession(&ctx, req, &resp);
    }
  }

  GenerationLoadSummary Summary() const {
    GenerationLoadSummary s;
    s.turns = turns_;
    s.generated_tokens = tokens_;
    s.seconds = std::chrono::duration<double>(end_ - start_).count();
    s.tokens_per_second = s.seconds > 0 ? tokens_ / s.seconds : 0;
    s.ttft_p50_ms = Percentile(ttft_, 0.50);
    s.ttft_p90_ms = Percentile(ttft_, 0.90);
    s.ttft_p99_ms = Percentile(ttft_, 0.99);
    s.tbt_p50_ms = Percentile(tbt_, 0.50);
    s.tbt_p90_ms = Percentile(tbt_, 0.90);
    s.tbt_p99_ms = Percentile(tbt_, 0.99);
    s.errors = errors_;
    s.duration_reached = duration_reached_;
    return s;
  }

  const std::vector<SessionLog>& logs() const { return logs_; }

 private:
  void Error(grpc::StatusCode code) {
    std::lock_guard<std::mutex> lock(mu_);
    ++errors_[CodeName(code)];
  }

  // When turn `turn` of session `s` should start: now in a closed loop; on
  // the open loop's schedule (turn-major, so sessions interleave).
  Clock::time_point Scheduled(uint32_t s, uint32_t turn) const {
    if (o_.rate <= 0) return Clock::now();
    const double at = (double(turn) * o_.sessions + s) / o_.rate;
    return start_ + std::chrono::duration_cast<Clock::duration>(
                        std::chrono::duration<double>(at));
  }

  // A call of session `id`: routed by its id, bounded by the run's end.
  void ForSession(grpc::ClientContext& ctx, const std::string& id) const {
    NameSession(ctx, id);
    ctx.set_deadline(std::chrono::system_clock::now() +
                     (deadline_ - Clock::now()));
  }

  void Session(uint32_t s) {
    SessionLog& log = logs_[s];
    {
      // The client names the session, so that a proxy routes its first
      // call where the later ones go (deploy/README.md).
      const std::string id = NewSessionId();
      grpc::ClientContext ctx;
      NameSession(ctx, id);
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(30));
      v1::CreateModelSessionRequest req;
      req.set_model(o_.model);
      req.set_session_id(id);
      v1::ModelSession session;
      grpc::Status st = stub_->CreateSession(&ctx, req, &session);
      if (!st.ok()) return Error(st.error_code());
      log.id = session.session_id();
    }
    for (uint32_t turn = 0; turn < o_.turns; ++turn) {
      const Clock::time_point scheduled = Scheduled(s, turn);
      if (scheduled >= deadline_) {
        duration_reached_ = true;
        return;
      }
      std::this_thread::sleep_until(scheduled);
      std::vector<int32_t> user =
          UserTurn(o_.seed, s, turn, o_.turn_tokens, vocab_);
      grpc::ClientContext append_ctx;
      ForSession(append_ctx, log.id);
      v1::AppendRequest append;
      append.set_session_id(log.id);
      append.mutable_token_ids()->Add(user.begin(), user.end());
      v1::ModelSession after;
      grpc::Status st = stub_->Append(&append_ctx, append, &after);
      if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
        duration_reached_ = true;  // --duration ended the run: a timed run
        return;
      }
      if (!st.ok()) return Error(st.error_code());
      log.user.push_back(std::move(user));
      // Time to first token counts from the Generate call (closed loop) or
      // from the turn's scheduled start (open loop, which includes the
      // Append and any wait for the schedule).
      const Clock::time_point asked = o_.rate > 0 ? scheduled : Clock::now();

      grpc::ClientContext ctx;
      ForSession(ctx, log.id);
      v1::GenerateRequest req;
      req.set_session_id(log.id);
      v1::SamplingParams& sampling = *req.mutable_sampling();
      sampling.set_temperature(o_.temperature);
      sampling.set_max_tokens(o_.reply_tokens);
      sampling.set_seed(o_.seed + s);
      auto stream = stub_->Generate(&ctx, req);
      std::vector<int32_t> reply;
      std::vector<double> gaps;
      double first = -1;
      Clock::time_point last = asked;
      v1::GenerateResponse resp;
      while (stream->Read(&resp)) {
        if (resp.token_id() < 0) continue;  // a last message without a token
        const Clock::time_point now = Clock::now();
        if (first < 0) {
          first = Millis(now - asked);
        } else {
          gaps.push_back(Millis(now - last));
        }
        last = now;
        reply.push_back(resp.token_id());
      }
      st = stream->Finish();
      if (!st.ok()) {
        if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
          duration_reached_ = true;
          return;
        }
        return Error(st.error_code());
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++turns_;
        tokens_ += reply.size();
        if (first >= 0) ttft_.push_back(first);
        tbt_.insert(tbt_.end(), gaps.begin(), gaps.end());
      }
      log.reply.push_back(std::move(reply));
    }
  }

  const GenerationLoadOptions& o_;
  Stub* const stub_;
  const uint32_t vocab_;
  Clock::time_point start_, end_, deadline_;
  std::vector<SessionLog> logs_;
  std::mutex mu_;
  uint64_t turns_ = 0, tokens_ = 0;
  std::vector<double> ttft_, tbt_;
  std::map<std::string, uint64_t> errors_;
  std::atomic<bool> duration_reached_{false};
};

// Replays a session's conversation through `runner`, fed the server's
// tokens; "" when every reply token is the local argmax or within `tie` of
// it, else where it is not.
std::string Verify(ForwardRunner& runner, const Model& model,
                   const SessionLog& log, double tie) {
  const uint32_t V = model.config().vocab_size;
  ModelState state = model.NewState();
  std::vector<float> logits(V);
  for (size_t turn = 0; turn < log.reply.size(); ++turn) {
    const std::vector<int32_t>& user = log.user[turn];
    if (absl::Status s = runner.Run(state, user, logits.data()); !s.ok()) {
      return absl::StrCat("turn ", turn, ": ", s.message());
    }
    const std::vector<int32_t>& reply = log.reply[turn];
    for (size_t i = 0; i < reply.size(); ++i) {
      const int32_t got = reply[i];
      if (got < 0 || static_cast<uint32_t>(got) >= V) {
        return absl::StrCat("turn ", turn, " token ", i, ": id ", got,
                            " is outside the vocabulary");
      }
      const float best = *std::max_element(logits.begin(), logits.end());
      if (!(logits[got] >= best - tie)) {
        return absl::StrCat("turn ", turn, " token ", i, ": the server chose ",
                            got, " (logit ", logits[got],
                            ") where the local maximum is ", best);
      }
      const std::span<const int32_t> one(&reply[i], 1);
      if (absl::Status s = runner.Run(state, one, logits.data()); !s.ok()) {
        return absl::StrCat("turn ", turn, " token ", i, ": ", s.message());
      }
    }
  }
  return "";
}

}  // namespace

absl::StatusOr<GenerationLoadSummary> RunGenerationLoad(
    const GenerationLoadOptions& o) {
  if (o.sessions == 0 || o.sessions > kMaxGenerationSessions) {
    return absl::InvalidArgumentError(
        absl::StrCat("--sessions: must be in 1..", kMaxGenerationSessions,
                     " with --service generation (a thread per session "
                     "at once)"));
  }
  if (o.turns == 0 || o.turn_tokens == 0) {
    return absl::InvalidArgumentError(
        "--turns, --turn-tokens: each must be at least 1");
  }
  if (o.verify > 0 && o.temperature != 0) {
    return absl::InvalidArgumentError(
        "--verify: only greedy sessions (--temperature 0) can be verified; "
        "give --verify 0 to sample");
  }
  if (o.verify > 0 && o.verify_model_dir.empty()) {
    return absl::InvalidArgumentError(
        "--verify-model: the served model's directory is needed to verify "
        "sessions (or give --verify 0)");
  }
  std::shared_ptr<const Model> local;
  if (o.verify > 0) {
    if (absl::Status s = PrefillPrecisionSupported(o.verify_prefill_precision);
        !s.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("--verify-prefill-precision: ", s.message()));
    }
    if (absl::Status s = WeightTypeSupported(o.verify_weights); !s.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("--verify-weights: ", s.message()));
    }
    auto loaded = Model::Load(o.verify_model_dir, "", o.verify_weights);
    if (!loaded.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--verify-model: ", loaded.status().message()));
    }
    local = *std::move(loaded);
  }
  auto channel = OpenChannel(o.server, o.connection);
  auto stub = v1::GenerationService::NewStub(channel);
  // The model's vocabulary, and the server's reachability, first.
  uint32_t vocab = 0;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(10));
    v1::ListModelsResponse models;
    grpc::Status st = stub->ListModels(&ctx, {}, &models);
    if (!st.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "--server ", o.server, ": ListModels failed: ", st.error_message()));
    }
    for (const v1::ModelInfo& m : models.models()) {
      if (o.model.empty() || m.name() == o.model) {
        vocab = m.vocab_size();
        break;
      }
    }
    if (vocab == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--model: the server serves no model named '", o.model, "'"));
    }
  }
  if (local != nullptr && local->config().vocab_size != vocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--verify-model: its vocabulary (", local->config().vocab_size,
        ") is not the served model's (", vocab, ")"));
  }
  GenerationRun run(o, stub.get(), vocab);
  run.Run();
  GenerationLoadSummary summary = run.Summary();
  if (local != nullptr) {
    ForwardOptions forward;
    forward.chunkwise.precision = o.verify_prefill_precision;
    ForwardRunner runner(local, forward);
    const uint32_t n = std::min(o.verify, o.sessions);
    for (uint32_t s = 0; s < n; ++s) {
      const SessionLog& log = run.logs()[s];
      if (log.reply.empty()) continue;
      ++summary.verified_sessions;
      const std::string where = Verify(runner, *local, log, o.tie);
      if (!where.empty()) {
        ++summary.mismatched_sessions;
        if (summary.first_mismatch.empty()) {
          summary.first_mismatch = absl::StrCat("session ", s, ": ", where);
        }
      }
    }
  }
  run.Cleanup();
  return summary;
}

nlohmann::json GenerationSummaryJson(const GenerationLoadSummary& s,
                                     const GenerationLoadOptions& o) {
  return {
      {"service", "generation"},
      {"server", o.server},
      {"sessions", o.sessions},
      {"turns_per_session", o.turns},
      {"turn_tokens", o.turn_tokens},
      {"reply_tokens", o.reply_tokens},
      {"temperature", o.temperature},
      {"mode", o.rate > 0 ? "open" : "closed"},
      {"rate", o.rate},
      {"turns", s.turns},
      {"generated_tokens", s.generated_tokens},
      {"seconds", s.seconds},
      {"tokens_per_second", s.tokens_per_second},
      {"ttft_ms",
       {{"p50", s.ttft_p50_ms},
        {"p90", s.ttft_p90_ms},
        {"p99", s.ttft_p99_ms}}},
      {"tbt_ms",
       {{"p50", s.tbt_p50_ms}, {"p90", s.tbt_p90_ms}, {"p99", s.tbt_p99_ms}}},
      {"errors", s.errors},
      {"verified_sessions", s.verified_sessions},
      {"mismatched_sessions", s.mismatched_sessions},
      {"first_mismatch", s.first_mismatch},
      {"duration_reached", s.duration_reached},
      {"ok", s.ok()}};
}

}  // namespace linattn
