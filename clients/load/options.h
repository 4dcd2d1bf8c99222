// linattn-load's options for AttentionService runs (clients/load/load.h)
// and the checks they must pass before a run opens any session.
#ifndef LINATTN_CLIENTS_LOAD_OPTIONS_H_
#define LINATTN_CLIENTS_LOAD_OPTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "clients/common/connection.h"
#include "core/attention/spec.h"

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
  // linear | gated | delta | gated_delta | rwkv7 | rwkv6: the other rules
  // with identity features, log-gates in [−0.1, 0] (rwkv7: [−0.6065, 0]),
  // β in [0, 1] and rwkv7's a and b from the input pool (inputs.h), the
  // delta rules' q and k L2-normalised; rwkv7 and rwkv6 with a gate per key
  // channel, rwkv6 with a bonus u uniform in [−1, 1] from the seed.
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

// INVALID_ARGUMENT naming the flag when `options` cannot run: a server that
// is not on loopback (without allow_non_loopback), no sessions or steps,
// and flags that need others (--failover, --ledger and --only need
// --session-prefix; --shared-memory needs --prefill and a unix socket).
absl::Status CheckLoadOptions(const LoadOptions& options);

// The sessions' spec these options give.
absl::StatusOr<AttentionSpec> LoadSpec(const LoadOptions& options);

// Streams a run keeps open at once: --concurrency, at most (and by default)
// one per session, or per group of --batch sessions.
uint32_t Streams(const LoadOptions& options);

// True for 127.0.0.0/8, localhost and [::1] addresses.
bool IsLoopbackAddress(const std::string& address);

}  // namespace linattn

#endif  // LINATTN_CLIENTS_LOAD_OPTIONS_H_
