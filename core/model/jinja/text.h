// Text helpers with Python's view of characters: what str.isspace() and
// the regex class \s count as whitespace, UTF-8 code points.
#ifndef LINATTN_CORE_MODEL_JINJA_TEXT_H_
#define LINATTN_CORE_MODEL_JINJA_TEXT_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"
#include "core/model/jinja/value.h"

namespace linattn::jinja {

// Python's str.isspace() for one code point: White_Space plus the
// information separators U+001C–U+001F.
bool IsPySpace(char32_t c);
// The byte length of the UTF-8 sequence at s[i] (1 for a stray byte).
size_t Utf8LengthAt(absl::string_view s, size_t i);
// The byte length of the whitespace character at s[i], 0 if none.
size_t SpaceLengthAt(absl::string_view s, size_t i);
bool IsAllSpace(absl::string_view s);
// str.rstrip() / lstrip() / strip() with no argument.
absl::string_view RStripSpace(absl::string_view s);
absl::string_view LStripSpace(absl::string_view s);

}  // namespace linattn::jinja

#endif  // LINATTN_CORE_MODEL_JINJA_TEXT_H_
