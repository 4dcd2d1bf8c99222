#include "core/model/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"

namespace linattn::jinja {

void Dict::Set(const std::string& key, Value value) {
  auto [it, inserted] = index_.try_emplace(key, items_.size());
  if (inserted) {
    items_.emplace_back(key, std::move(value));
  } else {
    items_[it->second].second = std::move(value);
  }
}

const Value* Dict::Find(absl::string_view key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &items_[it->second].second;
}

Value Value::Undefined(std::string name) {
  Value v;
  v.string_ = std::make_shared<const std::string>(std::move(name));
  return v;
}
Value Value::None() {
  Value v;
  v.type_ = Type::kNone;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.type_ = Type::kBool;
  v.int_ = b ? 1 : 0;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.type_ = Type::kInt;
  v.int_ = i;
  return v;
}
Value Value::Float(double d) {
  Value v;
  v.type_ = Type::kFloat;
  v.float_ = d;
  return v;
}
Value Value::String(std::string s) {
  Value v;
  v.type_ = Type::kString;
  v.string_ = std::make_shared<const std::string>(std::move(s));
  return v;
}
Value Value::List(std::vector<Value> items, bool tuple) {
  Value v;
  v.type_ = Type::kList;
  v.tuple_ = tuple;
  for (const Value& item : items) v.depth_ = std::max(v.depth_, item.depth_);
  ++v.depth_;
  v.list_ = std::make_shared<const std::vector<Value>>(std::move(items));
  return v;
}
Value Value::DictOf(Dict dict) {
  Value v;
  v.type_ = Type::kDict;
  for (const auto& [k, item] : dict.items()) {
    v.depth_ = std::max(v.depth_, item.depth_);
  }
  ++v.depth_;
  v.dict_ = std::make_shared<Dict>(std::move(dict));
  return v;
}
Value Value::Namespace(Dict initial) {
  Value v = DictOf(std::move(initial));
  v.type_ = Type::kNamespace;
  return v;
}
Value Value::Callable(std::string name, Function f) {
  Value v;
  v.type_ = Type::kFunction;
  v.string_ = std::make_shared<const std::string>(std::move(name));
  v.function_ = std::make_shared<const Function>(std::move(f));
  return v;
}

Value Value::FromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return None();
    case nlohmann::ordered_json::value_t::boolean:
      return Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) {
        return Int(static_cast<int64_t>(u));
      }
      return Float(static_cast<double>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Float(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return String(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& item : j) items.push_back(FromJson(item));
      return List(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (const auto& [key, item] : j.items()) d.Set(key, FromJson(item));
      return DictOf(std::move(d));
    }
    default:
      return None();
  }
}

bool Value::Truthy() const {
  switch (type_) {
    case Type::kUndefined:
    case Type::kNone:
      return false;
    case Type::kBool:
    case Type::kInt:
      return int_ != 0;
    case Type::kFloat:
      return float_ != 0.0;
    case Type::kString:
      return !string_->empty();
    case Type::kList:
      return !list_->empty();
    case Type::kDict:
      return dict_->size() != 0;
    case Type::kNamespace:
    case Type::kFunction:
      return true;
  }
  return false;
}

const char* Value::TypeName() const {
  switch (type_) {
    case Type::kUndefined:
      return "Undefined";
    case Type::kNone:
      return "NoneType";
    case Type::kBool:
      return "bool";
    case Type::kInt:
      return "int";
    case Type::kFloat:
      return "float";
    case Type::kString:
      return "str";
    case Type::kList:
      return tuple_ ? "tuple" : "list";
    case Type::kDict:
      return "dict";
    case Type::kNamespace:
      return "Namespace";
    case Type::kFunction:
      return "function";
  }
  return "?";
}

std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0.0) return std::signbit(d) ? "-0.0" : "0.0";
  // The shortest digits that round-trip, then Python's layout: positional
  // for exponents in [-4, 16), else d.ddde±XX.
  char buf[64];
  auto r =
      std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  const absl::string_view sci(buf, static_cast<size_t>(r.ptr - buf));
  const size_t e = sci.find('e');
  const bool negative = sci[0] == '-';
  const absl::string_view mantissa =
      sci.substr(negative ? 1 : 0, e - (negative ? 1 : 0));
  int exp = 0;
  for (size_t i = e + 2; i < sci.size(); ++i) exp = exp * 10 + (sci[i] - '0');
  if (sci[e + 1] == '-') exp = -exp;
  const std::string sign = negative ? "-" : "";
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits.push_back(c);
  }
  if (exp < -4 || exp >= 16) {
    std::string out = sign;
    out.push_back(digits[0]);
    if (digits.size() > 1) absl::StrAppend(&out, ".", digits.substr(1));
    char ebuf[24];
    std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp < 0 ? '-' : '+',
                  exp < 0 ? -exp : exp);
    return absl::StrCat(out, ebuf);
  }
  std::string out = sign;
  if (exp < 0) {
    absl::StrAppend(&out, "0.", std::string(-exp - 1, '0'), digits);
  } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
    absl::StrAppend(&out, digits, std::string(exp + 1 - digits.size(), '0'),
                    ".0");
  } else {
    absl::StrAppend(&out, digits.substr(0, exp + 1), ".",
                    digits.substr(exp + 1));
  }
  return out;
}

namespace {

// Python's repr of a str: single quotes unless the text holds ' and no ".
std::string StringRepr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = s[i];
    if (c == static_cast<unsigned char>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      // Non-ASCII printable characters print as themselves (Python's
      // isprintable; the rare non-printable ones are not escaped here).
      out.push_back(c);
    }
  }
  out.push_back(quote);
  return out;
}

}  // namespace

std::string Value::Str() const {
  switch (type_) {
    case Type::kUndefined:
      return "";
    case Type::kString:
      return *string_;
    default:
      return Repr();
  }
}

std::string Value::Repr() const {
  switch (type_) {
    case Type::kUndefined:
      return "Undefined";  // jinja2's Undefined.__repr__
    case Type::kNone:
      return "None";
    case Type::kBool:
      return int_ ? "True" : "False";
    case Type::kInt:
      return absl::StrCat(int_);
    case Type::kFloat:
      return FloatRepr(float_);
    case Type::kString:
      return StringRepr(*string_);
    case Type::kList: {
      std::string out = tuple_ ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i) out += ", ";
        out += (*list_)[i].Repr();
      }
      if (tuple_ && list_->size() == 1) out += ",";
      out += tuple_ ? ")" : "]";
      return out;
    }
    case Type::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, v] : dict_->items()) {
        if (!first) out += ", ";
        first = false;
        absl::StrAppend(&out, StringRepr(k), ": ", v.Repr());
      }
      return out + "}";
    }
    case Type::kNamespace:
      return "<Namespace>";
    case Type::kFunction:
      return absl::StrCat("<function ", *string_, ">");
  }
  return "";
}

bool operator==(const Value& a, const Value& b) {
  using T = Value::Type;
  if (a.is_number() && b.is_number()) {
    if (a.type_ == T::kFloat || b.type_ == T::kFloat) {
      return a.as_float() == b.as_float();
    }
    return a.int_ == b.int_;
  }
  if (a.type_ != b.type_) return false;
  switch (a.type_) {
    case T::kUndefined:
    case T::kNone:
      return true;
    case T::kString:
      return *a.string_ == *b.string_;
    case T::kList:
      return a.tuple_ == b.tuple_ && *a.list_ == *b.list_;
    case T::kDict: {
      if (a.dict_->size() != b.dict_->size()) return false;
      for (const auto& [k, v] : a.dict_->items()) {
        const Value* other = b.dict_->Find(k);
        if (other == nullptr || !(*other == v)) return false;
      }
      return true;
    }
    case T::kNamespace:
    case T::kFunction:
      return a.dict_ == b.dict_ && a.function_ == b.function_;
    default:
      return false;
  }
}

absl::StatusOr<bool> Less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.type() == Value::Type::kFloat || b.type() == Value::Type::kFloat) {
      return a.as_float() < b.as_float();
    }
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const auto& x = a.as_list();
    const auto& y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (x[i] == y[i]) continue;
      return Less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'<' not supported between instances of '", a.TypeName(),
                   "' and '", b.TypeName(), "'"));
}

namespace {

void DumpString(const std::string& s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    switch (c) {
      case '"':
        *out += "\\\"";
        ++i;
        continue;
      case '\\':
        *out += "\\\\";
        ++i;
        continue;
      case '\n':
        *out += "\\n";
        ++i;
        continue;
      case '\r':
        *out += "\\r";
        ++i;
        continue;
      case '\t':
        *out += "\\t";
        ++i;
        continue;
      case '\b':
        *out += "\\b";
        ++i;
        continue;
      case '\f':
        *out += "\\f";
        ++i;
        continue;
      default:
        break;
    }
    if (c < 0x20 || (ensure_ascii && c == 0x7f)) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      *out += buf;
      ++i;
      continue;
    }
    if (c < 0x80 || !ensure_ascii) {
      out->push_back(c);
      ++i;
      continue;
    }
    // ensure_ascii: \uXXXX, surrogate pairs past the BMP.
    size_t n = 0;
    const std::u32string one = ToCodePoints(absl::string_view(s).substr(i));
    char32_t cp = one.empty() ? 0xFFFD : one[0];
    n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    char buf[16];
    if (cp >= 0x10000) {
      const char32_t v = cp - 0x10000;
      std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x",
                    static_cast<unsigned>(0xD800 + (v >> 10)),
                    static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
    } else {
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
    }
    *out += buf;
    i += n;
  }
  out->push_back('"');
}

absl::Status Dump(const Value& v, const JsonStyle& style, int depth,
                  std::string* out) {
  if (depth > 512) {
    return absl::InvalidArgumentError("tojson: value nested too deeply");
  }
  const std::string item_sep = !style.item_separator.empty()
                                   ? style.item_separator
                                   : (style.indent >= 0 ? "," : ", ");
  const std::string key_sep =
      !style.key_separator.empty() ? style.key_separator : ": ";
  auto newline = [&](int level) {
    if (style.indent < 0) return;
    out->push_back('\n');
    out->append(static_cast<size_t>(style.indent) * level, ' ');
  };
  switch (v.type()) {
    case Value::Type::kNone:
      *out += "null";
      return absl::OkStatus();
    case Value::Type::kBool:
      *out += v.as_bool() ? "true" : "false";
      return absl::OkStatus();
    case Value::Type::kInt:
      absl::StrAppend(out, v.as_int());
      return absl::OkStatus();
    case Value::Type::kFloat: {
      const double d = v.as_float();
      if (std::isnan(d)) {
        *out += "NaN";
      } else if (std::isinf(d)) {
        *out += d > 0 ? "Infinity" : "-Infinity";
      } else {
        *out += FloatRepr(d);
      }
      return absl::OkStatus();
    }
    case Value::Type::kString:
      DumpString(v.as_string(), style.ensure_ascii, out);
      return absl::OkStatus();
    case Value::Type::kList: {
      const auto& items = v.as_list();
      if (items.empty()) {
        *out += "[]";
        return absl::OkStatus();
      }
      out->push_back('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) *out += item_sep;
        newline(depth + 1);
        if (absl::Status s = Dump(items[i], style, depth + 1, out); !s.ok()) {
          return s;
        }
      }
      newline(depth);
      out->push_back(']');
      return absl::OkStatus();
    }
    case Value::Type::kDict: {
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& item : v.as_dict().items()) items.push_back(&item);
      if (items.empty()) {
        *out += "{}";
        return absl::OkStatus();
      }
      if (style.sort_keys) {
        std::stable_sort(
            items.begin(), items.end(),
            [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      out->push_back('{');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) *out += item_sep;
        newline(depth + 1);
        DumpString(items[i]->first, style.ensure_ascii, out);
        *out += key_sep;
        if (absl::Status s = Dump(items[i]->second, style, depth + 1, out);
            !s.ok()) {
          return s;
        }
      }
      newline(depth);
      out->push_back('}');
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("tojson: Object of type ", v.TypeName(),
                       " is not JSON serializable"));
  }
}

}  // namespace

absl::StatusOr<std::string> DumpJson(const Value& v, const JsonStyle& style) {
  std::string out;
  if (absl::Status s = Dump(v, style, 0, &out); !s.ok()) return s;
  return out;
}

std::u32string ToCodePoints(absl::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    size_t n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (i + n > s.size()) n = 1;
    char32_t cp = n == 1   ? c
                  : n == 2 ? (c & 0x1F)
                  : n == 3 ? (c & 0x0F)
                           : (c & 0x07);
    for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (s[i + k] & 0x3F);
    out.push_back(cp);
    i += n;
  }
  return out;
}

std::string FromCodePoints(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) {
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else if (c < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (c >> 6)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else if (c < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (c >> 12)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (c >> 18)));
      out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
  }
  return out;
}

size_t CodePointCount(absl::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace linattn::jinja
