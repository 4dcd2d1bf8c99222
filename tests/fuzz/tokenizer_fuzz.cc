// The tokenizers on arbitrary text: the byte tokenizer, a SentencePiece
// model (LINATTN_FUZZ_SPM_MODEL, e.g. the test fixtures' tokenizer.model)
// and a tokenizer.json (LINATTN_FUZZ_TOKENIZER_JSON, e.g. the fixtures'
// Qwen-shaped one) encode any bytes, UTF-8 or not, to ids inside their
// vocabulary, and the ids' bytes, through the UTF-8 stream, decode to
// valid UTF-8.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "core/model/tokenizer.h"
#include "core/model/tokenizer_json/tokenizer_json.h"
#include "tests/fuzz/tokenizer_check.h"

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

const linattn::Tokenizer* TokenizerJson() {
  static std::unique_ptr<linattn::Tokenizer> t = [] {
    const char* path = std::getenv("LINATTN_FUZZ_TOKENIZER_JSON");
    if (path == nullptr) return std::unique_ptr<linattn::Tokenizer>();
    auto loaded = linattn::LoadTokenizerJson(path);
    return loaded.ok() ? *std::move(loaded) : nullptr;
  }();
  return t.get();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  static std::unique_ptr<linattn::Tokenizer> bytes =
      linattn::NewByteTokenizer();
  linattn::fuzz::CheckEncodes(*bytes, text);
  if (const linattn::Tokenizer* spm = SentencePiece()) {
    linattn::fuzz::CheckEncodes(*spm, text);
  }
  if (const linattn::Tokenizer* json = TokenizerJson()) {
    linattn::fuzz::CheckEncodes(*json, text);
  }
  return 0;
}
