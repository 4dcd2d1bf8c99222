#include "clients/cli/explain.h"

#include "absl/strings/str_cat.h"
#include "clients/cli/remote.h"
#include "core/util/status_macros.h"

namespace linattn {

absl::StatusOr<ExplainResult> ExplainOnServer(
    const ExplainOptions& options, const std::string& server,
    const ConnectionOptions& connection) {
  if (options.feature_map == "identity") {
    return absl::InvalidArgumentError(
        "feature_map: the explainer runs identity as premapped features, "
        "which client sessions do not take; explain it without --server");
  }
  auto stepper =
      [&server, &connection](
          const AttentionSpec& spec, const SequenceInput& in,
          const SequenceOutput& out) -> absl::StatusOr<ExplainState> {
    RemoteAttention remote(server, connection);
    LINATTN_ASSIGN_OR_RETURN(v1::Session session,
                             remote.CreateSession(spec, spec.epsilon));
    absl::Status s = remote.Decode(session.session_id(), spec, in, out);
    absl::StatusOr<v1::InspectResponse> state =
        s.ok() ? remote.Inspect(session.session_id()) : s;
    (void)remote.DeleteSession(session.session_id());
    if (!state.ok()) return state.status();
    ExplainState r;
    r.s.assign(state->s().begin(), state->s().end());
    r.z.assign(state->z().begin(), state->z().end());
    if (state->key_log_scale_size() == 1) {
      r.key_log_scale = state->key_log_scale(0);
    }
    return r;
  };
  LINATTN_ASSIGN_OR_RETURN(ExplainResult result, Explain(options, stepper));
  result.server = server;
  return result;
}

}  // namespace linattn
