// RWKV World vocabularies on arbitrary bytes: the loader accepts a file or
// refuses it with an error, never crashes; a vocabulary it accepts encodes
// any bytes (the input's tail past its first NUL, and the file itself) to
// ids inside it whose bytes are exactly the text again, and valid UTF-8
// through the stream for UTF-8 text.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/model/rwkv_world_tokenizer.h"
#include "tests/fuzz/tokenizer_check.h"

namespace {

void Check(const linattn::Tokenizer& tokenizer, const std::string& text) {
  auto ids = tokenizer.Encode(text);
  if (!ids.ok()) std::abort();  // every byte has a token
  if (tokenizer.Pieces(*ids) != text) std::abort();
  linattn::fuzz::CheckIds(tokenizer, *ids);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string file = input.substr(0, nul);
  auto tokenizer = linattn::ParseRwkvWorldVocabulary(file, "vocab");
  if (!tokenizer.ok()) return 0;
  Check(**tokenizer, nul == std::string::npos ? "" : input.substr(nul + 1));
  Check(**tokenizer, file);
  return 0;
}
