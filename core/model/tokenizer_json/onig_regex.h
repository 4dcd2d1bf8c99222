// The regular expressions tokenizer.json states (Split pre-tokenizers,
// Replace normalizers and decoders, the byte-level split), as `tokenizers`
// runs them: Oniguruma in its Ruby syntax. They are translated to PCRE2
// (UTF + Unicode properties, JIT-compiled) where the two dialects mean the
// same thing, with Oniguruma's meanings made explicit where they differ:
//
//   \s \S      Oniguruma's include U+0085; PCRE2's \s is given it
//   \w \W \b \B  Oniguruma's word class is L, M, N and Pc
//   \h \H      a hex digit in Ruby syntax (PCRE2: horizontal space)
//   \uHHHH     → \x{HHHH};  (?m) (Ruby: dot matches newline) → (?s)
//   ^ $        line anchors in Ruby syntax (PCRE2 multiline mode)
//
// Constructs whose meaning would change are refused with the position:
// POSIX brackets, class intersections and nested classes, \G, negated
// word/space/hex classes inside a bracket, quantified ranges followed by
// `+`, and inline options other than i, m and x.
//
// Matches are enumerated as the `onig` crate's find_iter does: an empty
// match right where the previous match ended is skipped (the search moves
// on by one character).
#ifndef LINATTN_CORE_MODEL_TOKENIZER_JSON_ONIG_REGEX_H_
#define LINATTN_CORE_MODEL_TOKENIZER_JSON_ONIG_REGEX_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/model/tokenizer_json/json_field.h"

namespace linattn::tokenizer_json {

using Span = std::pair<size_t, size_t>;  // [begin, end) in bytes

class OnigRegex {
 public:
  // `field` names the pattern in errors (e.g. "tokenizer.json:
  // pre_tokenizer.pattern.Regex").
  static absl::StatusOr<std::shared_ptr<const OnigRegex>> Compile(
      absl::string_view pattern, absl::string_view field);
  // A literal string (a {"String": …} pattern).
  static absl::StatusOr<std::shared_ptr<const OnigRegex>> Literal(
      absl::string_view text, absl::string_view field);
  ~OnigRegex();
  OnigRegex(const OnigRegex&) = delete;
  OnigRegex& operator=(const OnigRegex&) = delete;

  // Every match in `text` (valid UTF-8), in order. RESOURCE_EXHAUSTED if
  // the matcher hits its limits on this text.
  absl::Status FindAll(absl::string_view text, std::vector<Span>* out) const;
  // `tokenizers`' find_matches: `text` covered by (span, is_match) pieces,
  // non-matches between matches; an empty text is one empty non-match.
  absl::Status Cover(absl::string_view text,
                     std::vector<std::pair<Span, bool>>* out) const;

  const std::string& pcre_pattern() const { return translated_; }

 private:
  OnigRegex() = default;
  std::string field_;
  std::string translated_;
  void* code_ = nullptr;  // pcre2_code_8
};

// A {"String": s} (literal) or {"Regex": r} pattern field.
absl::StatusOr<std::shared_ptr<const OnigRegex>> LoadPattern(
    const JsonField& field);

// The translation alone (for tests and `--check`).
absl::StatusOr<std::string> TranslateOnigPattern(absl::string_view pattern);

}  // namespace linattn::tokenizer_json

#endif  // LINATTN_CORE_MODEL_TOKENIZER_JSON_ONIG_REGEX_H_
