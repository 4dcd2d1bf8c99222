#include "core/model/tokenizer_json/byte_level.h"

#include <array>

#include "core/model/tokenizer_json/unicode_chars.h"

namespace linattn::tokenizer_json {
namespace {

struct Tables {
  std::array<std::string, 256> chars;
  std::array<int16_t, 324> bytes;  // code points below U+0144
  Tables() {
    bytes.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable =
          (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      const char32_t c = printable ? b : 0x100 + n++;
      AppendUtf8(c, &chars[b]);
      bytes[c] = static_cast<int16_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

const std::string& ByteLevelChar(uint8_t b) { return tables().chars[b]; }

int ByteLevelByte(char32_t c) {
  return c < tables().bytes.size() ? tables().bytes[c] : -1;
}

std::string ToByteLevel(absl::string_view bytes) {
  const Tables& t = tables();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) out += t.chars[b];
  return out;
}

std::string FromByteLevel(absl::string_view token) {
  std::string out;
  out.reserve(token.size());
  for (size_t i = 0; i < token.size();) {
    size_t len;
    const int b = ByteLevelByte(CodePointAt(token, i, &len));
    if (b < 0) return std::string(token);
    out.push_back(static_cast<char>(b));
    i += len;
  }
  return out;
}

}  // namespace linattn::tokenizer_json
