#include "clients/load/report.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace linattn {

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

double Percentile(std::vector<uint32_t>& v, double p) {
  if (v.empty()) return 0;
  const size_t i =
      std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  std::nth_element(v.begin(), v.begin() + i, v.end());
  return v[i];
}

LoadSummary Summarize(const DriveResult& r, const LoadOptions& o) {
  LoadSummary summary;
  summary.seconds = r.seconds;
  summary.steps = r.steps;
  summary.prefill_tokens = r.prefill_tokens;
  summary.steps_per_second = summary.steps / summary.seconds;
  summary.duration_reached = r.duration_reached;
  summary.rate_missed = o.rate > 0 && summary.steps_per_second < 0.95 * o.rate;
  summary.errors = r.errors;
  summary.retried = r.retried;
  summary.unanswered_steps = r.unanswered_steps;
  std::vector<uint32_t> lat = r.latencies_us;
  std::vector<uint32_t> prefill_latencies = r.prefill_latencies_us;
  summary.p50_us = Percentile(lat, 0.50);
  summary.p90_us = Percentile(lat, 0.90);
  summary.p99_us = Percentile(lat, 0.99);
  summary.max_us = lat.empty() ? 0 : *std::max_element(lat.begin(), lat.end());
  if (!prefill_latencies.empty()) {
    summary.prefill_seconds = r.prefill_seconds;
    summary.prefill_tokens_per_second =
        summary.prefill_tokens / summary.prefill_seconds;
    summary.prefill_p50_us = Percentile(prefill_latencies, 0.5);
    summary.prefill_max_us =
        *std::max_element(prefill_latencies.begin(), prefill_latencies.end());
  }
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
          {"rule", o.rule},
          {"concurrency", Streams(o)},
          {"batch", std::max<uint32_t>(o.batch, 1)},
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
          {"retried", s.retried},
          {"unanswered_steps", s.unanswered_steps},
          {"verified_sessions", s.verified_sessions},
          {"mismatched_sessions", s.mismatched_sessions},
          {"duration_reached", s.duration_reached},
          {"rate_missed", s.rate_missed},
          {"ok", s.ok()}};
}

namespace {

// The summary's last line.
std::string Verdict(const LoadSummary& s, const LoadOptions& o) {
  if (!s.ok()) return "FAILED";
  if (s.rate_missed) {
    return absl::StrFormat(
        "OK, but the target rate was missed: %.0f of %.0f steps/s",
        s.steps_per_second, o.rate);
  }
  if (s.duration_reached) return "OK (a timed run: --duration ended it)";
  return "OK";
}

}  // namespace

std::string SummaryText(const LoadSummary& s, const LoadOptions& o) {
  std::string errors;
  for (const auto& [code, n] : s.errors)
    absl::StrAppend(&errors, " ", code, "=", n);
  std::string retried;
  for (const auto& [code, n] : s.retried)
    absl::StrAppend(&retried, " ", code, "=", n);
  if (!retried.empty()) {
    retried = absl::StrCat(
        "failover: streams reopened after", retried, "; ", s.unanswered_steps,
        " step(s) found applied past the acknowledged position (unanswered, "
        "or another client's)\n");
  }
  return absl::StrFormat(
      "%u sessions × %u steps (H=%u, d=%u, %s, %s loop) against %s\n"
      "steps: %llu in %.2f s = %.0f steps/s%s\n"
      "step latency: p50 %.0f µs, p90 %.0f µs, p99 %.0f µs, max %.0f µs\n%s"
      "%serrors:%s\n"
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
      retried, errors.empty() ? " none" : errors, s.verified_sessions,
      s.mismatched_sessions, Verdict(s, o));
}

}  // namespace linattn
