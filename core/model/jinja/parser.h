// The parser: tokens → statements, for the language subset published chat
// templates use. Anything outside it — template inheritance and includes,
// call and filter blocks, recursive loops, unknown filters and tests,
// *args/**kwargs in calls — is refused with its line and column, never
// rendered approximately.
#ifndef LINATTN_CORE_MODEL_JINJA_PARSER_H_
#define LINATTN_CORE_MODEL_JINJA_PARSER_H_

#include <vector>

#include "absl/status/statusor.h"
#include "core/model/jinja/ast.h"
#include "core/model/jinja/lexer.h"

namespace linattn::jinja {

absl::StatusOr<Body> Parse(const std::vector<Token>& tokens);

}  // namespace linattn::jinja

#endif  // LINATTN_CORE_MODEL_JINJA_PARSER_H_
