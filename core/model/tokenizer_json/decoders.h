// tokenizer.json's "decoder": ByteLevel, Metaspace, ByteFallback, Fuse,
// Strip, Replace and Sequence, as `tokenizers` chains them over a list of
// token strings.
//
// Two modes: kText decodes a whole text as `tokenizers` does; kPiece gives
// the bytes one token adds when it continues a text (what generation
// streams): steps that look at a text's first token or its ends
// (Metaspace's first-token rule, Strip) are left out, and byte runs stay raw
// bytes for the stream's own UTF-8 assembly.
#ifndef LINATTN_CORE_MODEL_TOKENIZER_JSON_DECODERS_H_
#define LINATTN_CORE_MODEL_TOKENIZER_JSON_DECODERS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/tokenizer_json/json_field.h"

namespace linattn::tokenizer_json {

enum class DecodeMode { kText, kPiece };

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void Chain(std::vector<std::string>* tokens,
                     DecodeMode mode) const = 0;
};

// nullptr for a null field.
absl::StatusOr<std::unique_ptr<Decoder>> LoadDecoder(const JsonField& field);

}  // namespace linattn::tokenizer_json

#endif  // LINATTN_CORE_MODEL_TOKENIZER_JSON_DECODERS_H_
