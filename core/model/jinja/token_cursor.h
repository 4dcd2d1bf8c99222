// The token cursor the Jinja parser reads with: the current token, tests
// of it, and the errors that name its line and column.
#ifndef LINATTN_CORE_MODEL_JINJA_TOKEN_CURSOR_H_
#define LINATTN_CORE_MODEL_JINJA_TOKEN_CURSOR_H_

#include <algorithm>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/model/jinja/lexer.h"

namespace linattn::jinja {

// Deeper nesting than this is refused (a hostile template must not run
// the parser or the renderer out of stack).
inline constexpr int kMaxParseDepth = 128;

class TokenCursor {
 protected:
  using K = Token::Kind;
  explicit TokenCursor(const std::vector<Token>& tokens) : t_(tokens) {}

  const Token& Cur() const { return t_[i_]; }
  const Token& Peek(size_t ahead = 1) const {
    return t_[std::min(i_ + ahead, t_.size() - 1)];
  }
  bool IsOp(absl::string_view op) const {
    return Cur().kind == K::kOp && Cur().text == op;
  }
  bool IsName(absl::string_view name) const {
    return Cur().kind == K::kName && Cur().text == name;
  }
  absl::Status Fail(const Token& at, absl::string_view what) const {
    return absl::InvalidArgumentError(At(at.line, at.column, what));
  }
  absl::Status Expect(absl::string_view op) {
    if (!IsOp(op)) {
      return Fail(Cur(), absl::StrCat("expected '", op, "', got ", Describe()));
    }
    ++i_;
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Cur().kind != K::kName) {
      return Fail(Cur(), absl::StrCat("expected a name, got ", Describe()));
    }
    return t_[i_++].text;
  }
  std::string Describe() const {
    switch (Cur().kind) {
      case K::kEnd:
        return "the end of the template";
      case K::kBlockEnd:
        return "the end of the statement block";
      case K::kVarEnd:
        return "the end of the print statement";
      case K::kData:
        return "template text";
      case K::kString:
        return "a string";
      default:
        return absl::StrCat("'", Cur().text, "'");
    }
  }
  absl::Status BlockEnd() {
    if (Cur().kind != K::kBlockEnd) {
      return Fail(Cur(), absl::StrCat("expected the end of the statement "
                                      "block, got ",
                                      Describe()));
    }
    ++i_;
    return absl::OkStatus();
  }

  const std::vector<Token>& t_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace linattn::jinja

#endif  // LINATTN_CORE_MODEL_JINJA_TOKEN_CURSOR_H_
