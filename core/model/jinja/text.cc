#include "core/model/jinja/text.h"

#include "core/util/utf8.h"

namespace linattn::jinja {

bool IsPySpace(char32_t c) {
  return IsUnicodeWhiteSpace(c) || (c >= 0x1C && c <= 0x1F);
}

size_t Utf8LengthAt(absl::string_view s, size_t i) {
  const unsigned char c = s[i];
  size_t n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
  return i + n > s.size() ? 1 : n;
}

namespace {
char32_t At(absl::string_view s, size_t i, size_t n) {
  const unsigned char c = s[i];
  char32_t cp = n == 1   ? c
                : n == 2 ? (c & 0x1F)
                : n == 3 ? (c & 0x0F)
                         : (c & 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (s[i + k] & 0x3F);
  return cp;
}
}  // namespace

size_t SpaceLengthAt(absl::string_view s, size_t i) {
  if (i >= s.size()) return 0;
  const size_t n = Utf8LengthAt(s, i);
  return IsPySpace(At(s, i, n)) ? n : 0;
}

bool IsAllSpace(absl::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = SpaceLengthAt(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

absl::string_view RStripSpace(absl::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) {
      --start;
    }
    if (SpaceLengthAt(s, start) != end - start) break;
    end = start;
  }
  return s.substr(0, end);
}

absl::string_view LStripSpace(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const size_t n = SpaceLengthAt(s, i);
    if (n == 0) break;
    i += n;
  }
  return s.substr(i);
}

}  // namespace linattn::jinja
