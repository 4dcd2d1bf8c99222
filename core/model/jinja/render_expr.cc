// The renderer's expressions: Python's operators over Jinja's values.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/model/jinja/builtins.h"
#include "core/model/jinja/lexer.h"
#include "core/model/jinja/render.h"

namespace linattn::jinja {

namespace {

absl::Status OperandError(const char* op, const Value& a, const Value& b) {
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported operand type(s) for ", op, ": '", a.TypeName(),
                   "' and '", b.TypeName(), "'"));
}

bool IsIntLike(const Value& v) {
  return v.type() == Value::Type::kInt || v.type() == Value::Type::kBool;
}

// Python's floor division and modulo (the result takes the divisor's sign).
int64_t FloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

absl::StatusOr<Value> Repeat(const Value& seq, int64_t n) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    if (static_cast<double>(seq.as_string().size()) * n > (64 << 20)) {
      return absl::ResourceExhaustedError("string repetition past 64 MiB");
    }
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.as_string();
    return Value::String(std::move(out));
  }
  if (static_cast<double>(seq.as_list().size()) * n > kMaxListItems) {
    return absl::ResourceExhaustedError("list repetition past a million items");
  }
  std::vector<Value> out;
  for (int64_t i = 0; i < n; ++i) {
    out.insert(out.end(), seq.as_list().begin(), seq.as_list().end());
  }
  return Value::List(std::move(out), seq.is_tuple());
}

}  // namespace

absl::StatusOr<Value> Renderer::EvalBinary(const Expr& e, const Value& a,
                                           const Value& b) {
  const std::string& op = e.name;
  const char* o = op.c_str();
  if (a.is_number() && b.is_number()) {
    const bool ints = IsIntLike(a) && IsIntLike(b);
    const int64_t x = a.as_int(), y = b.as_int();
    const double fx = a.as_float(), fy = b.as_float();
    int64_t r;
    if (op == "+") {
      if (!ints) return Value::Float(fx + fy);
      if (__builtin_add_overflow(x, y, &r)) {
        return absl::InvalidArgumentError("integer overflow");
      }
      return Value::Int(r);
    }
    if (op == "-") {
      if (!ints) return Value::Float(fx - fy);
      if (__builtin_sub_overflow(x, y, &r)) {
        return absl::InvalidArgumentError("integer overflow");
      }
      return Value::Int(r);
    }
    if (op == "*") {
      if (!ints) return Value::Float(fx * fy);
      if (__builtin_mul_overflow(x, y, &r)) {
        return absl::InvalidArgumentError("integer overflow");
      }
      return Value::Int(r);
    }
    if (op == "/") {
      if (fy == 0.0) return absl::InvalidArgumentError("division by zero");
      return Value::Float(fx / fy);
    }
    if (op == "//" || op == "%") {
      if (ints) {
        if (y == 0) {
          return absl::InvalidArgumentError(
              "integer division or modulo by zero");
        }
        if (x == INT64_MIN && y == -1) {
          return absl::InvalidArgumentError("integer overflow");
        }
        const int64_t q = FloorDiv(x, y);
        return Value::Int(op == "//" ? q : x - q * y);
      }
      if (fy == 0.0) {
        return absl::InvalidArgumentError("float division or modulo by zero");
      }
      const double q = std::floor(fx / fy);
      return Value::Float(op == "//" ? q : fx - q * fy);
    }
    if (op == "**") {
      if (ints && y >= 0) {
        int64_t acc = 1;
        if (x == 0 || x == 1) return Value::Int(y == 0 ? 1 : x);
        if (x == -1) return Value::Int(y % 2 == 0 ? 1 : -1);
        for (int64_t k = 0; k < y; ++k) {
          if (__builtin_mul_overflow(acc, x, &acc)) {
            return absl::InvalidArgumentError("integer overflow");
          }
        }
        return Value::Int(acc);
      }
      return Value::Float(std::pow(fx, fy));
    }
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      if (a.as_string().size() + b.as_string().size() >
          limits_.max_output_bytes) {
        return absl::ResourceExhaustedError(
            "a string grew past the output limit");
      }
      return Value::String(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      if (a.as_list().size() + b.as_list().size() > kMaxListItems) {
        return absl::ResourceExhaustedError("a list grew past a million items");
      }
      std::vector<Value> out = a.as_list();
      out.insert(out.end(), b.as_list().begin(), b.as_list().end());
      return Value::List(std::move(out), a.is_tuple());
    }
  }
  if (op == "*") {
    if ((a.is_string() || a.is_list()) && IsIntLike(b)) {
      return Repeat(a, b.as_int());
    }
    if ((b.is_string() || b.is_list()) && IsIntLike(a)) {
      return Repeat(b, a.as_int());
    }
  }
  if (op == "%" && a.is_string()) {
    return absl::InvalidArgumentError(
        "printf-style string formatting ('…' % values) is not supported");
  }
  return OperandError(o, a, b);
}

absl::StatusOr<Value> Renderer::EvalCompare(const Expr& e) {
  auto left = Eval(*e.items[0]);
  if (!left.ok()) return left;
  Value a = std::move(*left);
  for (const auto& [op, operand] : e.keyword) {
    auto right = Eval(*operand);
    if (!right.ok()) return right;
    absl::StatusOr<bool> holds;
    if (op == "in" || op == "not in") {
      CallArgs args;
      args.positional.push_back(*right);
      holds = ApplyTest("in", a, args);
      if (holds.ok() && op == "not in") holds = !*holds;
    } else {
      CallArgs args;
      args.positional.push_back(*right);
      holds = ApplyTest(op, a, args);
    }
    if (!holds.ok()) return Located(e.line, e.column, holds.status());
    if (!*holds) return Value::Bool(false);
    a = std::move(*right);
  }
  return Value::Bool(true);
}

absl::StatusOr<CallArgs> Renderer::EvalArgs(const Expr& e) {
  CallArgs args;
  for (const auto& item : e.items) {
    auto v = Eval(*item);
    if (!v.ok()) return v.status();
    args.positional.push_back(std::move(*v));
  }
  for (const auto& [key, item] : e.keyword) {
    auto v = Eval(*item);
    if (!v.ok()) return v.status();
    args.keyword.emplace_back(key, std::move(*v));
  }
  return args;
}

absl::StatusOr<Value> Renderer::Eval(const Expr& e) {
  auto here = [&](absl::StatusOr<Value> v) -> absl::StatusOr<Value> {
    if (v.ok()) return v;
    return Located(e.line, e.column, v.status());
  };
  switch (e.kind) {
    case Expr::Kind::kLiteral:
      return e.value;
    case Expr::Kind::kName:
      return Lookup(e.name);
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      std::vector<Value> items;
      for (const auto& item : e.items) {
        auto v = Eval(*item);
        if (!v.ok()) return v;
        items.push_back(std::move(*v));
      }
      return Value::List(std::move(items), e.kind == Expr::Kind::kTuple);
    }
    case Expr::Kind::kDict: {
      Dict d;
      for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
        auto k = Eval(*e.items[i]);
        if (!k.ok()) return k;
        if (!k->is_string()) {
          return here(absl::InvalidArgumentError(
              "dict keys other than strings are not supported"));
        }
        auto v = Eval(*e.items[i + 1]);
        if (!v.ok()) return v;
        d.Set(k->as_string(), std::move(*v));
      }
      return Value::DictOf(std::move(d));
    }
    case Expr::Kind::kAttr: {
      auto obj = Eval(*e.a);
      if (!obj.ok()) return obj;
      return here(GetAttr(*obj, e.name));
    }
    case Expr::Kind::kItem: {
      auto obj = Eval(*e.a);
      if (!obj.ok()) return obj;
      auto key = Eval(*e.b);
      if (!key.ok()) return key;
      return here(GetItem(*obj, *key));
    }
    case Expr::Kind::kSlice: {
      auto obj = Eval(*e.a);
      if (!obj.ok()) return obj;
      Value parts[3];
      for (int i = 0; i < 3; ++i) {
        if (!e.items[i]) continue;
        auto v = Eval(*e.items[i]);
        if (!v.ok()) return v;
        parts[i] = std::move(*v);
      }
      return here(Slice(*obj, parts[0], parts[1], parts[2]));
    }
    case Expr::Kind::kCall: {
      auto callee = Eval(*e.a);
      if (!callee.ok()) return callee;
      auto args = EvalArgs(e);
      if (!args.ok()) return args.status();
      if (callee->is_undefined()) return here(UndefinedError(*callee));
      if (!callee->is_callable()) {
        return here(absl::InvalidArgumentError(
            absl::StrCat("'", callee->TypeName(), "' object is not callable")));
      }
      if (absl::Status st = Step(e.line, e.column); !st.ok()) return st;
      return here(callee->as_function()(*this, *args));
    }
    case Expr::Kind::kFilter: {
      auto subject = Eval(*e.a);
      if (!subject.ok()) return subject;
      auto args = EvalArgs(e);
      if (!args.ok()) return args.status();
      return here(ApplyFilter(e.name, *subject, *args));
    }
    case Expr::Kind::kTest: {
      auto subject = Eval(*e.a);
      if (!subject.ok()) return subject;
      auto args = EvalArgs(e);
      if (!args.ok()) return args.status();
      auto holds = ApplyTest(e.name, *subject, *args);
      if (!holds.ok()) return here(holds.status());
      return Value::Bool(*holds != e.negated);
    }
    case Expr::Kind::kNeg:
    case Expr::Kind::kPos: {
      auto v = Eval(*e.a);
      if (!v.ok()) return v;
      if (v->type() == Value::Type::kFloat) {
        return Value::Float(e.kind == Expr::Kind::kNeg ? -v->as_float()
                                                       : v->as_float());
      }
      if (IsIntLike(*v)) {
        if (e.kind == Expr::Kind::kPos) return Value::Int(v->as_int());
        if (v->as_int() == INT64_MIN) {
          return here(absl::InvalidArgumentError("integer overflow"));
        }
        return Value::Int(-v->as_int());
      }
      if (v->is_undefined()) return here(UndefinedError(*v));
      return here(absl::InvalidArgumentError(absl::StrCat(
          "bad operand type for unary ", e.kind == Expr::Kind::kNeg ? "-" : "+",
          ": '", v->TypeName(), "'")));
    }
    case Expr::Kind::kNot: {
      auto v = Eval(*e.a);
      if (!v.ok()) return v;
      return Value::Bool(!v->Truthy());
    }
    case Expr::Kind::kAnd:
    case Expr::Kind::kOr: {
      auto a = Eval(*e.a);
      if (!a.ok()) return a;
      const bool decided =
          e.kind == Expr::Kind::kAnd ? !a->Truthy() : a->Truthy();
      if (decided) return a;
      return Eval(*e.b);
    }
    case Expr::Kind::kBinary: {
      auto a = Eval(*e.a);
      if (!a.ok()) return a;
      auto b = Eval(*e.b);
      if (!b.ok()) return b;
      return here(EvalBinary(e, *a, *b));
    }
    case Expr::Kind::kConcat: {
      std::string out;
      for (const auto& item : e.items) {
        auto v = Eval(*item);
        if (!v.ok()) return v;
        out += v->Str();
        if (out.size() > limits_.max_output_bytes) {
          return absl::ResourceExhaustedError(
              At(e.line, e.column, "a string grew past the output limit"));
        }
      }
      return Value::String(std::move(out));
    }
    case Expr::Kind::kCompare:
      return EvalCompare(e);
    case Expr::Kind::kCondition: {
      auto test = Eval(*e.items[1]);
      if (!test.ok()) return test;
      if (test->Truthy()) return Eval(*e.items[0]);
      if (e.items[2]) return Eval(*e.items[2]);
      return Value::Undefined("");
    }
  }
  return Value();
}

}  // namespace linattn::jinja
