// The Jinja lexer as Hugging Face configures it for chat templates
// (trim_blocks and lstrip_blocks on, keep_trailing_newline off): template
// text becomes data and the tokens of {{ … }}, {% … %} tags, with Jinja's
// whitespace control (`-`, `+`) applied and comments dropped.
#ifndef LINATTN_CORE_MODEL_JINJA_LEXER_H_
#define LINATTN_CORE_MODEL_JINJA_LEXER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace linattn::jinja {

struct Token {
  enum class Kind {
    kData,        // template text, whitespace control applied
    kBlockBegin,  // {%
    kBlockEnd,    // %}
    kVarBegin,    // {{
    kVarEnd,      // }}
    kName,
    kString,  // text: the unescaped value
    kInt,     // text: the literal; number: its value
    kFloat,
    kOp,  // text: the operator (+ - * / // % ** ~ == != < <= > >= = ( ) …)
    kEnd,
  };
  Kind kind;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0.0;
  int line = 1;
  int column = 1;
};

// "line L, column C: what" (1-based), the shape of every error a template
// is refused with.
std::string At(int line, int column, absl::string_view what);

// INVALID_ARGUMENT "line L, column C: …" for text Jinja cannot lex, or
// that is not UTF-8.
absl::StatusOr<std::vector<Token>> Tokenize(absl::string_view source);

}  // namespace linattn::jinja

#endif  // LINATTN_CORE_MODEL_JINJA_LEXER_H_
