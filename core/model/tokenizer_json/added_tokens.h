// tokenizer.json's "added_tokens", matched before the model runs as
// `tokenizers`' AddedVocabulary does: tokens with normalized false on the
// raw text first, then tokens with normalized true (by their normalized
// form) on each normalized piece; leftmost-longest; single_word keeps a
// match only between non-word characters; lstrip and rstrip take the
// whitespace beside a match into it.
#ifndef LINATTN_CORE_MODEL_TOKENIZER_JSON_ADDED_TOKENS_H_
#define LINATTN_CORE_MODEL_TOKENIZER_JSON_ADDED_TOKENS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "core/model/tokenizer_json/byte_trie.h"
#include "core/model/tokenizer_json/json_field.h"
#include "core/model/tokenizer_json/normalizers.h"
#include "core/model/tokenizer_json/pieces.h"
#include "core/model/tokenizer_json/token_model.h"

namespace linattn::tokenizer_json {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool lstrip = false, rstrip = false, single_word = false;
  bool normalized = true;
  std::string normalized_content;  // content through the normalizer
};

class AddedTokens {
 public:
  // Reads the list, giving each token its id as `tokenizers` does (the
  // model's id for a token it has, else the next free id).
  absl::Status Load(const JsonField& list, const TokenModel& model,
                    const Normalizer* normalizer);

  // The raw pass: splits `pieces` (not yet tokens) by non-normalized tokens.
  void SplitRaw(std::vector<Piece>* pieces) const { Split(raw_, pieces); }
  // The normalized pass.
  void SplitNormalized(std::vector<Piece>* pieces) const {
    Split(normalized_, pieces);
  }

  // nullptr for an id that is not an added token.
  const AddedToken* Find(int32_t id) const {
    auto it = by_id_.find(id);
    return it == by_id_.end() ? nullptr : &tokens_[it->second];
  }
  const std::vector<AddedToken>& tokens() const { return tokens_; }
  int32_t id_limit() const { return id_limit_; }

 private:
  struct Matcher {
    ByteTrie trie;  // pattern → index into tokens_
  };
  void Split(const Matcher& m, std::vector<Piece>* pieces) const;

  std::vector<AddedToken> tokens_;
  absl::flat_hash_map<int32_t, size_t> by_id_;
  Matcher raw_, normalized_;
  int32_t id_limit_ = 0;
};

}  // namespace linattn::tokenizer_json

#endif  // LINATTN_CORE_MODEL_TOKENIZER_JSON_ADDED_TOKENS_H_
