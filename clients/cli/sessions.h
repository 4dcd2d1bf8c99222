// `linattn sessions list|delete`: a server's sessions of both services (the
// ones `generate --keep`, attend or a crashed client left behind), listed
// and deleted by id.
#ifndef LINATTN_CLIENTS_CLI_SESSIONS_H_
#define LINATTN_CLIENTS_CLI_SESSIONS_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "clients/common/connection.h"

namespace linattn {

// `connection`: how to reach `server` (clients/common/connection.h).

// One line per session (id, service, position, state bytes, spec or model),
// or with `json` one JSON array.
absl::Status ListSessions(const std::string& server, bool json,
                          std::ostream& out,
                          const ConnectionOptions& connection = {});

// Deletes each id from whichever service holds it; every id is tried, and
// the first failure (NOT_FOUND when neither service has it) is returned.
absl::Status DeleteSessions(const std::string& server,
                            const std::vector<std::string>& ids,
                            std::ostream& out,
                            const ConnectionOptions& connection = {});

}  // namespace linattn

#endif  // LINATTN_CLIENTS_CLI_SESSIONS_H_
