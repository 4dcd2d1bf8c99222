// The tokenizers on arbitrary text: the byte tokenizer and a SentencePiece
// model (LINATTN_FUZZ_SPM_MODEL, e.g. the test fixtures' tokenizer.model)
// encode any bytes, UTF-8 or not, to ids inside their vocabulary, and the
// ids' bytes, through the UTF-8 stream, decode to valid UTF-8.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "core/model/tokenizer.h"
#include "core/util/utf8.h"

namespace {

const linattn::Tokenizer* SentencePiece() {
  static std::unique_ptr<linattn::Tokenizer> spm = [] {
    const char* path = std::getenv("LINATTN_FUZZ_SPM_MODEL");
    if (path == nullptr) return std::unique_ptr<linattn::Tokenizer>();
    auto t = linattn::LoadSentencePieceTokenizer(path);
    return t.ok() ? *std::move(t) : nullptr;
  }();
  return spm.get();
}

void Check(const linattn::Tokenizer& tokenizer, const std::string& text) {
  auto ids = tokenizer.Encode(text);
  if (!ids.ok()) return;
  linattn::Utf8Stream stream;
  std::string out;
  for (int32_t id : *ids) {
    if (id < 0 || static_cast<uint32_t>(id) >= tokenizer.size()) std::abort();
    out += stream.Push(tokenizer.TokenBytes(id));
  }
  out += stream.Flush();
  if (!linattn::IsValidUtf8(out)) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  static std::unique_ptr<linattn::Tokenizer> bytes =
      linattn::NewByteTokenizer();
  Check(*bytes, text);
  if (const linattn::Tokenizer* spm = SentencePiece()) Check(*spm, text);
  return 0;
}
