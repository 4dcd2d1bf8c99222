// The text on its way through tokenizer.json's pipeline: pieces of the
// normalized text, split by added tokens and pre-tokenizers, each later
// handed to the model alone.
#ifndef LINATTN_CORE_MODEL_TOKENIZER_JSON_PIECES_H_
#define LINATTN_CORE_MODEL_TOKENIZER_JSON_PIECES_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/model/tokenizer_json/onig_regex.h"

namespace linattn::tokenizer_json {

struct Piece {
  std::string text;
  // An added token matched here: its id (the piece is done), else -1.
  int32_t token = -1;
  // Whether the piece begins at byte 0 of the text being encoded, as
  // `tokenizers` tells it from its alignments (offsets_original().0 == 0;
  // only Metaspace's prepend_scheme "first" asks). `origin_bytes` leading
  // bytes of `text` align to that byte (the first character's, bytes a
  // Prepend put before it), so a split inside them begins there too.
  bool at_origin = false;
  size_t origin_bytes = 0;
};

// `tokenizers`' SplitDelimiterBehavior.
enum class SplitBehavior {
  kRemoved,
  kIsolated,
  kMergedWithPrevious,
  kMergedWithNext,
  kContiguous
};

using Cover = std::vector<std::pair<Span, bool>>;  // (span, is_match)

// `piece` cut along `cover` (which covers its text) as NormalizedString::
// split does, empty parts dropped, appended to `out`.
void SplitPiece(const Piece& piece, const Cover& cover, SplitBehavior behavior,
                std::vector<Piece>* out);
// The cover of a character predicate: each matching char one match.
template <typename Pred>
Cover CoverChars(absl::string_view text, Pred pred);

}  // namespace linattn::tokenizer_json

#include "core/model/tokenizer_json/unicode_chars.h"

namespace linattn::tokenizer_json {

template <typename Pred>
Cover CoverChars(absl::string_view text, Pred pred) {
  Cover cover;
  if (text.empty()) {
    cover.push_back({{0, 0}, false});
    return cover;
  }
  size_t last = 0;
  for (size_t i = 0; i < text.size();) {
    size_t len;
    const char32_t c = CodePointAt(text, i, &len);
    if (pred(c)) {
      if (last < i) cover.push_back({{last, i}, false});
      cover.push_back({{i, i + len}, true});
      last = i + len;
    }
    i += len;
  }
  if (last < text.size()) cover.push_back({{last, text.size()}, false});
  return cover;
}

}  // namespace linattn::tokenizer_json

#endif  // LINATTN_CORE_MODEL_TOKENIZER_JSON_PIECES_H_
