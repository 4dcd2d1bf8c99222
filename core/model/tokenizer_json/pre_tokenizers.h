// tokenizer.json's "pre_tokenizer": Sequence, Split, ByteLevel, Metaspace,
// Digits, Punctuation, Whitespace, WhitespaceSplit and BertPreTokenizer, as
// `tokenizers` splits (and rewrites) the pieces an added-token pass left.
#ifndef LINATTN_CORE_MODEL_TOKENIZER_JSON_PRE_TOKENIZERS_H_
#define LINATTN_CORE_MODEL_TOKENIZER_JSON_PRE_TOKENIZERS_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/tokenizer_json/json_field.h"
#include "core/model/tokenizer_json/pieces.h"

namespace linattn::tokenizer_json {

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits every piece that is not an added token; empty pieces go.
  virtual absl::Status Apply(std::vector<Piece>* pieces) const = 0;
};

// nullptr for a null field.
absl::StatusOr<std::unique_ptr<PreTokenizer>> LoadPreTokenizer(
    const JsonField& field);

// A "behavior" field (Removed, Isolated, MergedWithPrevious, MergedWithNext,
// Contiguous).
absl::StatusOr<SplitBehavior> LoadSplitBehavior(const JsonField& field);

}  // namespace linattn::tokenizer_json

#endif  // LINATTN_CORE_MODEL_TOKENIZER_JSON_PRE_TOKENIZERS_H_
