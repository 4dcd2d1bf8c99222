// linattn-load: a session-aware load generator for AttentionService.
//
// N sessions × T decode steps each (optionally a P-token Prefill first),
// over Decode streams (or DecodeBatch streams carrying a group of sessions
// per message), either closed loop (at most `concurrency` streams at
// once, each sending its next token when the previous answer arrives) or
// open loop (`rate` steps/s in total, latency measured from each step's
// scheduled time so a slow server cannot hide its queueing). Bounded by
// `duration`. Every session's inputs are a deterministic function of
// (seed, session, token), so a sample of sessions is recomputed locally
// afterwards: any output that differs beyond fp32 rounding means a leaked
// or lost step, and the run fails.
#ifndef LINATTN_CLIENTS_LOAD_LOAD_H_
#define LINATTN_CLIENTS_LOAD_LOAD_H_

#include <grpcpp/support/status.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "clients/common/connection.h"
#include "nlohmann/json.hpp"

namespace linattn {

struct LoadOptions {
  std::string server = "127.0.0.1:50051";
  bool allow_non_loopback = false;
  uint32_t sessions = 32;
  uint32_t steps = 200;
  uint32_t prefill = 0;  // tokens per session before decoding
  uint32_t heads = 8;
  uint32_t dim = 64;  // key_dim = value_dim
  std::string feature_map = "elu1";
  // linear | gated | delta | gated_delta: the gated and delta rules with
  // identity features, log-gates in [−0.1, 0] and β in [0, 1] from the
  // input pool, the delta rules' q and k L2-normalised.
  std::string rule = "linear";
  bool unnormalized = false;  // y = φ(q)ᵀS (identity always is)
  uint32_t horizon = 0;       // cosine: M (0 = prefill + steps)
  uint32_t concurrency = 0;   // streams at once (0 = all of them; Streams())
  // Sessions per DecodeBatch message: 0 or 1 = one Decode stream per
  // session; B > 1 = one DecodeBatch stream per group of B sessions.
  uint32_t batch = 0;
  double rate = 0;         // open loop: total steps/s (0 = closed loop)
  double duration_s = 60;  // hard bound on the whole run
  uint32_t verify = 8;     // sessions recomputed locally
  uint64_t seed = 1;
  bool progress = true;  // a line per second on stderr
  // Durable sessions (the crash check, tools/crash_check.sh): sessions are
  // named <session_prefix>-0 … -(N−1); one that exists already is continued
  // from its position (token t of session i is the same input whatever run
  // sends it), and every session is kept when the run ends. Decode only
  // (prefill 0), so that every state is exact.
  std::string session_prefix;
  // After the run, the acknowledged position of each session goes here (a
  // JSON object id → position, keeping the larger of it and what the file
  // held).
  std::string ledger;
  // With session_prefix: every step names the position it follows
  // (expected_position), and a stream that ends with UNAVAILABLE, CANCELLED or
  // ABORTED (a replica died, or handed its sessions to another) or
  // FAILED_PRECONDITION (a session stood elsewhere: another client moved
  // it) is continued on a new stream once GetSession says where each of its
  // sessions stands; a step the server applied without answering then
  // counts as acknowledged, and a session found behind its acknowledged
  // position is an error (DATA_LOSS).
  bool failover = false;
  // With session_prefix: run only sessions <prefix>-i for these i (with
  // their own inputs), not 0 … sessions−1.
  std::vector<uint32_t> only;
  // Tensors as packed little-endian float32 bytes (q_bytes, … and the
  // responses' output_bytes) rather than repeated floats.
  bool tensors_as_bytes = true;
  // Prefills' tensors in a memfd of each unit's (PrefillRequest
  // .shared_memory), for a server with --shared-memory on a unix socket.
  bool shared_memory = false;
  // How to reach `server`: TLS, a client certificate, an API key
  // (clients/common/connection.h).
  ConnectionOptions connection;
};

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

// Runs the load; errors only for bad options or an unreachable server (each
// failed call is counted in the summary instead).
absl::StatusOr<LoadSummary> RunLoad(const LoadOptions& options);

nlohmann::json SummaryJson(const LoadSummary& summary,
                           const LoadOptions& options);
std::string SummaryText(const LoadSummary& summary, const LoadOptions& options);

// The check after a crash: every session of the ledger must exist, be at
// least at its acknowledged position, and hold exactly (bit for bit) the
// state of its inputs recomputed locally, step by step, up to its position.
struct LedgerCheck {
  uint32_t sessions = 0;
  uint32_t missing = 0;     // not on the server
  uint32_t behind = 0;      // an acknowledged step is lost
  uint32_t mismatched = 0;  // the state differs from the recomputation
  uint64_t acknowledged = 0, recovered = 0;  // positions summed
  std::vector<std::string> problems;         // one line per session
  bool ok() const { return missing + behind + mismatched == 0; }
};
absl::StatusOr<LedgerCheck> CheckLedger(const LoadOptions& options);
std::string LedgerCheckText(const LedgerCheck& check);

// Streams a run keeps open at once: --concurrency, at most (and by default)
// one per session, or per group of --batch sessions.
uint32_t Streams(const LoadOptions& options);

// True for 127.0.0.0/8, localhost and [::1] addresses.
bool IsLoopbackAddress(const std::string& address);

// A gRPC status code's name ("UNAVAILABLE"), as summaries count errors.
const char* CodeName(grpc::StatusCode code);

}  // namespace linattn

#endif  // LINATTN_CLIENTS_LOAD_LOAD_H_
