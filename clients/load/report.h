// linattn-load's report of an AttentionService run: the summary a run
// ends with (clients/load/load.h), as JSON (--json) and as text.
#ifndef LINATTN_CLIENTS_LOAD_REPORT_H_
#define LINATTN_CLIENTS_LOAD_REPORT_H_

#include <grpcpp/support/status.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "clients/load/driver.h"
#include "clients/load/options.h"
#include "nlohmann/json.hpp"

namespace linattn {

struct LoadSummary {
  uint64_t steps = 0;
  uint64_t prefill_tokens = 0;
  double seconds = 0;
  double steps_per_second = 0;
  double p50_us = 0, p90_us = 0, p99_us = 0, max_us = 0;  // decode steps
  // Prefill: first request sent to last answer received, all sessions.
  double prefill_seconds = 0, prefill_tokens_per_second = 0;
  double prefill_p50_us = 0, prefill_max_us = 0;
  std::map<std::string, uint64_t> errors;  // by gRPC code name
  // --failover: streams reopened, by the code that ended them, and steps
  // found applied though their answer never came.
  std::map<std::string, uint64_t> retried;
  uint64_t unanswered_steps = 0;
  uint32_t verified_sessions = 0;
  uint32_t mismatched_sessions = 0;
  // The --duration bound ended the run before every step was sent (a timed
  // run: not a failure).
  bool duration_reached = false;
  // Open loop: the rate actually sent fell short of --rate (by more than
  // 5%); the latencies then describe a lighter load than asked for.
  bool rate_missed = false;
  bool ok() const { return errors.empty() && mismatched_sessions == 0; }
};

// The summary of what the driver measured (the verifier's counts are
// added after).
LoadSummary Summarize(const DriveResult& result, const LoadOptions& options);

nlohmann::json SummaryJson(const LoadSummary& summary,
                           const LoadOptions& options);
std::string SummaryText(const LoadSummary& summary, const LoadOptions& options);

// The value at fraction `p` of `v` (reordered), 0 when empty.
double Percentile(std::vector<uint32_t>& v, double p);

// A gRPC status code's name ("UNAVAILABLE"), as summaries count errors.
const char* CodeName(grpc::StatusCode code);

}  // namespace linattn

#endif  // LINATTN_CLIENTS_LOAD_REPORT_H_
