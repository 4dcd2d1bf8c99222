// Jinja's filters, as jinja2/filters.py defines them (with Hugging Face's
// tojson, which does not HTML-escape): the helpers they share, the filters
// of strings and numbers, and the table of all (the filters over sequences
// are in filters_sequence.cc).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/model/jinja/builtins.h"
#include "core/model/jinja/filters_internal.h"
#include "core/model/jinja/str_methods.h"
#include "core/model/jinja/text.h"

namespace linattn::jinja {

namespace filters {

absl::Status TypeError(absl::string_view what, const Value& v) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": unsupported value of type '", v.TypeName(), "'"));
}

Value Or(const Value& v, Value fallback) {
  return v.is_undefined() ? fallback : v;
}

// Jinja's make_attrgetter: "a.b.0" walks attributes and indices.
absl::StatusOr<Value> AttrPath(const Value& v, const Value& path) {
  if (path.type() == Value::Type::kInt) return GetItem(v, path);
  if (!path.is_string())
    return absl::InvalidArgumentError("attribute must be a string");
  Value cur = v;
  const std::string& p = path.as_string();
  size_t start = 0;
  for (;;) {
    const size_t dot = p.find('.', start);
    const std::string part =
        p.substr(start, dot == std::string::npos ? dot : dot - start);
    Value key = Value::String(part);
    int64_t index;
    if (!part.empty() && std::all_of(part.begin(), part.end(), ::isdigit) &&
        absl::SimpleAtoi(part, &index)) {
      key = Value::Int(index);
    }
    auto next = GetItem(cur, key);
    if (!next.ok()) return next;
    cur = *next;
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

absl::StatusOr<std::vector<Value>> Items(const Value& v) {
  if (v.is_undefined()) return std::vector<Value>();
  return Iterate(v);
}

}  // namespace filters

namespace {

using filters::Args;
using filters::AttrPath;
using filters::Items;
using filters::Or;
using filters::TypeError;
using FilterFn = absl::StatusOr<Value> (*)(const Value& v, const Args& a);

struct FilterDef {
  std::vector<absl::string_view> params;
  FilterFn fn;
};

absl::StatusOr<Value> Length(const Value& v, const Args&) {
  switch (v.type()) {
    case Value::Type::kUndefined:
      return Value::Int(0);
    case Value::Type::kString:
      return Value::Int(static_cast<int64_t>(CodePointCount(v.as_string())));
    case Value::Type::kList:
      return Value::Int(static_cast<int64_t>(v.as_list().size()));
    case Value::Type::kDict:
      return Value::Int(static_cast<int64_t>(v.as_dict().size()));
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("object of type '", v.TypeName(), "' has no len()"));
  }
}

absl::StatusOr<Value> Default(const Value& v, const Args& a) {
  const bool boolean = a[1].Truthy();
  if (v.is_undefined() || (boolean && !v.Truthy())) {
    return Or(a[0], Value::String(""));
  }
  return v;
}

absl::StatusOr<Value> StringFilter(const Value& v, const Args&) {
  return Value::String(v.Str());
}

absl::StatusOr<Value> Trim(const Value& v, const Args& a) {
  auto r = StripChars(v.Str(), a[0], 'b');
  if (!r.ok()) return r.status();
  return Value::String(*r);
}

absl::StatusOr<Value> ToJson(const Value& v, const Args& a) {
  JsonStyle style;
  style.ensure_ascii = a[0].Truthy();
  if (!a[1].is_undefined() && !a[1].is_none()) {
    if (a[1].type() == Value::Type::kInt) {
      style.indent =
          static_cast<int>(std::clamp<int64_t>(a[1].as_int(), 0, 64));
    } else if (a[1].is_string()) {
      return absl::InvalidArgumentError("tojson: indent must be an integer");
    }
  }
  if (!a[2].is_undefined() && !a[2].is_none()) {
    if (!a[2].is_list() || a[2].as_list().size() != 2 ||
        !a[2].as_list()[0].is_string() || !a[2].as_list()[1].is_string()) {
      return absl::InvalidArgumentError(
          "tojson: separators must be two strings");
    }
    style.item_separator = a[2].as_list()[0].as_string();
    style.key_separator = a[2].as_list()[1].as_string();
    if (style.item_separator.empty()) style.item_separator = std::string();
  }
  style.sort_keys = a[3].Truthy();
  auto out = DumpJson(v, style);
  if (!out.ok()) return out.status();
  return Value::String(std::move(*out));
}

absl::StatusOr<Value> Upper_(const Value& v, const Args&) {
  return Value::String(Upper(v.Str()));
}
absl::StatusOr<Value> Lower_(const Value& v, const Args&) {
  return Value::String(Lower(v.Str()));
}
absl::StatusOr<Value> Capitalize_(const Value& v, const Args&) {
  return Value::String(Capitalize(v.Str()));
}

// Jinja's title: each piece after a run of [-\s({[<] starts upper case.
absl::StatusOr<Value> Title(const Value& v, const Args&) {
  const std::u32string cps = ToCodePoints(v.Str());
  auto separator = [](char32_t c) {
    return IsPySpace(c) || c == '-' || c == '(' || c == '{' || c == '[' ||
           c == '<';
  };
  std::u32string out;
  bool start = true;
  for (char32_t c : cps) {
    if (separator(c)) {
      out.push_back(c);
      start = true;
      continue;
    }
    const std::string one = FromCodePoints(std::u32string(1, c));
    out += ToCodePoints(start ? Upper(one) : Lower(one));
    start = false;
  }
  return Value::String(FromCodePoints(out));
}

absl::StatusOr<Value> ReplaceFilter(const Value& v, const Args& a) {
  int64_t count = -1;
  if (!a[2].is_undefined() && !a[2].is_none()) {
    if (a[2].type() != Value::Type::kInt) {
      return absl::InvalidArgumentError("replace: count must be an integer");
    }
    count = a[2].as_int();
  }
  auto r = Replace(v.Str(), a[0].Str(), a[1].Str(), count);
  if (!r.ok()) return r.status();
  return Value::String(std::move(*r));
}

absl::StatusOr<Value> Int(const Value& v, const Args& a) {
  const Value fallback = Or(a[0], Value::Int(0));
  switch (v.type()) {
    case Value::Type::kInt:
    case Value::Type::kBool:
      return Value::Int(v.as_int());
    case Value::Type::kFloat:
      if (!std::isfinite(v.as_float()) || std::fabs(v.as_float()) > 9.2e18) {
        return fallback;
      }
      return Value::Int(static_cast<int64_t>(v.as_float()));
    case Value::Type::kString: {
      const std::string s(LStripSpace(RStripSpace(v.as_string())));
      char* end = nullptr;
      errno = 0;
      const long long i = std::strtoll(s.c_str(), &end, 10);
      if (!s.empty() && *end == '\0' && errno == 0) return Value::Int(i);
      const double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && *end == '\0' && std::isfinite(d) &&
          std::fabs(d) < 9.2e18) {
        return Value::Int(static_cast<int64_t>(d));
      }
      return fallback;
    }
    default:
      return fallback;
  }
}

absl::StatusOr<Value> Float(const Value& v, const Args& a) {
  const Value fallback = Or(a[0], Value::Float(0.0));
  if (v.is_number()) return Value::Float(v.as_float());
  if (v.is_string()) {
    const std::string s(LStripSpace(RStripSpace(v.as_string())));
    char* end = nullptr;
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && *end == '\0') return Value::Float(d);
  }
  return fallback;
}

absl::StatusOr<Value> Abs(const Value& v, const Args&) {
  if (v.type() == Value::Type::kFloat)
    return Value::Float(std::fabs(v.as_float()));
  if (v.type() == Value::Type::kInt || v.type() == Value::Type::kBool) {
    if (v.as_int() == INT64_MIN)
      return absl::InvalidArgumentError("abs: integer overflow");
    return Value::Int(v.as_int() < 0 ? -v.as_int() : v.as_int());
  }
  return TypeError("abs", v);
}

absl::StatusOr<Value> Round(const Value& v, const Args& a) {
  if (!v.is_number()) return TypeError("round", v);
  // Python's round() of an int is that int (at any precision ≥ 0).
  const bool whole = v.type() != Value::Type::kFloat;
  if (whole && (a[0].is_undefined() || a[0].as_int() >= 0) &&
      (a[1].is_undefined() || a[1].Str() == "common")) {
    return Value::Int(v.as_int());
  }
  const int64_t precision = a[0].is_undefined() ? 0 : a[0].as_int();
  const std::string method = a[1].is_undefined() ? "common" : a[1].Str();
  const double x = v.as_float();
  if (method == "common") {
    // Python's round(x, n): the decimal nearest the exact binary value,
    // ties to even, which is what printf's %.*f writes.
    if (precision >= 0 && precision <= 300 && std::isfinite(x)) {
      char buf[400];
      std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(precision), x);
      return Value::Float(std::strtod(buf, nullptr));
    }
    const double scale = std::pow(10.0, static_cast<double>(precision));
    return Value::Float(std::nearbyint(x * scale) / scale);
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  if (method == "ceil") return Value::Float(std::ceil(x * scale) / scale);
  if (method == "floor") return Value::Float(std::floor(x * scale) / scale);
  return absl::InvalidArgumentError(
      "round: method must be common, ceil or floor");
}

absl::StatusOr<Value> Escape(const Value& v, const Args&) {
  std::string out;
  for (char c : v.Str()) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return Value::String(std::move(out));
}

absl::StatusOr<Value> Safe(const Value& v, const Args&) { return v; }

absl::StatusOr<Value> Attr(const Value& v, const Args& a) {
  if (!a[0].is_string())
    return absl::InvalidArgumentError("attr: name must be a string");
  return GetAttr(v, a[0].as_string());
}

absl::StatusOr<Value> Indent(const Value& v, const Args& a) {
  std::string pad = "    ";
  if (a[0].is_string()) {
    pad = a[0].as_string();
  } else if (a[0].type() == Value::Type::kInt) {
    pad = std::string(
        static_cast<size_t>(std::clamp<int64_t>(a[0].as_int(), 0, 256)), ' ');
  }
  // Jinja appends a newline, splits the lines, then indents every line
  // after the first (the empty ones only when `blank`).
  const std::vector<std::string> lines = SplitLines(v.Str() + "\n");
  std::string out = lines.empty() ? "" : lines[0];
  for (size_t i = 1; i < lines.size(); ++i) {
    out += "\n";
    if (a[2].Truthy() || !lines[i].empty()) out += pad;
    out += lines[i];
  }
  if (a[1].Truthy()) out = pad + out;
  return Value::String(std::move(out));
}

absl::StatusOr<Value> WordCount(const Value& v, const Args&) {
  // Jinja counts \w+ matches.
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : ToCodePoints(v.Str())) {
    const bool w =
        c == '_' ||
        (c < 0x80 ? std::isalnum(static_cast<int>(c)) != 0 : !IsPySpace(c));
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::Int(n);
}

const absl::flat_hash_map<std::string, FilterDef>& Filters() {
  static const auto* filters = new absl::flat_hash_map<std::string, FilterDef>{
      {"abs", {{}, Abs}},
      {"attr", {{"name"}, Attr}},
      {"capitalize", {{}, Capitalize_}},
      {"count", {{}, Length}},
      {"d", {{"default_value", "boolean"}, Default}},
      {"default", {{"default_value", "boolean"}, Default}},
      {"dictsort", {{"case_sensitive", "by", "reverse"}, filters::DictSort}},
      {"e", {{}, Escape}},
      {"escape", {{}, Escape}},
      {"first", {{}, filters::First}},
      {"float", {{"default"}, Float}},
      {"indent", {{"width", "first", "blank"}, Indent}},
      {"int", {{"default", "base"}, Int}},
      {"items", {{}, filters::ItemsFilter}},
      {"join", {{"d", "attribute"}, filters::Join}},
      {"last", {{}, filters::Last}},
      {"length", {{}, Length}},
      {"list", {{}, filters::ListFilter}},
      {"lower", {{}, Lower_}},
      {"map",
       {{"filter", "attribute", "default", "a1", "a2", "a3"}, filters::Map}},
      {"max", {{"case_sensitive", "attribute"}, filters::Max}},
      {"min", {{"case_sensitive", "attribute"}, filters::Min}},
      {"reject", {{"test", "a1", "a2", "a3"}, filters::Reject}},
      {"rejectattr",
       {{"attribute", "test", "a1", "a2", "a3"}, filters::RejectAttr}},
      {"replace", {{"old", "new", "count"}, ReplaceFilter}},
      {"reverse", {{}, filters::Reverse}},
      {"round", {{"precision", "method"}, Round}},
      {"safe", {{}, Safe}},
      {"select", {{"test", "a1", "a2", "a3"}, filters::Select}},
      {"selectattr",
       {{"attribute", "test", "a1", "a2", "a3"}, filters::SelectAttr}},
      {"sort", {{"reverse", "case_sensitive", "attribute"}, filters::Sort}},
      {"string", {{}, StringFilter}},
      {"sum", {{"attribute", "start"}, filters::Sum}},
      {"title", {{}, Title}},
      {"tojson",
       {{"ensure_ascii", "indent", "separators", "sort_keys"}, ToJson}},
      {"trim", {{"chars"}, Trim}},
      {"unique", {{"case_sensitive", "attribute"}, filters::Unique}},
      {"upper", {{}, Upper_}},
      {"wordcount", {{}, WordCount}},
  };
  return *filters;
}

}  // namespace

bool IsFilter(absl::string_view name) {
  return Filters().contains(std::string(name));
}

absl::StatusOr<Value> ApplyFilter(absl::string_view name, const Value& value,
                                  const CallArgs& args) {
  const auto it = Filters().find(std::string(name));
  if (it == Filters().end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no filter named '", name, "'"));
  }
  // map's and select's own extra arguments are positional only.
  CallArgs bound_args = args;
  if (name == "map" && !args.positional.empty()) {
    // map('filter', x, y): the filter's arguments follow its name.
    CallArgs shifted;
    shifted.positional.push_back(args.positional[0]);
    shifted.positional.push_back(Value());
    shifted.positional.push_back(Value());
    for (size_t i = 1; i < args.positional.size(); ++i) {
      shifted.positional.push_back(args.positional[i]);
    }
    shifted.keyword = args.keyword;
    bound_args = std::move(shifted);
  }
  auto bound = BindArgs(name, bound_args, it->second.params);
  if (!bound.ok()) return bound.status();
  if (name == "map" && (*bound)[0].is_undefined() &&
      (*bound)[1].is_undefined()) {
    return absl::InvalidArgumentError("map: give a filter name or attribute=");
  }
  return it->second.fn(value, *bound);
}

}  // namespace linattn::jinja
