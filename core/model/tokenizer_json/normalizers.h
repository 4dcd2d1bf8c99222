// tokenizer.json's "normalizer": NFC, NFD, NFKC, NFKD, Lowercase, Strip,
// StripAccents, Prepend, Replace and Sequence, each as `tokenizers` applies
// it to one piece of text.
#ifndef LINATTN_CORE_MODEL_TOKENIZER_JSON_NORMALIZERS_H_
#define LINATTN_CORE_MODEL_TOKENIZER_JSON_NORMALIZERS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "core/model/tokenizer_json/json_field.h"
#include "core/model/tokenizer_json/pieces.h"

namespace linattn::tokenizer_json {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual absl::Status Apply(Piece* piece) const = 0;
};

// nullptr for a null field.
absl::StatusOr<std::unique_ptr<Normalizer>> LoadNormalizer(
    const JsonField& field);

// The normalized form of `text` alone (added tokens' patterns).
absl::StatusOr<std::string> NormalizeText(const Normalizer& normalizer,
                                          absl::string_view text);

}  // namespace linattn::tokenizer_json

#endif  // LINATTN_CORE_MODEL_TOKENIZER_JSON_NORMALIZERS_H_
