// How deeply a JSON text nests, found without parsing it (one pass, no
// recursion): what a server checks before it parses, copies or converts a
// document a client or a model wrote, all of which recurse per level.
#ifndef LINATTN_CORE_UTIL_JSON_DEPTH_H_
#define LINATTN_CORE_UTIL_JSON_DEPTH_H_

#include "absl/strings/string_view.h"

namespace linattn {

// The largest JSON nesting a request or a reply may hold.
inline constexpr int kMaxJsonDepth = 64;

// Whether `text` opens no more than `max_depth` arrays and objects inside
// one another (brackets inside strings do not count; the text need not be
// valid JSON).
inline bool JsonDepthWithin(absl::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

}  // namespace linattn

#endif  // LINATTN_CORE_UTIL_JSON_DEPTH_H_
