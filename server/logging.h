// The server's logs: spdlog to stdout, as text or (--log-json) one JSON
// object per line built with a JSON library, so that log collectors can
// parse every line whatever a message holds (ill-formed UTF-8 becomes
// U+FFFD, control characters are escaped).
//
// Two loggers: "linattn" (the default logger: start, stop, warnings) and
// "access" (one line per gRPC call and HTTP request, server/observability.h),
// whose JSON lines carry the request's fields at the top level:
//   {"time":…,"level":"info","logger":"access","protocol":"grpc",
//    "method":"linattn.v1.AttentionService/Decode","session":…,"tenant":…,
//    "status":"OK","code":0,"latency_ms":…,"tokens_in":…,"tokens_out":…,
//    "peer":…}
#ifndef LINATTN_SERVER_LOGGING_H_
#define LINATTN_SERVER_LOGGING_H_

#include <string>

#include "nlohmann/json.hpp"

namespace linattn {

// Installs the default logger ("linattn", stdout) at `level`, and the
// access logger (same sink; off unless `access_log`).
void SetUpLogging(const std::string& level, bool json, bool access_log = true);

// Writes one access line: `fields` as top-level members (JSON), or as
// `key=value` pairs after "access" (text). Cheap when the access logger is
// off.
void LogAccess(const nlohmann::json& fields);
bool AccessLogOn();

}  // namespace linattn

#endif  // LINATTN_SERVER_LOGGING_H_
