// A Hugging Face tokenizer.json as a linattn Tokenizer: the file's
// normalizer, pre-tokenizer, model (BPE or Unigram), added tokens,
// post-processor and decoder, run as the `tokenizers` library runs them
// (docs/tokenizers.md lists what loads and where behaviour is defined).
// Anything in the file linattn does not implement is refused at load,
// naming its JSON path.
#ifndef LINATTN_CORE_MODEL_TOKENIZER_JSON_TOKENIZER_JSON_H_
#define LINATTN_CORE_MODEL_TOKENIZER_JSON_TOKENIZER_JSON_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/model/tokenizer.h"

namespace linattn {

// The largest tokenizer.json linattn reads.
inline constexpr size_t kMaxTokenizerJsonBytes = size_t{1} << 30;

// From the file's text; `file` names it in errors ("tokenizer.json").
absl::StatusOr<std::unique_ptr<Tokenizer>> ParseTokenizerJson(
    absl::string_view text, const std::string& file = "tokenizer.json");
// NOT_FOUND when `path` cannot be read; INVALID_ARGUMENT naming the JSON
// path of what is wrong or unsupported.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizerJson(
    const std::string& path);

}  // namespace linattn

#endif  // LINATTN_CORE_MODEL_TOKENIZER_JSON_TOKENIZER_JSON_H_
