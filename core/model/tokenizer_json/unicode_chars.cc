#include "core/model/tokenizer_json/unicode_chars.h"

#include <utf8proc.h>

#include <cstdlib>

#include "core/util/utf8.h"

namespace linattn::tokenizer_json {

char32_t CodePointAt(absl::string_view s, size_t i, size_t* len) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  const size_t n = Utf8Length(p[0]);
  *len = n;
  switch (n) {
    case 1:
      return p[0];
    case 2:
      return (char32_t{p[0] & 0x1Fu} << 6) | (p[1] & 0x3Fu);
    case 3:
      return (char32_t{p[0] & 0x0Fu} << 12) | (char32_t{p[1] & 0x3Fu} << 6) |
             (p[2] & 0x3Fu);
    default:
      return (char32_t{p[0] & 0x07u} << 18) | (char32_t{p[1] & 0x3Fu} << 12) |
             (char32_t{p[2] & 0x3Fu} << 6) | (p[3] & 0x3Fu);
  }
}

void AppendUtf8(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

bool IsWhiteSpace(char32_t c) { return IsUnicodeWhiteSpace(c); }

namespace {
utf8proc_category_t Category(char32_t c) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(c));
}
}  // namespace

bool IsNumeric(char32_t c) {
  const auto cat = Category(c);
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL ||
         cat == UTF8PROC_CATEGORY_NO;
}

bool IsPunctuation(char32_t c) {
  if (c < 0x80) {
    return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) ||
           (c >= 0x5B && c <= 0x60) || (c >= 0x7B && c <= 0x7E);
  }
  switch (Category(c)) {
    case UTF8PROC_CATEGORY_PC:
    case UTF8PROC_CATEGORY_PD:
    case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI:
    case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO:
      return true;
    default:
      return false;
  }
}

bool IsMark(char32_t c) {
  const auto cat = Category(c);
  return cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC ||
         cat == UTF8PROC_CATEGORY_ME;
}

bool IsWordChar(char32_t c) {
  if (c < 0x80) {
    return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') ||
           (c >= 'a' && c <= 'z') || c == '_';
  }
  switch (Category(c)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      break;
  }
  // Join_Control, and the Other_Alphabetic characters outside L and M (the
  // circled and squared Latin letters, category So).
  return c == 0x200C || c == 0x200D || (c >= 0x24B6 && c <= 0x24E9) ||
         (c >= 0x1F130 && c <= 0x1F149) || (c >= 0x1F150 && c <= 0x1F169) ||
         (c >= 0x1F170 && c <= 0x1F189);
}

std::string Normalize(absl::string_view s, NormalForm form) {
  bool ascii = true;
  for (unsigned char b : s) ascii &= b < 0x80;
  if (ascii) return std::string(s);  // every form leaves ASCII as it is
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::kNfc:
      options |= UTF8PROC_COMPOSE;
      break;
    case NormalForm::kNfd:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case NormalForm::kNfkc:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case NormalForm::kNfkd:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
  }
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                   static_cast<utf8proc_ssize_t>(s.size()), &out,
                   static_cast<utf8proc_option_t>(options));
  if (n < 0) return std::string(s);  // valid UTF-8 in: cannot happen
  std::string result(reinterpret_cast<char*>(out), static_cast<size_t>(n));
  std::free(out);
  return result;
}

std::string Lowercase(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const unsigned char b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      out.push_back(static_cast<char>(b >= 'A' && b <= 'Z' ? b + 32 : b));
      ++i;
      continue;
    }
    size_t len;
    const char32_t c = CodePointAt(s, i, &len);
    i += len;
    if (c == 0x130) {  // SpecialCasing: İ → i + combining dot above
      out += "i\xCC\x87";
      continue;
    }
    AppendUtf8(static_cast<char32_t>(
                   utf8proc_tolower(static_cast<utf8proc_int32_t>(c))),
               &out);
  }
  return out;
}

}  // namespace linattn::tokenizer_json
