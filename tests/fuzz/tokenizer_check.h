// What every tokenizer promises on any text, for the fuzz targets: the ids
// it encodes to are inside its vocabulary, and their bytes, through the
// UTF-8 stream, are valid UTF-8. Aborts (a fuzzer finding) otherwise.
#ifndef LINATTN_TESTS_FUZZ_TOKENIZER_CHECK_H_
#define LINATTN_TESTS_FUZZ_TOKENIZER_CHECK_H_

#include <cstdlib>
#include <string>
#include <vector>

#include "core/model/tokenizer.h"
#include "core/util/utf8.h"

namespace linattn::fuzz {

inline void CheckIds(const Tokenizer& tokenizer,
                     const std::vector<int32_t>& ids) {
  Utf8Stream stream;
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || static_cast<uint32_t>(id) >= tokenizer.size()) std::abort();
    out += stream.Push(tokenizer.TokenBytes(id));
  }
  out += stream.Flush();
  if (!IsValidUtf8(out)) std::abort();
}

inline void CheckEncodes(const Tokenizer& tokenizer, const std::string& text) {
  auto ids = tokenizer.Encode(text);
  if (ids.ok()) CheckIds(tokenizer, *ids);
}

}  // namespace linattn::fuzz

#endif  // LINATTN_TESTS_FUZZ_TOKENIZER_CHECK_H_
