// Load on GenerationService: model sessions holding conversations.
//
// Each of N sessions runs `turns` turns: Append a user turn (turn_tokens
// token ids from a seeded stream, so every run sends the same
// conversation), then Generate a reply of up to reply_tokens tokens,
// streamed. Closed loop: a session starts its next turn when its reply
// ends, at most `concurrency` sessions at once. Open loop (rate > 0):
// turns start on a fixed schedule, `rate` turns per second over all
// sessions, and latencies are measured from each turn's scheduled start.
//
// Measured: generated tokens/s over the run, time to first token (from the
// Generate call, or in the open loop from the turn's scheduled start, which
// includes its Append, to its first token) and time
// between tokens (p50/p90/p99), errors by code. With a model directory,
// `verify` sessions are replayed in this process (ForwardRunner, one
// session at a time, fed the server's tokens): every greedy token the
// server chose must be the local argmax, or within `tie` of it (the server
// batches sessions, and a batch's products may round differently from one
// row's: a near-tie may fall either way). The sessions are deleted however
// the run ends.
#ifndef LINATTN_CLIENTS_LOAD_GENERATION_LOAD_H_
#define LINATTN_CLIENTS_LOAD_GENERATION_LOAD_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "clients/common/connection.h"
#include "core/attention/chunkwise.h"
#include "core/onednn/linear.h"
#include "nlohmann/json.hpp"

namespace linattn {

// Sessions run on a thread each (gRPC's synchronous API), so a run takes at
// most this many.
inline constexpr uint32_t kMaxGenerationSessions = 1024;

struct GenerationLoadOptions {
  std::string server = "127.0.0.1:50051";
  std::string model;  // as ListModels names it; empty = the server's first
  uint32_t sessions = 32;
  uint32_t turns = 2;
  uint32_t turn_tokens = 32;     // user token ids appended per turn
  uint32_t reply_tokens = 64;    // max_tokens of each Generate
  float temperature = 0;         // 0 = greedy (verifiable)
  uint32_t concurrency = 0;      // sessions at once, closed loop (0 = all)
  double rate = 0;               // open loop: turns/s over all sessions
  double duration_s = 120;       // hard bound on the whole run
  uint32_t verify = 4;           // sessions replayed locally (greedy only)
  std::string verify_model_dir;  // the served model's directory (local)
  double tie = 1e-3;  // logits this close to the local maximum count as it
  // How the server runs the model, for the local replay to run it alike
  // (its --weights and --prefill-precision).
  WeightType verify_weights = WeightType::kF32;
  PrefillPrecision verify_prefill_precision = PrefillPrecision::kF32;
  uint64_t seed = 1;
  ConnectionOptions connection;
};

struct GenerationLoadSummary {
  uint64_t turns = 0;             // completed
  uint64_t generated_tokens = 0;  // all sessions
  double seconds = 0;
  double tokens_per_second = 0;  // generated tokens / run time
  double ttft_p50_ms = 0, ttft_p90_ms = 0, ttft_p99_ms = 0;
  double tbt_p50_ms = 0, tbt_p90_ms = 0, tbt_p99_ms = 0;
  std::map<std::string, uint64_t> errors;  // by gRPC code name
  uint32_t verified_sessions = 0;
  uint32_t mismatched_sessions = 0;
  std::string first_mismatch;  // where, for the report
  bool duration_reached = false;
  bool ok() const { return errors.empty() && mismatched_sessions == 0; }
};

// INVALID_ARGUMENT for options that cannot run (naming the flag),
// UNAVAILABLE when the server cannot be reached; failed calls during the
// run are counted in the summary.
absl::StatusOr<GenerationLoadSummary> RunGenerationLoad(
    const GenerationLoadOptions& options);

nlohmann::json GenerationSummaryJson(const GenerationLoadSummary& summary,
                                     const GenerationLoadOptions& options);

}  // namespace linattn

#endif  // LINATTN_CLIENTS_LOAD_GENERATION_LOAD_H_
