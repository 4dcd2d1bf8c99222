#include "clients/load/load.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "clients/cli/remote.h"
#include "clients/load/driver.h"
#include "clients/load/inputs.h"
#include "core/util/status_macros.h"

namespace linattn {

namespace {

// Creates the run's sessions into `records` (or, named by --session-prefix
// and existing already, continues them from their position), and takes the
// server's epsilon into `spec` for the verifier.
absl::Status OpenSessions(const LoadOptions& o, RemoteAttention& remote,
                          AttentionSpec& spec,
                          std::vector<SessionRecord>& records) {
  for (uint32_t s = 0; s < o.sessions; ++s) {
    records[s].index = o.only.empty() ? s : o.only[s];
    const std::string id =
        o.session_prefix.empty()
            ? ""
            : absl::StrCat(o.session_prefix, "-", records[s].index);
    auto session = remote.CreateSession(spec, std::nullopt, id);
    if (absl::IsAlreadyExists(session.status())) {
      // Continued from where it is.
      session = remote.GetSession(id);
      if (session.ok() &&
          (session->spec().num_heads() != o.heads ||
           session->spec().key_dim() != o.dim ||
           session->spec().feature_map() != FeatureMapName(spec.feature_map) ||
           session->spec().rule() != UpdateRuleName(spec.rule))) {
        return absl::FailedPreconditionError(
            absl::StrCat("--session-prefix: session '", id,
                         "' exists with another spec than these options give"));
      }
      if (session.ok()) records[s].start = session->position();
    }
    if (!session.ok()) return session.status();
    records[s].id = session->session_id();
    spec.epsilon =
        session->spec().epsilon();  // the server's default, for the verifier
  }

  return absl::OkStatus();
}

// Deletes every session a run created when the run ends, however it ends
// (a failure halfway through creating them included), unless the run keeps
// them (--session-prefix).
struct SessionsCleanup {
  RemoteAttention& remote;
  const std::vector<SessionRecord>& records;
  bool keep;
  ~SessionsCleanup() {
    if (keep) return;
    for (const SessionRecord& rec : records) {
      if (!rec.id.empty()) (void)remote.DeleteSession(rec.id);
    }
  }
};

}  // namespace

absl::StatusOr<LoadSummary> RunLoad(const LoadOptions& o) {
  LINATTN_RETURN_IF_ERROR(CheckLoadOptions(o));
  LINATTN_ASSIGN_OR_RETURN(AttentionSpec spec, LoadSpec(o));
  RemoteAttention remote(o.server, o.connection);
  LINATTN_ASSIGN_OR_RETURN(bool serving,
                           remote.Healthy("", std::chrono::seconds(5)));
  if (!serving) {
    return absl::UnavailableError(absl::StrCat(o.server, " is not SERVING"));
  }
  std::vector<SessionRecord> records(o.sessions);
  SessionsCleanup cleanup{remote, records, !o.session_prefix.empty()};
  LINATTN_RETURN_IF_ERROR(OpenSessions(o, remote, spec, records));
  const InputPool pool(o.seed, spec);
  const uint32_t verify = std::min(o.verify, o.sessions);
  LoadSummary summary =
      Summarize(Drive(o, pool, remote.stub(), records, verify), o);
  LINATTN_RETURN_IF_ERROR(
      VerifySessions(o, spec, pool, records, verify, &summary));
  if (!o.ledger.empty()) LINATTN_RETURN_IF_ERROR(WriteLedger(o, records));
  return summary;
}

}  // namespace linattn
