// linattn-load's driver: the sessions of a run sent to AttentionService on
// gRPC's callback API (each session, or group of --batch sessions, one
// stream with one message in flight; closed or open loop; --failover's
// resumed streams), and what it measured.
#ifndef LINATTN_CLIENTS_LOAD_DRIVER_H_
#define LINATTN_CLIENTS_LOAD_DRIVER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "clients/load/inputs.h"
#include "clients/load/options.h"
#include "linattn/v1/attention.grpc.pb.h"

namespace linattn {

struct DriveResult {
  double seconds = 0;  // the first stream's start to the last's end
  uint64_t steps = 0;
  uint64_t prefill_tokens = 0;
  bool duration_reached = false;
  std::map<std::string, uint64_t> errors;   // by gRPC code name
  std::map<std::string, uint64_t> retried;  // --failover: by the code
  uint64_t unanswered_steps = 0;
  std::vector<uint32_t> latencies_us;          // of each decode step
  std::vector<uint32_t> prefill_latencies_us;  // of each Prefill
  double prefill_seconds = 0;  // first Prefill sent to last answered
};

// Runs `records`' sessions (created already) on `stub`, at most
// Streams(options) streams at once, until every step is sent or
// options.duration_s passed. The outputs of sessions below `verify` are
// kept in their records for the verifier.
DriveResult Drive(const LoadOptions& options, const InputPool& pool,
                  v1::AttentionService::Stub& stub,
                  std::vector<SessionRecord>& records, uint32_t verify);

}  // namespace linattn

#endif  // LINATTN_CLIENTS_LOAD_DRIVER_H_
