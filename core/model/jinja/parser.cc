#include "core/model/jinja/parser.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/model/jinja/expression_parser.h"

namespace linattn::jinja {

namespace {

class Parser : public ExpressionParser {
 public:
  explicit Parser(const std::vector<Token>& tokens)
      : ExpressionParser(tokens) {}

  absl::StatusOr<Body> Template() {
    Body body;
    std::string end;
    if (absl::Status s = Statements({}, &body, &end); !s.ok()) return s;
    return body;
  }

 private:
  // Statements until a block whose tag is one of `ends` (consumed up to
  // the tag name; *end names it) or the end of the template.
  absl::Status Statements(const std::vector<absl::string_view>& ends,
                          Body* body, std::string* end) {
    if (++depth_ > kMaxParseDepth)
      return Fail(Cur(), "statements nested too deeply");
    for (;;) {
      const Token& tok = Cur();
      if (tok.kind == K::kEnd) {
        --depth_;
        if (ends.empty()) return absl::OkStatus();
        return Fail(tok, absl::StrCat("unexpected end of template: '",
                                      ends.back(), "' is missing"));
      }
      if (tok.kind == K::kData) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kText;
        s->text = tok.text;
        body->push_back(std::move(s));
        ++i_;
        continue;
      }
      if (tok.kind == K::kVarBegin) {
        ++i_;
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kEmit;
        s->line = tok.line;
        s->column = tok.column;
        auto e = TupleOrExpr();
        if (!e.ok()) return e.status();
        s->expr = std::move(*e);
        if (Cur().kind != K::kVarEnd) {
          return Fail(Cur(), absl::StrCat("expected the end of the print "
                                          "statement, got ",
                                          Describe()));
        }
        ++i_;
        body->push_back(std::move(s));
        continue;
      }
      // A block.
      ++i_;
      const Token& name = Cur();
      if (name.kind != K::kName) {
        return Fail(name, "a statement block must begin with a tag name");
      }
      for (absl::string_view e : ends) {
        if (name.text == e) {
          *end = name.text;
          ++i_;
          --depth_;
          return absl::OkStatus();
        }
      }
      if (absl::Status s = Statement(body); !s.ok()) return s;
    }
  }

  absl::Status Statement(Body* body) {
    const Token& tag = Cur();
    auto s = std::make_unique<Stmt>();
    s->line = tag.line;
    s->column = tag.column;
    const std::string name = tag.text;
    ++i_;
    absl::Status st;
    if (name == "if") {
      st = If(s.get());
    } else if (name == "for") {
      st = For(s.get());
    } else if (name == "set") {
      st = Set(s.get());
    } else if (name == "macro") {
      st = Macro(s.get());
    } else if (name == "break" || name == "continue") {
      if (loops_ == 0) {
        return Fail(tag, absl::StrCat("'", name, "' outside of a loop"));
      }
      s->kind = name == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      st = BlockEnd();
    } else if (name == "with") {
      st = With(s.get());
    } else if (name == "generation") {
      s->kind = Stmt::Kind::kScope;
      st = BlockEnd();
      std::string end;
      if (st.ok()) st = Statements({"endgeneration"}, &s->body, &end);
      if (st.ok()) st = BlockEnd();
    } else if (name == "extends" || name == "block" || name == "include" ||
               name == "import" || name == "from" || name == "call" ||
               name == "filter" || name == "autoescape" || name == "trans" ||
               name == "do" || name == "raw") {
      return Fail(tag, absl::StrCat("'", name,
                                    "' blocks are not supported in chat "
                                    "templates"));
    } else if (name.rfind("end", 0) == 0 || name == "elif" || name == "else") {
      return Fail(tag, absl::StrCat("unexpected '", name, "'"));
    } else {
      return Fail(tag, absl::StrCat("unknown tag '", name, "'"));
    }
    if (!st.ok()) return st;
    body->push_back(std::move(s));
    return absl::OkStatus();
  }

  absl::Status If(Stmt* s) {
    s->kind = Stmt::Kind::kIf;
    for (;;) {
      auto cond = Expression();
      if (!cond.ok()) return cond.status();
      if (absl::Status st = BlockEnd(); !st.ok()) return st;
      s->conditions.push_back(std::move(*cond));
      s->bodies.emplace_back();
      std::string end;
      if (absl::Status st =
              Statements({"elif", "else", "endif"}, &s->bodies.back(), &end);
          !st.ok()) {
        return st;
      }
      if (end == "elif") continue;
      if (end == "else") {
        if (absl::Status st = BlockEnd(); !st.ok()) return st;
        if (absl::Status st = Statements({"endif"}, &s->else_body, &end);
            !st.ok()) {
          return st;
        }
      }
      return BlockEnd();
    }
  }

  // name | name, name, … | (name, …)
  absl::Status Targets(std::vector<std::string>* out) {
    const bool paren = IsOp("(");
    if (paren) ++i_;
    for (;;) {
      auto n = ExpectName();
      if (!n.ok()) return n.status();
      out->push_back(*n);
      if (!IsOp(",")) break;
      ++i_;
      if (Cur().kind != K::kName) break;  // a trailing comma
    }
    return paren ? Expect(")") : absl::OkStatus();
  }

  absl::Status For(Stmt* s) {
    s->kind = Stmt::Kind::kFor;
    if (absl::Status st = Targets(&s->targets); !st.ok()) return st;
    if (!IsName("in")) return Fail(Cur(), "expected 'in' in the for loop");
    ++i_;
    auto iter = TupleOrExpr(/*with_condition=*/false);
    if (!iter.ok()) return iter.status();
    s->expr = std::move(*iter);
    if (IsName("if")) {
      ++i_;
      auto cond = Expression();
      if (!cond.ok()) return cond.status();
      s->condition = std::move(*cond);
    }
    if (IsName("recursive")) {
      return Fail(Cur(), "recursive loops are not supported");
    }
    if (absl::Status st = BlockEnd(); !st.ok()) return st;
    ++loops_;
    std::string end;
    absl::Status st = Statements({"else", "endfor"}, &s->body, &end);
    --loops_;
    if (!st.ok()) return st;
    if (end == "else") {
      if (st = BlockEnd(); !st.ok()) return st;
      if (st = Statements({"endfor"}, &s->else_body, &end); !st.ok()) return st;
    }
    return BlockEnd();
  }

  absl::Status Set(Stmt* s) {
    s->kind = Stmt::Kind::kSet;
    if (Cur().kind == K::kName && Peek().kind == K::kOp && Peek().text == ".") {
      s->targets.push_back(t_[i_].text);
      i_ += 2;
      auto attr = ExpectName();
      if (!attr.ok()) return attr.status();
      s->attribute = *attr;
    } else if (absl::Status st = Targets(&s->targets); !st.ok()) {
      return st;
    }
    if (Cur().kind == K::kBlockEnd) {
      if (s->targets.size() != 1 || !s->attribute.empty()) {
        return Fail(Cur(), "a set block assigns one name");
      }
      s->kind = Stmt::Kind::kSetBlock;
      ++i_;
      std::string end;
      if (absl::Status st = Statements({"endset"}, &s->body, &end); !st.ok()) {
        return st;
      }
      return BlockEnd();
    }
    if (IsOp("|")) return Fail(Cur(), "filtered set blocks are not supported");
    if (absl::Status st = Expect("="); !st.ok()) return st;
    auto value = TupleOrExpr();
    if (!value.ok()) return value.status();
    s->expr = std::move(*value);
    return BlockEnd();
  }

  absl::Status Macro(Stmt* s) {
    s->kind = Stmt::Kind::kMacro;
    auto name = ExpectName();
    if (!name.ok()) return name.status();
    s->text = *name;
    if (absl::Status st = Expect("("); !st.ok()) return st;
    while (!IsOp(")")) {
      if (!s->params.empty()) {
        if (absl::Status st = Expect(","); !st.ok()) return st;
        if (IsOp(")")) break;
      }
      auto p = ExpectName();
      if (!p.ok()) return p.status();
      MacroParam param;
      param.name = *p;
      if (IsOp("=")) {
        ++i_;
        auto d = Expression();
        if (!d.ok()) return d.status();
        param.default_value = std::move(*d);
      }
      s->params.push_back(std::move(param));
    }
    ++i_;
    if (absl::Status st = BlockEnd(); !st.ok()) return st;
    const int loops = loops_;
    loops_ = 0;
    std::string end;
    absl::Status st = Statements({"endmacro"}, &s->body, &end);
    loops_ = loops;
    if (!st.ok()) return st;
    if (Cur().kind == K::kName) ++i_;  // {% endmacro name %}
    return BlockEnd();
  }

  absl::Status With(Stmt* s) {
    s->kind = Stmt::Kind::kWith;
    while (Cur().kind != K::kBlockEnd) {
      if (!s->targets.empty()) {
        if (absl::Status st = Expect(","); !st.ok()) return st;
      }
      auto n = ExpectName();
      if (!n.ok()) return n.status();
      if (absl::Status st = Expect("="); !st.ok()) return st;
      auto v = Expression();
      if (!v.ok()) return v.status();
      s->targets.push_back(*n);
      s->values.push_back(std::move(*v));
    }
    ++i_;
    std::string end;
    if (absl::Status st = Statements({"endwith"}, &s->body, &end); !st.ok()) {
      return st;
    }
    return BlockEnd();
  }

  int loops_ = 0;
};

}  // namespace

absl::StatusOr<Body> Parse(const std::vector<Token>& tokens) {
  return Parser(tokens).Template();
}

}  // namespace linattn::jinja
