// tokenizer.json on arbitrary bytes: the loader accepts a document or
// refuses it with an error, never crashes; a document it accepts encodes
// text (the input's tail past its first NUL, and the document itself) to
// ids inside its vocabulary whose bytes decode to valid UTF-8, and
// decodes its own ids.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/model/tokenizer_json/tokenizer_json.h"
#include "core/util/utf8.h"
#include "tests/fuzz/tokenizer_check.h"

namespace {

void Check(const linattn::Tokenizer& tokenizer, const std::string& text) {
  linattn::fuzz::CheckEncodes(tokenizer, text);
  auto start = tokenizer.EncodeStart(text);
  if (!start.ok()) return;
  linattn::fuzz::CheckIds(tokenizer, *start);
  if (!linattn::IsValidUtf8(tokenizer.Decode(*start))) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string document = input.substr(0, nul);
  auto tokenizer = linattn::ParseTokenizerJson(document);
  if (!tokenizer.ok()) return 0;
  Check(**tokenizer, nul == std::string::npos ? "" : input.substr(nul + 1));
  Check(**tokenizer, document);
  return 0;
}
