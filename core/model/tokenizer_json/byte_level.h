// GPT-2's byte-level alphabet: each byte stands for a printable character
// (printable Latin-1 for itself, the rest U+0100 + n in byte order), so any
// byte string is a string of vocabulary characters.
#ifndef LINATTN_CORE_MODEL_TOKENIZER_JSON_BYTE_LEVEL_H_
#define LINATTN_CORE_MODEL_TOKENIZER_JSON_BYTE_LEVEL_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace linattn::tokenizer_json {

// The UTF-8 of the character byte `b` stands for.
const std::string& ByteLevelChar(uint8_t b);
// The byte character `c` stands for, or -1.
int ByteLevelByte(char32_t c);
// Every byte of `bytes` as its character.
std::string ToByteLevel(absl::string_view bytes);
// `tokenizers`' ByteLevel decoding of one token: its characters' bytes when
// every character is in the alphabet, else the token's own bytes.
std::string FromByteLevel(absl::string_view token);

}  // namespace linattn::tokenizer_json

#endif  // LINATTN_CORE_MODEL_TOKENIZER_JSON_BYTE_LEVEL_H_
