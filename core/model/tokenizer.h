// Tokenizers: text ↔ token ids for a model.
//
//   ByteTokenizer          ids 0..255 are the bytes of UTF-8 text; ids above
//                          are special (bos/eos) and decode to nothing.
//   SentencePiece          a tokenizer.model beside the weights (Debian's
//                          libsentencepiece, loaded as a module: see
//                          sentencepiece_shim.h).
//   tokenizer.json         Hugging Face's format (core/model/tokenizer_json/).
//
// Generation streams text token by token through Utf8Stream
// (core/util/utf8.h), so every piece sent is valid UTF-8.
#ifndef LINATTN_CORE_MODEL_TOKENIZER_H_
#define LINATTN_CORE_MODEL_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/util/utf8.h"

namespace linattn {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // "byte", "sentencepiece", "tokenizer.json" or "rwkv_world"
  virtual std::string kind() const = 0;
  // Number of ids the tokenizer can produce.
  virtual uint32_t size() const = 0;
  // The ids of text as it continues a context (no special tokens added).
  virtual absl::StatusOr<std::vector<int32_t>> Encode(
      absl::string_view text) const = 0;
  // The ids of text that begins a context: Encode with the special tokens
  // the tokenizer adds around a text (tokenizer.json's post_processor, e.g.
  // a BOS token), as Hugging Face's encode(add_special_tokens=True) does.
  virtual absl::StatusOr<std::vector<int32_t>> EncodeStart(
      absl::string_view text) const {
    return Encode(text);
  }
  // The bytes one token stands for when it continues a text (special tokens:
  // empty).
  virtual std::string TokenBytes(int32_t id) const = 0;
  // The bytes of ids as they continue a text: their TokenBytes one after
  // another (what generation streams).
  std::string Pieces(std::span<const int32_t> ids) const;
  // The text of ids as a whole (/detokenize, a new prompt given as ids):
  // Pieces less what the encoder adds before a text (SentencePiece's
  // leading space), as the tokenizer's own library decodes. Decode(Encode(t))
  // is t for text the encoder keeps as it is (SentencePiece folds runs of
  // spaces and drops leading and trailing ones, and may normalise).
  virtual std::string Decode(std::span<const int32_t> ids) const {
    return Pieces(ids);
  }
};

std::unique_ptr<Tokenizer> NewByteTokenizer();
// NOT_FOUND / INVALID_ARGUMENT naming the file when it cannot be loaded.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceTokenizer(
    const std::string& path);

}  // namespace linattn

#endif  // LINATTN_CORE_MODEL_TOKENIZER_H_
