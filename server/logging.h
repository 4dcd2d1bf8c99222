// The server's log: spdlog to stdout, as text or (--log-json) one JSON
// object per line with the message escaped, so that log collectors can parse
// every line whatever a message contains.
#ifndef LINATTN_SERVER_LOGGING_H_
#define LINATTN_SERVER_LOGGING_H_

#include <string>

#include "absl/strings/string_view.h"

namespace linattn {

// `text` as the inside of a JSON string: quotes, backslashes and control
// characters escaped, ill-formed UTF-8 replaced by U+FFFD.
std::string JsonEscape(absl::string_view text);

// Installs the default logger ("linattn", stdout) at `level`.
void SetUpLogging(const std::string& level, bool json);

}  // namespace linattn

#endif  // LINATTN_SERVER_LOGGING_H_
