// Jinja's tests (`x is defined`, `x is divisibleby 3` …), as
// jinja2/tests.py defines them.
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/model/jinja/builtins.h"
#include "core/model/jinja/str_methods.h"

namespace linattn::jinja {

namespace {

using TestFn = absl::StatusOr<bool> (*)(const Value& v, const Value& arg);

absl::StatusOr<bool> Compare(const Value& a, const Value& b, const char* op) {
  const std::string o = op;
  if (o == "==") return a == b;
  if (o == "!=") return a != b;
  absl::StatusOr<bool> lt = (o == "<" || o == ">=") ? Less(a, b) : Less(b, a);
  if (!lt.ok()) return lt;
  return (o == "<" || o == ">") ? *lt : !*lt;
}

absl::StatusOr<bool> In(const Value& v, const Value& seq) {
  switch (seq.type()) {
    case Value::Type::kString:
      if (!v.is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat("'in <string>' requires string as left operand, not ",
                         v.TypeName()));
      }
      return seq.as_string().find(v.as_string()) != std::string::npos;
    case Value::Type::kList:
      for (const Value& x : seq.as_list()) {
        if (x == v) return true;
      }
      return false;
    case Value::Type::kDict:
      return v.is_string() && seq.as_dict().Find(v.as_string()) != nullptr;
    case Value::Type::kUndefined:
      return false;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "argument of type '", seq.TypeName(), "' is not iterable"));
  }
}

bool IsInt(const Value& v) { return v.type() == Value::Type::kInt; }

const absl::flat_hash_map<std::string, TestFn>& Tests() {
  static const auto* tests = new absl::flat_hash_map<std::string, TestFn>{
      {"defined",
       [](const Value& v, const Value&) -> absl::StatusOr<bool> {
         return !v.is_undefined();
       }},
      {"undefined",
       [](const Value& v, const Value&) -> absl::StatusOr<bool> {
         return v.is_undefined();
       }},
      {"none",
       [](const Value& v, const Value&) -> absl::StatusOr<bool> {
         return v.is_none();
       }},
      {"boolean",
       [](const Value& v, const Value&) -> absl::StatusOr<bool> {
         return v.type() == Value::Type::kBool;
       }},
      {"true",
       [](const Value& v, const Value&) -> absl::StatusOr<bool> {
         return v.type() == Value::Type::kBool && v.as_bool();
       }},
      {"false",
       [](const Value& v, const Value&) -> absl::StatusOr<bool> {
         return v.type() == Value::Type::kBool && !v.as_bool();
       }},
      {"integer",
       [](const Value& v, const Value&) -> absl::StatusOr<bool> {
         return IsInt(v);
       }},
      {"float",
       [](const Value& v, const Value&) -> absl::StatusOr<bool> {
         return v.type() == Value::Type::kFloat;
       }},
      {"number",
       [](const Value& v, const Value&) -> absl::StatusOr<bool> {
         return v.is_number();
       }},
      {"string",
       [](const Value& v, const Value&) -> absl::StatusOr<bool> {
         return v.is_string();
       }},
      {"mapping",
       [](const Value& v, const Value&) -> absl::StatusOr<bool> {
         return v.is_dict();
       }},
      {"iterable",
       [](const Value& v, const Value&) -> absl::StatusOr<bool> {
         return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
       }},
      {"sequence",
       [](const Value& v, const Value&) -> absl::StatusOr<bool> {
         return v.is_string() || v.is_list() || v.is_dict();
       }},
      {"callable",
       [](const Value& v, const Value&) -> absl::StatusOr<bool> {
         return v.is_callable();
       }},
      {"even",
       [](const Value& v, const Value&) -> absl::StatusOr<bool> {
         if (!v.is_number() || v.type() == Value::Type::kFloat) {
           return absl::InvalidArgumentError(
               "even: the value is not an integer");
         }
         return v.as_int() % 2 == 0;
       }},
      {"odd",
       [](const Value& v, const Value&) -> absl::StatusOr<bool> {
         if (!v.is_number() || v.type() == Value::Type::kFloat) {
           return absl::InvalidArgumentError(
               "odd: the value is not an integer");
         }
         return v.as_int() % 2 != 0;
       }},
      {"divisibleby",
       [](const Value& v, const Value& n) -> absl::StatusOr<bool> {
         if (!v.is_number() || !n.is_number() ||
             v.type() == Value::Type::kFloat ||
             n.type() == Value::Type::kFloat) {
           return absl::InvalidArgumentError("divisibleby: integers only");
         }
         if (n.as_int() == 0)
           return absl::InvalidArgumentError("integer modulo by zero");
         if (n.as_int() == -1) return true;  // INT64_MIN % -1 would trap
         return v.as_int() % n.as_int() == 0;
       }},
      {"lower",
       [](const Value& v, const Value&) -> absl::StatusOr<bool> {
         // str.islower(): some cased character, none upper case.
         const std::string s = v.Str();
         return s != Upper(s) && s == Lower(s);
       }},
      {"upper",
       [](const Value& v, const Value&) -> absl::StatusOr<bool> {
         const std::string s = v.Str();
         return s != Lower(s) && s == Upper(s);
       }},
      {"sameas",
       [](const Value& v, const Value& o) -> absl::StatusOr<bool> {
         return v.type() == o.type() && v == o;
       }},
      {"in", [](const Value& v, const Value& seq) { return In(v, seq); }},
      {"eq",
       [](const Value& v, const Value& o) { return Compare(v, o, "=="); }},
      {"equalto",
       [](const Value& v, const Value& o) { return Compare(v, o, "=="); }},
      {"==",
       [](const Value& v, const Value& o) { return Compare(v, o, "=="); }},
      {"ne",
       [](const Value& v, const Value& o) { return Compare(v, o, "!="); }},
      {"!=",
       [](const Value& v, const Value& o) { return Compare(v, o, "!="); }},
      {"lt", [](const Value& v, const Value& o) { return Compare(v, o, "<"); }},
      {"lessthan",
       [](const Value& v, const Value& o) { return Compare(v, o, "<"); }},
      {"<", [](const Value& v, const Value& o) { return Compare(v, o, "<"); }},
      {"le",
       [](const Value& v, const Value& o) { return Compare(v, o, "<="); }},
      {"<=",
       [](const Value& v, const Value& o) { return Compare(v, o, "<="); }},
      {"gt", [](const Value& v, const Value& o) { return Compare(v, o, ">"); }},
      {"greaterthan",
       [](const Value& v, const Value& o) { return Compare(v, o, ">"); }},
      {">", [](const Value& v, const Value& o) { return Compare(v, o, ">"); }},
      {"ge",
       [](const Value& v, const Value& o) { return Compare(v, o, ">="); }},
      {">=",
       [](const Value& v, const Value& o) { return Compare(v, o, ">="); }},
  };
  return *tests;
}

// The tests that take one argument.
bool TakesArgument(absl::string_view name) {
  static const char* const kUnary[] = {
      "defined",  "undefined", "none",   "boolean", "true",    "false",
      "integer",  "float",     "number", "string",  "mapping", "iterable",
      "sequence", "callable",  "even",   "odd",     "lower",   "upper"};
  for (const char* n : kUnary) {
    if (name == n) return false;
  }
  return true;
}

}  // namespace

bool IsTest(absl::string_view name) {
  return Tests().contains(std::string(name));
}

absl::StatusOr<bool> ApplyTest(absl::string_view name, const Value& value,
                               const CallArgs& args) {
  const auto it = Tests().find(std::string(name));
  if (it == Tests().end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no test named '", name, "'"));
  }
  const bool unary = !TakesArgument(name);
  auto bound = BindArgs(name, args,
                        unary ? std::vector<absl::string_view>{}
                              : std::vector<absl::string_view>{"value"});
  if (!bound.ok()) return bound.status();
  if (!unary && (*bound)[0].is_undefined() && args.positional.empty() &&
      args.keyword.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("test '", name, "' takes one argument"));
  }
  return it->second(value, unary ? Value() : (*bound)[0]);
}

}  // namespace linattn::jinja
