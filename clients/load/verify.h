// linattn-load's checks that no step was lost or leaked: the sampled
// sessions of a run recomputed locally and compared with what the server
// answered, and the crash ledger (--ledger, --check) of acknowledged
// positions that a server must still hold after a kill.
#ifndef LINATTN_CLIENTS_LOAD_VERIFY_H_
#define LINATTN_CLIENTS_LOAD_VERIFY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "clients/load/inputs.h"
#include "clients/load/options.h"
#include "clients/load/report.h"

namespace linattn {

// Recomputes sessions [0, verify) of `records` from their inputs and counts
// in `summary` those verified and those whose outputs differ: bit for bit
// for decode-only sessions, within the fp32 bounds of the chunkwise order
// after a prefill.
absl::Status VerifySessions(const LoadOptions& options,
                            const AttentionSpec& spec, const InputPool& pool,
                            const std::vector<SessionRecord>& records,
                            uint32_t verify, LoadSummary* summary);

// Writes each session's acknowledged position into options.ledger (the
// larger of it and what the file held), atomically.
absl::Status WriteLedger(const LoadOptions& options,
                         const std::vector<SessionRecord>& records);

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

}  // namespace linattn

#endif  // LINATTN_CLIENTS_LOAD_VERIFY_H_
