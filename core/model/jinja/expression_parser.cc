#include "core/model/jinja/expression_parser.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/model/jinja/builtins.h"

namespace linattn::jinja {

namespace {

// Counts the links of a chain the parser builds in a loop (a + b + …,
// a.b.c…, x | f | g…) against the nesting limit: each link is one level
// of the tree the renderer walks recursively. Restores the count when the
// chain ends.
class ChainDepth {
 public:
  explicit ChainDepth(int* depth) : depth_(depth), entry_(*depth) {}
  ~ChainDepth() { *depth_ = entry_; }
  bool Add() { return ++*depth_ <= kMaxParseDepth; }

 private:
  int* depth_;
  int entry_;
};

}  // namespace

ExprPtr ExpressionParser::Node(Expr::Kind kind, const Token& at) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = at.line;
  e->column = at.column;
  return e;
}

absl::StatusOr<ExprPtr> ExpressionParser::TupleOrExpr(bool with_condition) {
  const Token& at = Cur();
  auto first = with_condition ? Expression() : Or();
  if (!first.ok() || !IsOp(",")) return first;
  ExprPtr tuple = Node(Expr::Kind::kTuple, at);
  tuple->items.push_back(std::move(*first));
  while (IsOp(",")) {
    ++i_;
    if (Cur().kind == K::kBlockEnd || Cur().kind == K::kVarEnd || IsOp(")")) {
      break;
    }
    auto next = with_condition ? Expression() : Or();
    if (!next.ok()) return next;
    tuple->items.push_back(std::move(*next));
  }
  return tuple;
}

absl::StatusOr<ExprPtr> ExpressionParser::Expression() {
  if (++depth_ > kMaxParseDepth)
    return Fail(Cur(), "expression nested too deeply");
  auto e = Condition();
  --depth_;
  return e;
}

absl::StatusOr<ExprPtr> ExpressionParser::Condition() {
  auto then = Or();
  if (!then.ok()) return then;
  ExprPtr expr = std::move(*then);
  while (IsName("if")) {
    const Token& at = Cur();
    ++i_;
    auto test = Or();
    if (!test.ok()) return test;
    ExprPtr node = Node(Expr::Kind::kCondition, at);
    node->items.push_back(std::move(expr));
    node->items.push_back(std::move(*test));
    if (IsName("else")) {
      ++i_;
      if (++depth_ > kMaxParseDepth) {
        return Fail(Cur(), "expression nested too deeply");
      }
      auto otherwise = Condition();
      --depth_;
      if (!otherwise.ok()) return otherwise;
      node->items.push_back(std::move(*otherwise));
    } else {
      node->items.push_back(nullptr);
    }
    expr = std::move(node);
  }
  return expr;
}

absl::StatusOr<ExprPtr> ExpressionParser::Or() {
  return LeftAssociative(Expr::Kind::kOr, {"or"}, true, &ExpressionParser::And);
}
absl::StatusOr<ExprPtr> ExpressionParser::And() {
  return LeftAssociative(Expr::Kind::kAnd, {"and"}, true,
                         &ExpressionParser::Not);
}

absl::StatusOr<ExprPtr> ExpressionParser::Not() {
  if (IsName("not")) {
    if (++depth_ > kMaxParseDepth)
      return Fail(Cur(), "expression nested too deeply");
    ExprPtr node = Node(Expr::Kind::kNot, Cur());
    ++i_;
    auto operand = Not();
    --depth_;
    if (!operand.ok()) return operand;
    node->a = std::move(*operand);
    return node;
  }
  return Compare();
}

absl::StatusOr<ExprPtr> ExpressionParser::Compare() {
  auto left = Math1();
  if (!left.ok()) return left;
  ExprPtr expr = std::move(*left);
  // A chain a < b < c is kept as nested comparisons with a shared middle
  // (Python's semantics: each pair compared, all must hold).
  std::vector<std::pair<std::string, ExprPtr>> ops;
  const Token& at = Cur();
  for (;;) {
    std::string op;
    if (Cur().kind == K::kOp &&
        (Cur().text == "==" || Cur().text == "!=" || Cur().text == "<" ||
         Cur().text == "<=" || Cur().text == ">" || Cur().text == ">=")) {
      op = Cur().text;
      ++i_;
    } else if (IsName("in")) {
      op = "in";
      ++i_;
    } else if (IsName("not") && Peek().kind == K::kName &&
               Peek().text == "in") {
      op = "not in";
      i_ += 2;
    } else {
      break;
    }
    auto right = Math1();
    if (!right.ok()) return right;
    ops.emplace_back(op, std::move(*right));
  }
  if (ops.empty()) return expr;
  ExprPtr node = Node(Expr::Kind::kCompare, at);
  node->items.push_back(std::move(expr));
  for (auto& [op, operand] : ops) {
    node->keyword.emplace_back(op, std::move(operand));
  }
  return node;
}

// next (op next)*, left to right; `words`: the operators are names
// (and, or), else operator tokens.
template <typename Next>
absl::StatusOr<ExprPtr> ExpressionParser::LeftAssociative(
    Expr::Kind kind, std::initializer_list<const char*> ops, bool words,
    Next next) {
  auto left = (this->*next)();
  if (!left.ok()) return left;
  ExprPtr expr = std::move(*left);
  ChainDepth chain(&depth_);
  for (;;) {
    if (!chain.Add()) return Fail(Cur(), "expression nested too deeply");
    const char* matched = nullptr;
    for (const char* op : ops) {
      if (words ? IsName(op) : IsOp(op)) matched = op;
    }
    if (matched == nullptr) return expr;
    ExprPtr node = Node(kind, Cur());
    node->name = matched;
    ++i_;
    auto right = (this->*next)();
    if (!right.ok()) return right;
    node->a = std::move(expr);
    node->b = std::move(*right);
    expr = std::move(node);
  }
}

absl::StatusOr<ExprPtr> ExpressionParser::Math1() {
  return LeftAssociative(Expr::Kind::kBinary, {"+", "-"}, false,
                         &ExpressionParser::Concat);
}

absl::StatusOr<ExprPtr> ExpressionParser::Concat() {
  auto first = Math2();
  if (!first.ok() || !IsOp("~")) return first;
  ExprPtr node = Node(Expr::Kind::kConcat, Cur());
  node->items.push_back(std::move(*first));
  while (IsOp("~")) {
    ++i_;
    auto next = Math2();
    if (!next.ok()) return next;
    node->items.push_back(std::move(*next));
  }
  return node;
}

absl::StatusOr<ExprPtr> ExpressionParser::Math2() {
  return LeftAssociative(Expr::Kind::kBinary, {"*", "/", "//", "%"}, false,
                         &ExpressionParser::Pow);
}
absl::StatusOr<ExprPtr> ExpressionParser::Pow() {
  return LeftAssociative(Expr::Kind::kBinary, {"**"}, false,
                         &ExpressionParser::UnaryFiltered);
}
absl::StatusOr<ExprPtr> ExpressionParser::UnaryFiltered() {
  return Unary(true);
}

absl::StatusOr<ExprPtr> ExpressionParser::Unary(bool with_filter) {
  if (++depth_ > kMaxParseDepth)
    return Fail(Cur(), "expression nested too deeply");
  absl::StatusOr<ExprPtr> expr;
  if (IsOp("-") || IsOp("+")) {
    ExprPtr node = Node(IsOp("-") ? Expr::Kind::kNeg : Expr::Kind::kPos, Cur());
    ++i_;
    auto operand = Unary(false);
    if (!operand.ok()) return operand;
    node->a = std::move(*operand);
    expr = std::move(node);
  } else {
    expr = Primary();
    if (expr.ok()) expr = Postfix(std::move(*expr));
  }
  if (expr.ok() && with_filter) expr = FilterExpr(std::move(*expr));
  --depth_;
  return expr;
}

absl::StatusOr<ExprPtr> ExpressionParser::Primary() {
  const Token& tok = Cur();
  switch (tok.kind) {
    case K::kName: {
      ++i_;
      ExprPtr node = Node(Expr::Kind::kLiteral, tok);
      if (tok.text == "true" || tok.text == "True") {
        node->value = Value::Bool(true);
      } else if (tok.text == "false" || tok.text == "False") {
        node->value = Value::Bool(false);
      } else if (tok.text == "none" || tok.text == "None") {
        node->value = Value::None();
      } else {
        node->kind = Expr::Kind::kName;
        node->name = tok.text;
      }
      return node;
    }
    case K::kString: {
      ExprPtr node = Node(Expr::Kind::kLiteral, tok);
      std::string s;
      while (Cur().kind == K::kString) s += t_[i_++].text;
      node->value = Value::String(std::move(s));
      return node;
    }
    case K::kInt:
    case K::kFloat: {
      ExprPtr node = Node(Expr::Kind::kLiteral, tok);
      node->value = tok.kind == K::kInt ? Value::Int(tok.int_value)
                                        : Value::Float(tok.float_value);
      ++i_;
      return node;
    }
    case K::kOp:
      if (tok.text == "(") {
        ++i_;
        if (IsOp(")")) {
          ++i_;
          ExprPtr node = Node(Expr::Kind::kTuple, tok);
          return node;
        }
        auto inner = TupleOrExpr();
        if (!inner.ok()) return inner;
        if (absl::Status s = Expect(")"); !s.ok()) return s;
        return inner;
      }
      if (tok.text == "[" || tok.text == "{") {
        const bool dict = tok.text == "{";
        const char* close = dict ? "}" : "]";
        ++i_;
        ExprPtr node = Node(dict ? Expr::Kind::kDict : Expr::Kind::kList, tok);
        while (!IsOp(close)) {
          if (!node->items.empty()) {
            if (absl::Status s = Expect(","); !s.ok()) return s;
            if (IsOp(close)) break;
          }
          auto item = Expression();
          if (!item.ok()) return item;
          node->items.push_back(std::move(*item));
          if (dict) {
            if (absl::Status s = Expect(":"); !s.ok()) return s;
            auto value = Expression();
            if (!value.ok()) return value;
            node->items.push_back(std::move(*value));
          }
        }
        ++i_;
        return node;
      }
      break;
    default:
      break;
  }
  return Fail(tok, absl::StrCat("unexpected ", Describe()));
}

absl::StatusOr<ExprPtr> ExpressionParser::Postfix(ExprPtr expr) {
  ChainDepth chain(&depth_);
  for (;;) {
    if (!chain.Add()) return Fail(Cur(), "expression nested too deeply");
    const Token& at = Cur();
    if (IsOp(".")) {
      ++i_;
      if (Cur().kind == K::kInt) {
        ExprPtr node = Node(Expr::Kind::kItem, at);
        node->a = std::move(expr);
        node->b = Node(Expr::Kind::kLiteral, Cur());
        node->b->value = Value::Int(Cur().int_value);
        ++i_;
        expr = std::move(node);
        continue;
      }
      auto name = ExpectName();
      if (!name.ok()) return name.status();
      ExprPtr node = Node(Expr::Kind::kAttr, at);
      node->a = std::move(expr);
      node->name = *name;
      expr = std::move(node);
    } else if (IsOp("[")) {
      ++i_;
      auto node = Subscript(std::move(expr), at);
      if (!node.ok()) return node;
      expr = std::move(*node);
    } else if (IsOp("(")) {
      auto node = Call(std::move(expr), at);
      if (!node.ok()) return node;
      expr = std::move(*node);
    } else {
      return expr;
    }
  }
}

absl::StatusOr<ExprPtr> ExpressionParser::Subscript(ExprPtr target,
                                                    const Token& at) {
  ExprPtr parts[3];
  int part = 0;
  bool slice = false;
  for (;;) {
    if (IsOp("]")) break;
    if (IsOp(":")) {
      slice = true;
      if (++part > 2) return Fail(Cur(), "a slice has at most two ':'");
      ++i_;
      continue;
    }
    if (parts[part]) return Fail(Cur(), "expected ':' or ']'");
    auto e = Expression();
    if (!e.ok()) return e;
    parts[part] = std::move(*e);
    if (IsOp(",")) return Fail(Cur(), "tuple subscripts are not supported");
  }
  ++i_;
  if (!slice) {
    if (!parts[0]) return Fail(at, "an empty subscript");
    ExprPtr node = Node(Expr::Kind::kItem, at);
    node->a = std::move(target);
    node->b = std::move(parts[0]);
    return node;
  }
  ExprPtr node = Node(Expr::Kind::kSlice, at);
  node->a = std::move(target);
  for (auto& p : parts) node->items.push_back(std::move(p));
  return node;
}

// (args…, name=value…) into node->items / node->keyword.
absl::Status ExpressionParser::Args(Expr* node) {
  if (absl::Status s = Expect("("); !s.ok()) return s;
  bool first = true;
  while (!IsOp(")")) {
    if (!first) {
      if (absl::Status s = Expect(","); !s.ok()) return s;
      if (IsOp(")")) break;
    }
    first = false;
    if (IsOp("*") || IsOp("**")) {
      return Fail(Cur(), "*args and **kwargs in calls are not supported");
    }
    if (Cur().kind == K::kName && Peek().kind == K::kOp && Peek().text == "=") {
      std::string key = Cur().text;
      i_ += 2;
      auto v = Expression();
      if (!v.ok()) return v.status();
      node->keyword.emplace_back(std::move(key), std::move(*v));
      continue;
    }
    if (!node->keyword.empty()) {
      return Fail(Cur(), "a positional argument follows keyword arguments");
    }
    auto v = Expression();
    if (!v.ok()) return v.status();
    node->items.push_back(std::move(*v));
  }
  ++i_;
  return absl::OkStatus();
}

absl::StatusOr<ExprPtr> ExpressionParser::Call(ExprPtr callee,
                                               const Token& at) {
  if (callee->kind == Expr::Kind::kName &&
      (callee->name == "lipsum" || callee->name == "cycler" ||
       callee->name == "joiner" || callee->name == "self" ||
       callee->name == "caller" || callee->name == "super")) {
    return Fail(at, absl::StrCat("'", callee->name,
                                 "' is not supported in chat templates"));
  }
  ExprPtr node = Node(Expr::Kind::kCall, at);
  node->a = std::move(callee);
  if (absl::Status s = Args(node.get()); !s.ok()) return s;
  return node;
}

absl::StatusOr<ExprPtr> ExpressionParser::FilterExpr(ExprPtr expr) {
  ChainDepth chain(&depth_);
  for (;;) {
    if (!chain.Add()) return Fail(Cur(), "expression nested too deeply");
    const Token& at = Cur();
    if (IsOp("|")) {
      ++i_;
      auto name = ExpectName();
      if (!name.ok()) return name.status();
      if (!IsFilter(*name)) {
        return Fail(t_[i_ - 1], absl::StrCat("no filter named '", *name,
                                             "' (not supported in chat "
                                             "templates)"));
      }
      ExprPtr node = Node(Expr::Kind::kFilter, at);
      node->name = *name;
      node->a = std::move(expr);
      if (IsOp("(")) {
        if (absl::Status s = Args(node.get()); !s.ok()) return s;
      }
      expr = std::move(node);
    } else if (IsName("is")) {
      ++i_;
      ExprPtr node = Node(Expr::Kind::kTest, at);
      if (IsName("not")) {
        node->negated = true;
        ++i_;
      }
      auto name = ExpectName();
      if (!name.ok()) return name.status();
      if (!IsTest(*name)) {
        return Fail(t_[i_ - 1], absl::StrCat("no test named '", *name,
                                             "' (not supported in chat "
                                             "templates)"));
      }
      node->name = *name;
      node->a = std::move(expr);
      if (IsOp("(")) {
        if (absl::Status s = Args(node.get()); !s.ok()) return s;
      } else if ((Cur().kind == K::kName || Cur().kind == K::kString ||
                  Cur().kind == K::kInt || Cur().kind == K::kFloat ||
                  IsOp("[") || IsOp("{")) &&
                 !IsName("else") && !IsName("or") && !IsName("and")) {
        if (IsName("is"))
          return Fail(Cur(), "tests cannot be chained with 'is'");
        auto arg = Primary();
        if (!arg.ok()) return arg;
        auto post = Postfix(std::move(*arg));
        if (!post.ok()) return post;
        node->items.push_back(std::move(*post));
      }
      expr = std::move(node);
    } else if (IsOp("(")) {
      auto node = Call(std::move(expr), at);
      if (!node.ok()) return node;
      expr = std::move(*node);
    } else {
      return expr;
    }
  }
}

}  // namespace linattn::jinja
