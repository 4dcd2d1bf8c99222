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
//
// The parts: options.h (flags and their checks), inputs.h (what is sent),
// driver.h (the streams), verify.h (local recomputation, crash ledger),
// report.h (the summary).
#ifndef LINATTN_CLIENTS_LOAD_LOAD_H_
#define LINATTN_CLIENTS_LOAD_LOAD_H_

#include "absl/status/statusor.h"
#include "clients/load/options.h"
#include "clients/load/report.h"
#include "clients/load/verify.h"

namespace linattn {

// Runs the load; errors only for bad options or an unreachable server (each
// failed call is counted in the summary instead).
absl::StatusOr<LoadSummary> RunLoad(const LoadOptions& options);

}  // namespace linattn

#endif  // LINATTN_CLIENTS_LOAD_LOAD_H_
