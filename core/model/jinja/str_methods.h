// Python's str methods as templates call them ("x".startswith(…),
// .split(), .strip() …), and the case mappings the filters share. Case
// mapping is per code point (utf8proc's simple mappings; Python's few
// one-to-many mappings such as ß → SS are not applied).
#ifndef LINATTN_CORE_MODEL_JINJA_STR_METHODS_H_
#define LINATTN_CORE_MODEL_JINJA_STR_METHODS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/model/jinja/value.h"

namespace linattn::jinja {

// The bound method `name` of string `s`, or undefined if str has none
// that templates may call.
absl::StatusOr<Value> StringMethod(const Value& s, const std::string& name);

std::string Upper(absl::string_view s);
std::string Lower(absl::string_view s);
// str.capitalize(): the first character upper case, the rest lower.
std::string Capitalize(absl::string_view s);
// str.strip(chars) (chars undefined or None: whitespace); which: 'l', 'r'
// or 'b'.
absl::StatusOr<std::string> StripChars(absl::string_view s, const Value& chars,
                                       char which);
// str.splitlines(): split at Python's line boundaries, which go.
std::vector<std::string> SplitLines(absl::string_view s);
// str.replace(old, new, count) (count < 0: all); RESOURCE_EXHAUSTED for a
// result past kMaxStringBytes.
absl::StatusOr<std::string> Replace(absl::string_view s, absl::string_view from,
                                    absl::string_view to, int64_t count);

}  // namespace linattn::jinja

#endif  // LINATTN_CORE_MODEL_JINJA_STR_METHODS_H_
