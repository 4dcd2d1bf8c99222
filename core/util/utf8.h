// UTF-8 validity, as text on the wire needs it: proto3 `string` fields must
// hold valid UTF-8 or standard clients refuse the whole message.
//
//   IsValidUtf8(s)        whether s is well-formed UTF-8 (Unicode 15, §3.9
//                         Table 3-7: no overlongs, no surrogates, ≤ U+10FFFF)
//   ToValidUtf8(s)        s with every ill-formed part replaced by U+FFFD
//   Utf8Stream            the same, fed piece by piece: a character split
//                         across pieces is held back until it completes
//
// Replacement follows the Unicode "maximal subpart" practice (also WHATWG's
// decoder): each maximal prefix of a would-be sequence that cannot be
// completed becomes one U+FFFD, and decoding resumes at the byte that broke
// it, so bytes are never swallowed and valid text around them is unchanged.
#ifndef LINATTN_CORE_UTIL_UTF8_H_
#define LINATTN_CORE_UTIL_UTF8_H_

#include <string>

#include "absl/strings/string_view.h"

namespace linattn {

bool IsValidUtf8(absl::string_view s);
std::string ToValidUtf8(absl::string_view s);
// The Unicode White_Space property (PropList.txt) of one code point.
bool IsUnicodeWhiteSpace(char32_t c);

// Accumulates bytes and releases valid UTF-8: complete characters as they
// are, ill-formed parts as U+FFFD, and nothing of a character that may still
// complete. Not thread-safe.
class Utf8Stream {
 public:
  std::string Push(absl::string_view bytes);
  // The end of the stream: a character still incomplete becomes U+FFFD.
  std::string Flush();

 private:
  std::string pending_;
};

}  // namespace linattn

#endif  // LINATTN_CORE_UTIL_UTF8_H_
