// RWKV's "World" tokenizer: the vocabulary file RWKV-5, -6 and -7 World
// and G1 models are trained with (rwkv_vocab_v20230424.txt, 65,529 tokens),
// read as RWKV's own TRIE_TOKENIZER reads it (BlinkDL/RWKV-LM,
// RWKV-v5/tokenizer/rwkv_tokenizer.py):
//   * one token per line, `ID LITERAL LENGTH`: the id, a Python str or bytes
//     literal as repr() writes it ('…', "…", b'…', with \x, \u, \U, \n, \t,
//     … escapes; a str stands for its UTF-8 bytes), and the byte length,
//     which must match;
//   * encoding is greedy: from each position the longest token that is a
//     prefix of the remaining bytes (a trie walk), no normalisation, no
//     pre-tokenisation, no special tokens;
//   * decoding is the tokens' bytes one after another; id 0 is the end of
//     text (the file leaves it out) and stands for no bytes.
// The file is refused, naming its line, when a line does not parse, an id
// or a token repeats, a length is wrong, or a byte has no token of its own
// (every text must be encodable).
#ifndef LINATTN_CORE_MODEL_RWKV_WORLD_TOKENIZER_H_
#define LINATTN_CORE_MODEL_RWKV_WORLD_TOKENIZER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/model/tokenizer.h"

namespace linattn {

// The file name RWKV's models and servers use for the World vocabulary.
inline constexpr char kRwkvWorldVocabFile[] = "rwkv_vocab_v20230424.txt";

// Limits a vocabulary file is held to before anything is built from it
// (the published file is 1.1 MB; the size bounds the trie built from it).
inline constexpr uint64_t kMaxRwkvVocabBytes = uint64_t{8} << 20;
inline constexpr uint32_t kMaxRwkvTokenId = (1u << 20) - 1;
inline constexpr uint32_t kMaxRwkvTokenBytes = 4096;

// Parses a vocabulary's text; `name` prefixes every error (INVALID_ARGUMENT
// naming the line).
absl::StatusOr<std::unique_ptr<Tokenizer>> ParseRwkvWorldVocabulary(
    absl::string_view text, absl::string_view name);
// Reads and parses a vocabulary file (NOT_FOUND when it cannot be read).
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadRwkvWorldTokenizer(
    const std::string& path);

}  // namespace linattn

#endif  // LINATTN_CORE_MODEL_RWKV_WORLD_TOKENIZER_H_
