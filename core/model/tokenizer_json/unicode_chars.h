// Characters as tokenizer.json's components see them (Hugging Face
// `tokenizers`, the Rust library the files are written for): code points of
// valid UTF-8, Unicode properties from utf8proc, and the normalization forms.
#ifndef LINATTN_CORE_MODEL_TOKENIZER_JSON_UNICODE_CHARS_H_
#define LINATTN_CORE_MODEL_TOKENIZER_JSON_UNICODE_CHARS_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace linattn::tokenizer_json {

// The length of the UTF-8 sequence that starts with `lead` (1 for bytes
// that cannot start one; the text is valid UTF-8 wherever this is used).
inline size_t Utf8Length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xF0) return 4;
  if (lead >= 0xE0) return 3;
  if (lead >= 0xC0) return 2;
  return 1;
}
// The code point at s[i] of valid UTF-8; *len its byte length.
char32_t CodePointAt(absl::string_view s, size_t i, size_t* len);
void AppendUtf8(char32_t c, std::string* out);

// Rust's char::is_whitespace: the Unicode White_Space property.
bool IsWhiteSpace(char32_t c);
// Rust's char::is_numeric: general categories Nd, Nl and No.
bool IsNumeric(char32_t c);
// `tokenizers`' is_punc: ASCII punctuation or categories Pc Pd Ps Pe Pi Pf Po.
bool IsPunctuation(char32_t c);
// The Rust regex crate's Unicode \w: Alphabetic, marks, Nd, Pc and
// Join_Control.
bool IsWordChar(char32_t c);
// Category M (Mn, Mc, Me).
bool IsMark(char32_t c);

enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };
std::string Normalize(absl::string_view s, NormalForm form);
// Rust's str::to_lowercase applied char by char as `tokenizers` does
// (char::to_lowercase: full mappings, no context-sensitive final sigma).
std::string Lowercase(absl::string_view s);

}  // namespace linattn::tokenizer_json

#endif  // LINATTN_CORE_MODEL_TOKENIZER_JSON_UNICODE_CHARS_H_
