#include "core/util/utf8.h"

#include <cstdint>

namespace linattn {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

enum class Scan { kComplete, kIncomplete, kIllFormed };

// The sequence that starts at s[0] (n ≥ 1 bytes available). kComplete and
// kIllFormed set *used: the sequence's length, or the length of the maximal
// subpart to replace (≥ 1). kIncomplete: all n bytes are a valid prefix of a
// longer sequence.
Scan ScanOne(const unsigned char* s, size_t n, size_t* used) {
  const unsigned char c = s[0];
  if (c < 0x80) {
    *used = 1;
    return Scan::kComplete;
  }
  // Table 3-7: the length and the allowed range of the second byte.
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;  // no overlongs
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;  // no overlongs
    if (c == 0xF4) hi = 0x8F;  // ≤ U+10FFFF
  } else {  // a continuation byte, C0/C1 or F5..FF: never a lead
    *used = 1;
    return Scan::kIllFormed;
  }
  for (size_t i = 1; i < len; ++i) {
    if (i == n) return Scan::kIncomplete;
    const unsigned char b = s[i];
    const bool ok = i == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) {
      *used = i;
      return Scan::kIllFormed;
    }
  }
  *used = len;
  return Scan::kComplete;
}

// Appends the valid rendering of s to out; returns how many bytes of s were
// consumed (all but an incomplete tail when `hold_tail`).
size_t Convert(absl::string_view s, bool hold_tail, std::string* out) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    size_t used = 0;
    switch (ScanOne(p + i, n - i, &used)) {
      case Scan::kComplete:
        out->append(s.data() + i, used);
        i += used;
        break;
      case Scan::kIllFormed:
        out->append(kReplacement, 3);
        i += used;
        break;
      case Scan::kIncomplete:
        if (hold_tail) return i;
        out->append(kReplacement, 3);  // the tail is one maximal subpart
        return n;
    }
  }
  return n;
}

}  // namespace

bool IsUnicodeWhiteSpace(char32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D);
  switch (c) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

bool IsValidUtf8(absl::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    if (p[i] < 0x80) {  // the common case, byte by byte
      ++i;
      continue;
    }
    size_t used = 0;
    if (ScanOne(p + i, s.size() - i, &used) != Scan::kComplete) return false;
    i += used;
  }
  return true;
}

std::string ToValidUtf8(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  Convert(s, /*hold_tail=*/false, &out);
  return out;
}

std::string Utf8Stream::Push(absl::string_view bytes) {
  pending_.append(bytes.data(), bytes.size());
  std::string out;
  const size_t used = Convert(pending_, /*hold_tail=*/true, &out);
  pending_.erase(0, used);
  return out;
}

std::string Utf8Stream::Flush() {
  std::string out;
  Convert(pending_, /*hold_tail=*/false, &out);
  pending_.clear();
  return out;
}

}  // namespace linattn
