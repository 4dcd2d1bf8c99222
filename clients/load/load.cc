#include "clients/load/load.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "clients/cli/remote.h"
#include "core/attention/chunkwise.h"
#include "core/attention/recurrent.h"
#include "core/util/status_macros.h"

namespace linattn {

namespace {

using SteadyClock = std::chrono::steady_clock;

const char* CodeName(grpc::StatusCode code) {
  static const char* kNames[] = {"OK",
                                 "CANCELLED",
                                 "UNKNOWN",
                                 "INVALID_ARGUMENT",
                                 "DEADLINE_EXCEEDED",
                                 "NOT_FOUND",
                                 "ALREADY_EXISTS",
                                 "PERMISSION_DENIED",
                                 "RESOURCE_EXHAUSTED",
                                 "FAILED_PRECONDITION",
                                 "ABORTED",
                                 "OUT_OF_RANGE",
                                 "UNIMPLEMENTED",
                                 "INTERNAL",
                                 "UNAVAILABLE",
                                 "DATA_LOSS",
                                 "UNAUTHENTICATED"};
  const int i = static_cast<int>(code);
  return i >= 0 && i < 17 ? kNames[i] : "UNKNOWN";
}

// Inputs of token t of session s: uniform in [-1, 1], a pure function of
// (seed, s, t) so the verifier can regenerate them.
void TokenInputs(uint64_t seed, uint32_t session, uint64_t token, uint64_t qk,
                 uint64_t vv, float* q, float* k, float* v) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull ^ (uint64_t(session) << 40) ^ token;
  auto next = [&x] {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return static_cast<float>(
        static_cast<double>(z >> 40) / double(1ull << 23) - 1.0);
  };
  for (uint64_t i = 0; i < qk; ++i) q[i] = next();
  for (uint64_t i = 0; i < qk; ++i) k[i] = next();
  for (uint64_t i = 0; i < vv; ++i) v[i] = next();
}

struct SessionRecord {
  std::string id;
  uint64_t steps_done = 0;
  bool prefilled = false;
  std::vector<float> outputs;  // steps_done × H × d_v (sampled sessions only)
};

double Percentile(std::vector<uint32_t>& v, double p) {
  if (v.empty()) return 0;
  const size_t i =
      std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  std::nth_element(v.begin(), v.begin() + i, v.end());
  return v[i];
}

}  // namespace

bool IsLoopbackAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  std::string host = address.substr(0, colon);
  if (host.rfind("ipv4:", 0) == 0) host = host.substr(5);
  if (host == "localhost" || host == "[::1]" || host == "::1") return true;
  return host.rfind("127.", 0) == 0;
}

absl::StatusOr<LoadSummary> RunLoad(const LoadOptions& o) {
  if (!IsLoopbackAddress(o.server) && !o.allow_non_loopback) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--server: ", o.server,
        " is not a loopback address; load runs target this machine only "
        "(--allow-non-loopback to override)"));
  }
  if (o.sessions == 0 || o.steps == 0) {
    return absl::InvalidArgumentError(
        "--sessions and --steps: must be at least 1");
  }
  if (o.duration_s <= 0 || o.rate < 0) {
    return absl::InvalidArgumentError("--duration must be > 0 and --rate >= 0");
  }
  AttentionSpec spec{
      .num_heads = o.heads, .key_dim = o.dim, .value_dim = o.dim};
  LINATTN_ASSIGN_OR_RETURN(spec.feature_map, ParseFeatureMap(o.feature_map));
  LINATTN_RETURN_IF_ERROR(ValidateSpec(spec));
  const uint64_t qk = uint64_t(o.heads) * o.dim, vv = qk;
  const uint32_t concurrency =
      o.concurrency == 0 ? o.sessions : std::min(o.concurrency, o.sessions);
  const uint32_t verify = std::min(o.verify, o.sessions);

  RemoteAttention remote(o.server);
  LINATTN_ASSIGN_OR_RETURN(bool serving,
                           remote.Healthy("", std::chrono::seconds(5)));
  if (!serving)
    return absl::UnavailableError(absl::StrCat(o.server, " is not SERVING"));

  std::vector<SessionRecord> records(o.sessions);
  for (uint32_t s = 0; s < o.sessions; ++s) {
    LINATTN_ASSIGN_OR_RETURN(v1::Session session,
                             remote.CreateSession(spec, std::nullopt));
    records[s].id = session.session_id();
    spec.epsilon =
        session.spec().epsilon();  // the server's default, for the verifier
  }

  const auto start = SteadyClock::now();
  const auto deadline =
      start + std::chrono::duration_cast<SteadyClock::duration>(
                  std::chrono::duration<double>(o.duration_s));
  std::atomic<uint32_t> next_session{0};
  std::atomic<uint64_t> steps_done{0}, prefill_tokens{0};
  std::atomic<bool> timed_out{false};
  std::mutex mu;
  std::map<std::string, uint64_t> errors;
  std::vector<uint32_t> latencies, prefill_latencies;
  SteadyClock::time_point first_prefill = SteadyClock::time_point::max();
  SteadyClock::time_point last_prefill = SteadyClock::time_point::min();
  auto count_error = [&](grpc::StatusCode code) {
    std::lock_guard<std::mutex> lock(mu);
    ++errors[CodeName(code)];
  };

  auto worker = [&] {
    std::vector<uint32_t> local_latencies;
    std::vector<float> q(qk), k(qk), v(vv);
    while (true) {
      const uint32_t s = next_session.fetch_add(1);
      if (s >= o.sessions || SteadyClock::now() >= deadline) break;
      SessionRecord& rec = records[s];
      if (o.prefill > 0) {
        std::vector<float> pq(o.prefill * qk), pk(o.prefill * qk),
            pv(o.prefill * vv);
        for (uint64_t t = 0; t < o.prefill; ++t) {
          TokenInputs(o.seed, s, t, qk, vv, &pq[t * qk], &pk[t * qk],
                      &pv[t * vv]);
        }
        std::vector<float> y(o.prefill * vv), den(o.prefill * o.heads);
        std::vector<uint8_t> avail(o.prefill * o.heads);
        const auto prefill_start = SteadyClock::now();
        absl::Status st = remote.Prefill(
            rec.id, spec, {pq.data(), pk.data(), pv.data(), o.prefill},
            {y.data(), den.data(), avail.data()}, o.prefill);
        if (!st.ok()) {
          count_error(static_cast<grpc::StatusCode>(st.code()));
          continue;
        }
        rec.prefilled = true;
        prefill_tokens += o.prefill;
        {
          std::lock_guard<std::mutex> lock(mu);
          first_prefill = std::min(first_prefill, prefill_start);
          last_prefill = std::max(last_prefill, SteadyClock::now());
          prefill_latencies.push_back(static_cast<uint32_t>(
              std::chrono::duration_cast<std::chrono::microseconds>(
                  SteadyClock::now() - prefill_start)
                  .count()));
        }
      }
      grpc::ClientContext ctx;
      ctx.set_deadline(
          std::chrono::system_clock::now() +
          std::chrono::duration_cast<std::chrono::system_clock::duration>(
              deadline - SteadyClock::now()) +
          std::chrono::seconds(5));
      auto stream = remote.stub().Decode(&ctx);
      const auto stream_start = SteadyClock::now();
      // Open loop: this stream's share of the rate.
      const double interval_s = o.rate > 0 ? concurrency / o.rate : 0;
      bool failed = false;
      for (uint64_t t = 0; t < o.steps; ++t) {
        auto scheduled = SteadyClock::now();
        if (interval_s > 0) {
          scheduled =
              stream_start + std::chrono::duration_cast<SteadyClock::duration>(
                                 std::chrono::duration<double>(t * interval_s));
          std::this_thread::sleep_until(scheduled);
        }
        if (SteadyClock::now() >= deadline) {
          timed_out = true;
          break;
        }
        TokenInputs(o.seed, s, o.prefill + t, qk, vv, q.data(), k.data(),
                    v.data());
        v1::DecodeRequest req;
        req.set_session_id(rec.id);
        req.mutable_q()->Add(q.begin(), q.end());
        req.mutable_k()->Add(k.begin(), k.end());
        req.mutable_v()->Add(v.begin(), v.end());
        v1::DecodeResponse resp;
        if (!stream->Write(req) || !stream->Read(&resp)) {
          failed = true;
          break;
        }
        local_latencies.push_back(static_cast<uint32_t>(
            std::chrono::duration_cast<std::chrono::microseconds>(
                SteadyClock::now() - scheduled)
                .count()));
        if (s < verify)
          rec.outputs.insert(rec.outputs.end(), resp.output().begin(),
                             resp.output().end());
        ++rec.steps_done;
        ++steps_done;
      }
      stream->WritesDone();
      grpc::Status st = stream->Finish();
      if (!st.ok()) count_error(st.error_code());
      (void)failed;
    }
    std::lock_guard<std::mutex> lock(mu);
    latencies.insert(latencies.end(), local_latencies.begin(),
                     local_latencies.end());
  };

  std::atomic<bool> done{false};
  std::thread progress([&] {
    uint64_t last = 0;
    auto tick = SteadyClock::now();
    while (!done) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (!o.progress || SteadyClock::now() - tick < std::chrono::seconds(1))
        continue;
      const double elapsed =
          std::chrono::duration<double>(SteadyClock::now() - start).count();
      const uint64_t now_steps = steps_done.load();
      std::lock_guard<std::mutex> lock(mu);
      uint64_t n_errors = 0;
      for (const auto& [code, n] : errors) n_errors += n;
      std::fprintf(stderr, "[%6.1fs] %llu steps, %llu steps/s, %llu errors\n",
                   elapsed, static_cast<unsigned long long>(now_steps),
                   static_cast<unsigned long long>(now_steps - last),
                   static_cast<unsigned long long>(n_errors));
      last = now_steps;
      tick = SteadyClock::now();
    }
  });
  std::vector<std::thread> workers;
  for (uint32_t i = 0; i < concurrency; ++i) workers.emplace_back(worker);
  for (std::thread& t : workers) t.join();
  const double elapsed_s =
      std::chrono::duration<double>(SteadyClock::now() - start).count();
  done = true;
  progress.join();

  LoadSummary summary;
  summary.seconds = elapsed_s;
  summary.steps = steps_done;
  summary.prefill_tokens = prefill_tokens;
  summary.steps_per_second = summary.steps / summary.seconds;
  summary.timed_out = timed_out;
  summary.errors = errors;
  std::vector<uint32_t>& lat = latencies;
  summary.p50_us = Percentile(lat, 0.50);
  summary.p90_us = Percentile(lat, 0.90);
  summary.p99_us = Percentile(lat, 0.99);
  summary.max_us = lat.empty() ? 0 : *std::max_element(lat.begin(), lat.end());
  if (!prefill_latencies.empty()) {
    summary.prefill_seconds =
        std::chrono::duration<double>(last_prefill - first_prefill).count();
    summary.prefill_tokens_per_second =
        summary.prefill_tokens / summary.prefill_seconds;
    summary.prefill_p50_us = Percentile(prefill_latencies, 0.5);
    summary.prefill_max_us =
        *std::max_element(prefill_latencies.begin(), prefill_latencies.end());
  }

  // Recompute the sampled sessions locally. Decode-only sessions run the
  // same kernel as the server, so they must match bit for bit. After a
  // prefill, both sides carry fp32 rounding of the chunkwise order: for
  // these non-negative weights each output is within
  // (3n + 2d_φ + 16)·u·max|v| of the truth (tests/attention/test_util.h),
  // so the two within twice that.
  LINATTN_ASSIGN_OR_RETURN(Attention attention, Attention::Create(spec));
  const bool exact =
      o.prefill == 0 && spec.feature_map != FeatureMapKind::kIdentity;
  for (uint32_t s = 0; s < verify; ++s) {
    const SessionRecord& rec = records[s];
    if (rec.steps_done == 0) continue;
    const uint64_t prefix = rec.prefilled ? o.prefill : 0;
    const uint64_t total = prefix + rec.steps_done;
    std::vector<float> q(total * qk), k(total * qk), v(total * vv);
    for (uint64_t t = 0; t < total; ++t) {
      TokenInputs(o.seed, s, t, qk, vv, &q[t * qk], &k[t * qk], &v[t * vv]);
    }
    std::vector<float> y(total * vv), den(total * o.heads);
    std::vector<uint8_t> avail(total * o.heads);
    AttentionState state = attention.NewState();
    if (prefix > 0) {
      ChunkwiseRunner runner;
      LINATTN_RETURN_IF_ERROR(runner.Run(attention, state,
                                         {q.data(), k.data(), v.data(), prefix},
                                         {y.data(), den.data(), avail.data()}));
    }
    LINATTN_RETURN_IF_ERROR(
        StepSequence(attention, state,
                     {q.data() + prefix * qk, k.data() + prefix * qk,
                      v.data() + prefix * vv, rec.steps_done},
                     {y.data() + prefix * vv, den.data() + prefix * o.heads,
                      avail.data() + prefix * o.heads}));
    const float* expected = y.data() + prefix * vv;
    bool match = true;
    if (exact) {
      match = std::memcmp(expected, rec.outputs.data(),
                          rec.outputs.size() * sizeof(float)) == 0;
    } else {
      const double bound = 2.0 *
                           (3.0 * total + 2.0 * attention.feature_dim() + 16) *
                           0x1.0p-24 * 1.0;  // |v| ≤ 1
      for (size_t i = 0; i < rec.outputs.size() && match; ++i) {
        match = std::abs(double(expected[i]) - rec.outputs[i]) <= bound;
      }
    }
    ++summary.verified_sessions;
    if (!match) ++summary.mismatched_sessions;
  }
  for (const SessionRecord& rec : records) (void)remote.DeleteSession(rec.id);
  return summary;
}

nlohmann::json SummaryJson(const LoadSummary& s, const LoadOptions& o) {
  return {{"server", o.server},
          {"sessions", o.sessions},
          {"steps_per_session", o.steps},
          {"prefill_tokens_per_session", o.prefill},
          {"heads", o.heads},
          {"dim", o.dim},
          {"feature_map", o.feature_map},
          {"concurrency", o.concurrency == 0 ? o.sessions : o.concurrency},
          {"mode", o.rate > 0 ? "open" : "closed"},
          {"target_rate", o.rate},
          {"steps", s.steps},
          {"prefill_tokens", s.prefill_tokens},
          {"seconds", s.seconds},
          {"steps_per_second", s.steps_per_second},
          {"latency_us",
           {{"p50", s.p50_us},
            {"p90", s.p90_us},
            {"p99", s.p99_us},
            {"max", s.max_us}}},
          {"prefill",
           {{"seconds", s.prefill_seconds},
            {"tokens_per_second", s.prefill_tokens_per_second},
            {"latency_us",
             {{"p50", s.prefill_p50_us}, {"max", s.prefill_max_us}}}}},
          {"errors", s.errors},
          {"verified_sessions", s.verified_sessions},
          {"mismatched_sessions", s.mismatched_sessions},
          {"timed_out", s.timed_out},
          {"ok", s.ok()}};
}

std::string SummaryText(const LoadSummary& s, const LoadOptions& o) {
  std::string errors;
  for (const auto& [code, n] : s.errors)
    absl::StrAppend(&errors, " ", code, "=", n);
  return absl::StrFormat(
      "%u sessions × %u steps (H=%u, d=%u, %s, %s loop) against %s\n"
      "steps: %llu in %.2f s = %.0f steps/s%s\n"
      "step latency: p50 %.0f µs, p90 %.0f µs, p99 %.0f µs, max %.0f µs\n%s"
      "errors:%s\n"
      "verified: %u sessions recomputed locally, %u mismatched\n"
      "%s\n",
      o.sessions, o.steps, o.heads, o.dim, o.feature_map,
      o.rate > 0 ? "open" : "closed", o.server,
      static_cast<unsigned long long>(s.steps), s.seconds, s.steps_per_second,
      s.prefill_tokens > 0
          ? absl::StrCat(" (after ", s.prefill_tokens, " prefill tokens)")
          : "",
      s.p50_us, s.p90_us, s.p99_us, s.max_us,
      s.prefill_tokens > 0
          ? absl::StrFormat("prefill: %llu tokens in %.2f s = %.0f tokens/s "
                            "(p50 %.1f ms per "
                            "request)\n",
                            static_cast<unsigned long long>(s.prefill_tokens),
                            s.prefill_seconds, s.prefill_tokens_per_second,
                            s.prefill_p50_us / 1e3)
          : "",
      errors.empty() ? " none" : errors, s.verified_sessions,
      s.mismatched_sessions,
      s.ok() ? "OK"
             : (s.timed_out ? "FAILED (duration bound reached)" : "FAILED"));
}

}  // namespace linattn
