#include "core/model/jinja/str_methods.h"

#include <utf8proc.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "core/model/jinja/builtins.h"
#include "core/model/jinja/text.h"

namespace linattn::jinja {

std::string Upper(absl::string_view s) {
  std::u32string cps = ToCodePoints(s);
  for (char32_t& c : cps) c = static_cast<char32_t>(utf8proc_toupper(c));
  return FromCodePoints(cps);
}

std::string Lower(absl::string_view s) {
  std::u32string cps = ToCodePoints(s);
  for (char32_t& c : cps) c = static_cast<char32_t>(utf8proc_tolower(c));
  return FromCodePoints(cps);
}

std::string Capitalize(absl::string_view s) {
  std::u32string cps = ToCodePoints(s);
  for (size_t i = 0; i < cps.size(); ++i) {
    cps[i] = static_cast<char32_t>(i == 0 ? utf8proc_totitle(cps[i])
                                          : utf8proc_tolower(cps[i]));
  }
  return FromCodePoints(cps);
}

absl::StatusOr<std::string> StripChars(absl::string_view s, const Value& chars,
                                       char which) {
  const std::u32string cps = ToCodePoints(s);
  std::u32string set;
  const bool space = chars.is_undefined() || chars.is_none();
  if (!space) {
    if (!chars.is_string()) {
      return absl::InvalidArgumentError("strip arg must be None or str");
    }
    set = ToCodePoints(chars.as_string());
  }
  auto strip = [&](char32_t c) {
    return space ? IsPySpace(c) : set.find(c) != std::u32string::npos;
  };
  size_t lo = 0, hi = cps.size();
  if (which != 'r') {
    while (lo < hi && strip(cps[lo])) ++lo;
  }
  if (which != 'l') {
    while (hi > lo && strip(cps[hi - 1])) --hi;
  }
  return FromCodePoints(cps.substr(lo, hi - lo));
}

absl::StatusOr<std::string> Replace(absl::string_view s, absl::string_view from,
                                    absl::string_view to, int64_t count) {
  // How many replacements, then whether the result stays in bounds.
  uint64_t n = 0;
  if (from.empty()) {
    n = CodePointCount(s) + 1;
  } else {
    for (size_t p = s.find(from); p != absl::string_view::npos;
         p = s.find(from, p + from.size())) {
      ++n;
    }
  }
  if (count >= 0) n = std::min<uint64_t>(n, static_cast<uint64_t>(count));
  if (to.size() > from.size() &&
      s.size() + n * (to.size() - from.size()) > kMaxStringBytes) {
    return absl::ResourceExhaustedError(
        "replace: the result would pass the string limit");
  }
  std::string out;
  if (from.empty()) {
    // Python inserts `to` before every character and at the end.
    const std::u32string cps = ToCodePoints(s);
    uint64_t done = 0;
    for (char32_t c : cps) {
      if (done < n) {
        absl::StrAppend(&out, to);
        ++done;
      }
      out += FromCodePoints(std::u32string(1, c));
    }
    if (done < n) absl::StrAppend(&out, to);
    return out;
  }
  size_t pos = 0;
  for (uint64_t done = 0; done < n; ++done) {
    const size_t hit = s.find(from, pos);
    absl::StrAppend(&out, s.substr(pos, hit - pos), to);
    pos = hit + from.size();
  }
  absl::StrAppend(&out, s.substr(pos));
  return out;
}

namespace {
bool IsLineBreak(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C ||
         (c >= 0x1C && c <= 0x1E) || c == 0x85 || c == 0x2028 || c == 0x2029;
}
}  // namespace

std::vector<std::string> SplitLines(absl::string_view s) {
  const std::u32string cps = ToCodePoints(s);
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (!IsLineBreak(cps[i])) continue;
    out.push_back(FromCodePoints(cps.substr(start, i - start)));
    if (cps[i] == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
    start = i + 1;
  }
  if (start < cps.size()) out.push_back(FromCodePoints(cps.substr(start)));
  return out;
}

namespace {

std::vector<Value> Strings(const std::vector<std::string>& parts) {
  std::vector<Value> out;
  out.reserve(parts.size());
  for (const std::string& p : parts) out.push_back(Value::String(p));
  return out;
}

// str.split / str.rsplit.
absl::StatusOr<Value> Split(absl::string_view s, const Value& sep_v,
                            const Value& max_v, bool right) {
  int64_t max = -1;
  if (!max_v.is_undefined()) {
    if (max_v.type() != Value::Type::kInt) {
      return absl::InvalidArgumentError("split(): maxsplit must be an integer");
    }
    max = max_v.as_int();
  }
  std::vector<std::string> parts;
  if (sep_v.is_undefined() || sep_v.is_none()) {
    // Runs of whitespace; no empty strings.
    std::u32string cps = ToCodePoints(s);
    if (right) std::reverse(cps.begin(), cps.end());
    size_t i = 0;
    int64_t splits = 0;
    while (i < cps.size()) {
      while (i < cps.size() && IsPySpace(cps[i])) ++i;
      if (i == cps.size()) break;
      if (max >= 0 && splits == max) {
        // The rest as it stands (Python keeps its far end's whitespace).
        parts.push_back(FromCodePoints(cps.substr(i)));
        break;
      }
      size_t j = i;
      while (j < cps.size() && !IsPySpace(cps[j])) ++j;
      parts.push_back(FromCodePoints(cps.substr(i, j - i)));
      ++splits;
      i = j;
    }
    if (right) {
      for (std::string& p : parts) {
        std::u32string r = ToCodePoints(p);
        std::reverse(r.begin(), r.end());
        p = FromCodePoints(r);
      }
      std::reverse(parts.begin(), parts.end());
    }
    return Value::List(Strings(parts));
  }
  if (!sep_v.is_string()) {
    return absl::InvalidArgumentError("split(): sep must be a string or None");
  }
  const std::string& sep = sep_v.as_string();
  if (sep.empty()) return absl::InvalidArgumentError("empty separator");
  if (!right) {
    size_t pos = 0;
    int64_t n = 0;
    for (;;) {
      const size_t hit =
          (max >= 0 && n == max) ? absl::string_view::npos : s.find(sep, pos);
      if (hit == absl::string_view::npos) {
        parts.emplace_back(s.substr(pos));
        break;
      }
      parts.emplace_back(s.substr(pos, hit - pos));
      pos = hit + sep.size();
      ++n;
    }
  } else {
    size_t end = s.size();
    int64_t n = 0;
    for (;;) {
      size_t hit = absl::string_view::npos;
      if (!(max >= 0 && n == max) && end >= sep.size()) {
        hit = s.substr(0, end).rfind(sep);
      }
      if (hit == absl::string_view::npos) {
        parts.emplace_back(s.substr(0, end));
        break;
      }
      parts.emplace_back(s.substr(hit + sep.size(), end - hit - sep.size()));
      end = hit;
      ++n;
    }
    std::reverse(parts.begin(), parts.end());
  }
  return Value::List(Strings(parts));
}

// startswith / endswith: a string or a tuple of strings.
absl::StatusOr<bool> AffixMatch(absl::string_view s, const Value& affix,
                                bool prefix) {
  auto one = [&](const Value& a) -> absl::StatusOr<bool> {
    if (!a.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix ? "startswith" : "endswith",
          " first arg must be str or a tuple of str, not ", a.TypeName()));
    }
    const std::string& x = a.as_string();
    return prefix ? s.substr(0, x.size()) == x
                  : s.size() >= x.size() && s.substr(s.size() - x.size()) == x;
  };
  if (affix.is_list()) {
    for (const Value& a : affix.as_list()) {
      auto m = one(a);
      if (!m.ok() || *m) return m;
    }
    return false;
  }
  return one(affix);
}

using StrFn = absl::StatusOr<Value> (*)(absl::string_view s,
                                        const std::vector<Value>& a);

struct StrMethodDef {
  const char* name;
  std::vector<absl::string_view> params;
  StrFn fn;
};

bool AllChars(absl::string_view s, bool (*pred)(char32_t)) {
  const std::u32string cps = ToCodePoints(s);
  if (cps.empty()) return false;
  for (char32_t c : cps) {
    if (!pred(c)) return false;
  }
  return true;
}

int32_t Category(char32_t c) { return utf8proc_category(c); }

const std::vector<StrMethodDef>& StrMethods() {
  static const auto* defs = new std::vector<StrMethodDef>{
      {"startswith",
       {"prefix"},
       [](absl::string_view s,
          const std::vector<Value>& a) -> absl::StatusOr<Value> {
         auto m = AffixMatch(s, a[0], true);
         if (!m.ok()) return m.status();
         return Value::Bool(*m);
       }},
      {"endswith",
       {"suffix"},
       [](absl::string_view s,
          const std::vector<Value>& a) -> absl::StatusOr<Value> {
         auto m = AffixMatch(s, a[0], false);
         if (!m.ok()) return m.status();
         return Value::Bool(*m);
       }},
      {"strip",
       {"chars"},
       [](absl::string_view s,
          const std::vector<Value>& a) -> absl::StatusOr<Value> {
         auto r = StripChars(s, a[0], 'b');
         if (!r.ok()) return r.status();
         return Value::String(*r);
       }},
      {"lstrip",
       {"chars"},
       [](absl::string_view s,
          const std::vector<Value>& a) -> absl::StatusOr<Value> {
         auto r = StripChars(s, a[0], 'l');
         if (!r.ok()) return r.status();
         return Value::String(*r);
       }},
      {"rstrip",
       {"chars"},
       [](absl::string_view s,
          const std::vector<Value>& a) -> absl::StatusOr<Value> {
         auto r = StripChars(s, a[0], 'r');
         if (!r.ok()) return r.status();
         return Value::String(*r);
       }},
      {"split",
       {"sep", "maxsplit"},
       [](absl::string_view s, const std::vector<Value>& a) {
         return Split(s, a[0], a[1], false);
       }},
      {"rsplit",
       {"sep", "maxsplit"},
       [](absl::string_view s, const std::vector<Value>& a) {
         return Split(s, a[0], a[1], true);
       }},
      {"splitlines",
       {},
       [](absl::string_view s,
          const std::vector<Value>&) -> absl::StatusOr<Value> {
         return Value::List(Strings(SplitLines(s)));
       }},
      {"upper",
       {},
       [](absl::string_view s, const std::vector<Value>&)
           -> absl::StatusOr<Value> { return Value::String(Upper(s)); }},
      {"lower",
       {},
       [](absl::string_view s, const std::vector<Value>&)
           -> absl::StatusOr<Value> { return Value::String(Lower(s)); }},
      {"capitalize",
       {},
       [](absl::string_view s, const std::vector<Value>&)
           -> absl::StatusOr<Value> { return Value::String(Capitalize(s)); }},
      {"replace",
       {"old", "new", "count"},
       [](absl::string_view s,
          const std::vector<Value>& a) -> absl::StatusOr<Value> {
         if (!a[0].is_string() || !a[1].is_string()) {
           return absl::InvalidArgumentError("replace() takes two strings");
         }
         int64_t count = -1;
         if (!a[2].is_undefined()) {
           if (a[2].type() != Value::Type::kInt) {
             return absl::InvalidArgumentError(
                 "replace(): count must be an integer");
           }
           count = a[2].as_int();
         }
         auto r = Replace(s, a[0].as_string(), a[1].as_string(), count);
         if (!r.ok()) return r.status();
         return Value::String(std::move(*r));
       }},
      {"find",
       {"sub"},
       [](absl::string_view s,
          const std::vector<Value>& a) -> absl::StatusOr<Value> {
         if (!a[0].is_string())
           return absl::InvalidArgumentError("find() takes a string");
         const size_t hit = s.find(a[0].as_string());
         if (hit == absl::string_view::npos) return Value::Int(-1);
         return Value::Int(
             static_cast<int64_t>(CodePointCount(s.substr(0, hit))));
       }},
      {"rfind",
       {"sub"},
       [](absl::string_view s,
          const std::vector<Value>& a) -> absl::StatusOr<Value> {
         if (!a[0].is_string())
           return absl::InvalidArgumentError("rfind() takes a string");
         const size_t hit = s.rfind(a[0].as_string());
         if (hit == absl::string_view::npos) return Value::Int(-1);
         return Value::Int(
             static_cast<int64_t>(CodePointCount(s.substr(0, hit))));
       }},
      {"count",
       {"sub"},
       [](absl::string_view s,
          const std::vector<Value>& a) -> absl::StatusOr<Value> {
         if (!a[0].is_string())
           return absl::InvalidArgumentError("count() takes a string");
         const std::string& sub = a[0].as_string();
         if (sub.empty())
           return Value::Int(static_cast<int64_t>(CodePointCount(s) + 1));
         int64_t n = 0;
         for (size_t p = s.find(sub); p != absl::string_view::npos;
              p = s.find(sub, p + sub.size())) {
           ++n;
         }
         return Value::Int(n);
       }},
      {"join",
       {"iterable"},
       [](absl::string_view s,
          const std::vector<Value>& a) -> absl::StatusOr<Value> {
         auto items = Iterate(a[0]);
         if (!items.ok()) return items.status();
         std::string out;
         for (size_t i = 0; i < items->size(); ++i) {
           if (!(*items)[i].is_string()) {
             return absl::InvalidArgumentError(
                 absl::StrCat("sequence item ", i, ": expected str instance, ",
                              (*items)[i].TypeName(), " found"));
           }
           if (i) absl::StrAppend(&out, s);
           out += (*items)[i].as_string();
         }
         return Value::String(std::move(out));
       }},
      {"removeprefix",
       {"prefix"},
       [](absl::string_view s,
          const std::vector<Value>& a) -> absl::StatusOr<Value> {
         if (!a[0].is_string())
           return absl::InvalidArgumentError("removeprefix() takes a string");
         const std::string& p = a[0].as_string();
         return Value::String(
             std::string(s.substr(0, p.size()) == p ? s.substr(p.size()) : s));
       }},
      {"removesuffix",
       {"suffix"},
       [](absl::string_view s,
          const std::vector<Value>& a) -> absl::StatusOr<Value> {
         if (!a[0].is_string())
           return absl::InvalidArgumentError("removesuffix() takes a string");
         const std::string& p = a[0].as_string();
         const bool has = !p.empty() && s.size() >= p.size() &&
                          s.substr(s.size() - p.size()) == p;
         return Value::String(
             std::string(has ? s.substr(0, s.size() - p.size()) : s));
       }},
      {"isdigit",
       {},
       [](absl::string_view s,
          const std::vector<Value>&) -> absl::StatusOr<Value> {
         return Value::Bool(AllChars(s, [](char32_t c) {
           return Category(c) == UTF8PROC_CATEGORY_ND;
         }));
       }},
      {"isalpha",
       {},
       [](absl::string_view s,
          const std::vector<Value>&) -> absl::StatusOr<Value> {
         return Value::Bool(AllChars(s, [](char32_t c) {
           const int32_t k = Category(c);
           return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
         }));
       }},
      {"isspace",
       {},
       [](absl::string_view s,
          const std::vector<Value>&) -> absl::StatusOr<Value> {
         return Value::Bool(AllChars(s, IsPySpace));
       }},
  };
  return *defs;
}

}  // namespace

absl::StatusOr<Value> StringMethod(const Value& s, const std::string& name) {
  for (const StrMethodDef& def : StrMethods()) {
    if (name != def.name) continue;
    return Value::Callable(
        name,
        [s, &def](Renderer&, const CallArgs& args) -> absl::StatusOr<Value> {
          auto bound = BindArgs(def.name, args, def.params);
          if (!bound.ok()) return bound.status();
          if (!def.params.empty() && (*bound)[0].is_undefined() &&
              absl::string_view(def.name) != "strip" &&
              absl::string_view(def.name) != "lstrip" &&
              absl::string_view(def.name) != "rstrip" &&
              absl::string_view(def.name) != "split" &&
              absl::string_view(def.name) != "rsplit") {
            return absl::InvalidArgumentError(
                absl::StrCat(def.name, "() takes at least 1 argument"));
          }
          return def.fn(s.as_string(), *bound);
        });
  }
  if (name == "format") {
    return Value::Callable(
        name, [](Renderer&, const CallArgs&) -> absl::StatusOr<Value> {
          return absl::InvalidArgumentError("str.format() is not supported");
        });
  }
  return Value::Undefined(name);
}

}  // namespace linattn::jinja
