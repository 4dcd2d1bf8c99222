// `linattn explain`: the seed's interactive module (core/attention/
// explainer.h) as text or JSON, stepped in this process or, with --server,
// in a server session whose state is read back through Inspect.
#ifndef LINATTN_CLIENTS_CLI_EXPLAIN_H_
#define LINATTN_CLIENTS_CLI_EXPLAIN_H_

#include <string>

#include "absl/status/statusor.h"
#include "clients/common/connection.h"
#include "core/attention/explainer.h"

namespace linattn {

// The prefix's steps in a session of the server at `server` (host:port),
// reached as `connection` says: ε = 0 exactly, the state read through
// Inspect, the session deleted after.
absl::StatusOr<ExplainResult> ExplainOnServer(
    const ExplainOptions& options, const std::string& server,
    const ConnectionOptions& connection = {});

}  // namespace linattn

#endif  // LINATTN_CLIENTS_CLI_EXPLAIN_H_
