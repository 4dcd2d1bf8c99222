// tokenizer.json's "model": the vocabulary and the algorithm that turns
// one pre-tokenized piece into ids (BPE, Unigram).
#ifndef LINATTN_CORE_MODEL_TOKENIZER_JSON_TOKEN_MODEL_H_
#define LINATTN_CORE_MODEL_TOKENIZER_JSON_TOKEN_MODEL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/model/tokenizer_json/json_field.h"

namespace linattn::tokenizer_json {

// The largest vocabulary (and id) a tokenizer.json may state.
inline constexpr int64_t kMaxVocabulary = 1 << 24;

class TokenModel {
 public:
  virtual ~TokenModel() = default;
  // Appends the ids of one piece (`tokenizers`' Model::tokenize).
  virtual absl::Status Tokenize(absl::string_view piece,
                                std::vector<int32_t>* ids) const = 0;
  virtual std::optional<int32_t> TokenToId(absl::string_view token) const = 0;
  // nullptr for an id the vocabulary does not have.
  virtual const std::string* IdToToken(int32_t id) const = 0;
  // Model::get_vocab_size (the number of entries).
  virtual size_t size() const = 0;
  // One past the largest id.
  virtual int32_t id_limit() const = 0;
};

absl::StatusOr<std::unique_ptr<TokenModel>> LoadBpeModel(const JsonField& f);
absl::StatusOr<std::unique_ptr<TokenModel>> LoadUnigramModel(
    const JsonField& f);
// By "type" (BPE, Unigram); other models are refused.
absl::StatusOr<std::unique_ptr<TokenModel>> LoadTokenModel(const JsonField& f);

}  // namespace linattn::tokenizer_json

#endif  // LINATTN_CORE_MODEL_TOKENIZER_JSON_TOKEN_MODEL_H_
