// The expressions of the Jinja subset (parser.h): Jinja's precedence from
// conditional expressions down to filters, tests, calls, subscripts and
// literals, as jinja2/parser.py parses them.
#ifndef LINATTN_CORE_MODEL_JINJA_EXPRESSION_PARSER_H_
#define LINATTN_CORE_MODEL_JINJA_EXPRESSION_PARSER_H_

#include <initializer_list>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/jinja/ast.h"
#include "core/model/jinja/token_cursor.h"

namespace linattn::jinja {

class ExpressionParser : protected TokenCursor {
 protected:
  explicit ExpressionParser(const std::vector<Token>& tokens)
      : TokenCursor(tokens) {}

  // expr (, expr)* as a tuple when there is a comma; without
  // `with_condition`, the operands are `or` expressions (a for loop's
  // iterable, before its `if`).
  absl::StatusOr<ExprPtr> TupleOrExpr(bool with_condition = true);
  absl::StatusOr<ExprPtr> Expression();
  ExprPtr Node(Expr::Kind kind, const Token& at);

 private:
  absl::StatusOr<ExprPtr> Condition();
  absl::StatusOr<ExprPtr> Or();
  absl::StatusOr<ExprPtr> And();
  absl::StatusOr<ExprPtr> Not();
  absl::StatusOr<ExprPtr> Compare();
  template <typename Next>
  absl::StatusOr<ExprPtr> LeftAssociative(
      Expr::Kind kind, std::initializer_list<const char*> ops, bool words,
      Next next);
  absl::StatusOr<ExprPtr> Math1();
  absl::StatusOr<ExprPtr> Concat();
  absl::StatusOr<ExprPtr> Math2();
  absl::StatusOr<ExprPtr> Pow();
  absl::StatusOr<ExprPtr> UnaryFiltered();
  absl::StatusOr<ExprPtr> Unary(bool with_filter);
  absl::StatusOr<ExprPtr> Primary();
  absl::StatusOr<ExprPtr> Postfix(ExprPtr expr);
  absl::StatusOr<ExprPtr> Subscript(ExprPtr target, const Token& at);
  absl::Status Args(Expr* node);
  absl::StatusOr<ExprPtr> Call(ExprPtr callee, const Token& at);
  absl::StatusOr<ExprPtr> FilterExpr(ExprPtr expr);
};

}  // namespace linattn::jinja

#endif  // LINATTN_CORE_MODEL_JINJA_EXPRESSION_PARSER_H_
