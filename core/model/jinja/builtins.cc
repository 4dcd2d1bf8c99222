// Lookup, globals, tests and the methods of str, dict and list (filters
// are in filters.cc).
#include "core/model/jinja/builtins.h"

#include <cmath>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "core/model/jinja/str_methods.h"
#include "core/model/jinja/text.h"

namespace linattn::jinja {

absl::Status UndefinedError(const Value& undefined) {
  return absl::InvalidArgumentError(
      undefined.name().empty()
          ? std::string("a value is undefined")
          : absl::StrCat("'", undefined.name(), "' is undefined"));
}

absl::StatusOr<std::vector<Value>> BindArgs(
    absl::string_view what, const CallArgs& args,
    const std::vector<absl::string_view>& names) {
  if (args.positional.size() > names.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, "() takes at most ", names.size(), " arguments (",
                     args.positional.size(), " given)"));
  }
  std::vector<Value> out(names.size());
  for (size_t i = 0; i < args.positional.size(); ++i) {
    out[i] = args.positional[i];
  }
  for (const auto& [key, value] : args.keyword) {
    size_t i = 0;
    while (i < names.size() && names[i] != key) ++i;
    if (i == names.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, "() got an unexpected keyword argument '", key, "'"));
    }
    if (i < args.positional.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, "() got multiple values for argument '", key, "'"));
    }
    out[i] = value;
  }
  return out;
}

namespace {

Value Method(std::string name, Function f) {
  return Value::Callable(std::move(name), std::move(f));
}

absl::StatusOr<Value> DictMethod(const Value& d, const std::string& name) {
  if (name == "items" || name == "keys" || name == "values") {
    return Method(
        name,
        [d, name](Renderer&, const CallArgs& args) -> absl::StatusOr<Value> {
          if (!args.positional.empty() || !args.keyword.empty()) {
            return absl::InvalidArgumentError(
                absl::StrCat(name, "() takes no arguments"));
          }
          std::vector<Value> out;
          for (const auto& [k, v] : d.as_dict().items()) {
            if (name == "items") {
              out.push_back(Value::List({Value::String(k), v}, /*tuple=*/true));
            } else {
              out.push_back(name == "keys" ? Value::String(k) : v);
            }
          }
          return Value::List(std::move(out));
        });
  }
  if (name == "get") {
    return Method(
        name, [d](Renderer&, const CallArgs& args) -> absl::StatusOr<Value> {
          auto bound = BindArgs("get", args, {"key", "default"});
          if (!bound.ok()) return bound.status();
          const Value& key = (*bound)[0];
          const Value fallback =
              (*bound)[1].is_undefined() ? Value::None() : (*bound)[1];
          if (!key.is_string()) return fallback;
          const Value* found = d.as_dict().Find(key.as_string());
          return found ? *found : fallback;
        });
  }
  return Value::Undefined(name);
}

absl::StatusOr<Value> ListMethod(const Value& l, const std::string& name) {
  if (name == "count" || name == "index") {
    return Method(
        name,
        [l, name](Renderer&, const CallArgs& args) -> absl::StatusOr<Value> {
          auto bound = BindArgs(name, args, {"value"});
          if (!bound.ok()) return bound.status();
          int64_t n = 0;
          const auto& items = l.as_list();
          for (size_t i = 0; i < items.size(); ++i) {
            if (items[i] == (*bound)[0]) {
              if (name == "index") return Value::Int(static_cast<int64_t>(i));
              ++n;
            }
          }
          if (name == "index") {
            return absl::InvalidArgumentError(
                absl::StrCat((*bound)[0].Repr(), " is not in list"));
          }
          return Value::Int(n);
        });
  }
  return Value::Undefined(name);
}

}  // namespace

absl::StatusOr<Value> GetAttr(const Value& value, const std::string& name) {
  switch (value.type()) {
    case Value::Type::kUndefined:
      return UndefinedError(value);
    case Value::Type::kDict: {
      auto method = DictMethod(value, name);
      if (!method.ok() || !method->is_undefined()) return method;
      const Value* found = value.as_dict().Find(name);
      return found ? *found : Value::Undefined(name);
    }
    case Value::Type::kNamespace: {
      const Value* found = value.as_dict().Find(name);
      return found ? *found : Value::Undefined(name);
    }
    case Value::Type::kString:
      return StringMethod(value, name);
    case Value::Type::kList:
      return ListMethod(value, name);
    default:
      return Value::Undefined(name);
  }
}

namespace {

// A Python index into a sequence of n, negative from the end; -1 when out
// of range.
int64_t Index(int64_t i, size_t n) {
  if (i < 0) i += static_cast<int64_t>(n);
  return i < 0 || i >= static_cast<int64_t>(n) ? -1 : i;
}

}  // namespace

absl::StatusOr<Value> GetItem(const Value& value, const Value& key) {
  switch (value.type()) {
    case Value::Type::kUndefined:
      return UndefinedError(value);
    case Value::Type::kDict:
    case Value::Type::kNamespace:
      if (key.is_string()) {
        const Value* found = value.as_dict().Find(key.as_string());
        if (found) return *found;
        if (value.is_dict()) return DictMethod(value, key.as_string());
      }
      return Value::Undefined(key.Str());
    case Value::Type::kList:
      if (key.type() == Value::Type::kInt || key.type() == Value::Type::kBool) {
        const int64_t i = Index(key.as_int(), value.as_list().size());
        if (i >= 0) return value.as_list()[i];
        return Value::Undefined(key.Str());
      }
      break;
    case Value::Type::kString:
      if (key.type() == Value::Type::kInt || key.type() == Value::Type::kBool) {
        const std::u32string cps = ToCodePoints(value.as_string());
        const int64_t i = Index(key.as_int(), cps.size());
        if (i >= 0) return Value::String(FromCodePoints(cps.substr(i, 1)));
        return Value::Undefined(key.Str());
      }
      break;
    default:
      break;
  }
  if (key.is_string()) return GetAttr(value, key.as_string());
  return Value::Undefined(key.Str());
}

absl::StatusOr<Value> Slice(const Value& value, const Value& start,
                            const Value& stop, const Value& step) {
  auto as_index = [](const Value& v, const char* what,
                     int64_t* out) -> absl::Status {
    if (v.is_undefined() || v.is_none()) return absl::OkStatus();
    if (v.type() != Value::Type::kInt && v.type() != Value::Type::kBool) {
      return absl::InvalidArgumentError(
          absl::StrCat("slice ", what, " must be an integer or None"));
    }
    *out = v.as_int();
    return absl::OkStatus();
  };
  int64_t st = 1;
  if (absl::Status s = as_index(step, "step", &st); !s.ok()) return s;
  if (st == 0) return absl::InvalidArgumentError("slice step cannot be zero");
  const bool is_string = value.is_string();
  if (!is_string && !value.is_list()) {
    if (value.is_undefined()) return UndefinedError(value);
    return absl::InvalidArgumentError(
        absl::StrCat("'", value.TypeName(), "' object is not subscriptable"));
  }
  const std::u32string cps =
      is_string ? ToCodePoints(value.as_string()) : std::u32string();
  const int64_t n =
      static_cast<int64_t>(is_string ? cps.size() : value.as_list().size());
  // Python's slice.indices.
  int64_t lo = st > 0 ? 0 : n - 1, hi = st > 0 ? n : -1;
  auto clamp = [&](int64_t v, bool is_start) {
    if (v < 0) v += n;
    if (st > 0) return std::clamp<int64_t>(v, 0, n);
    (void)is_start;
    return std::clamp<int64_t>(v, -1, n - 1);
  };
  int64_t v = 0;
  if (!start.is_undefined() && !start.is_none()) {
    if (absl::Status s = as_index(start, "start", &v); !s.ok()) return s;
    lo = clamp(v, true);
  }
  if (!stop.is_undefined() && !stop.is_none()) {
    if (absl::Status s = as_index(stop, "stop", &v); !s.ok()) return s;
    hi = clamp(v, false);
  }
  // The count first (Python's slice length), so that no index overflows.
  int64_t count = 0;
  if (st > 0 && lo < hi) count = (hi - lo - 1) / st + 1;
  if (st < 0 && lo > hi) count = (lo - hi - 1) / (-st) + 1;
  std::u32string out_s;
  std::vector<Value> out_l;
  for (int64_t k = 0; k < count; ++k) {
    const int64_t i = lo + k * st;
    if (is_string) {
      out_s.push_back(cps[i]);
    } else {
      out_l.push_back(value.as_list()[i]);
    }
  }
  if (is_string) return Value::String(FromCodePoints(out_s));
  return Value::List(std::move(out_l), value.is_tuple());
}

absl::StatusOr<std::vector<Value>> Iterate(const Value& value) {
  switch (value.type()) {
    case Value::Type::kUndefined:
      return std::vector<Value>();
    case Value::Type::kList:
      return value.as_list();
    case Value::Type::kDict: {
      std::vector<Value> keys;
      for (const auto& [k, v] : value.as_dict().items()) {
        keys.push_back(Value::String(k));
      }
      return keys;
    }
    case Value::Type::kString: {
      std::vector<Value> chars;
      for (char32_t c : ToCodePoints(value.as_string())) {
        chars.push_back(Value::String(FromCodePoints(std::u32string(1, c))));
      }
      return chars;
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("'", value.TypeName(), "' object is not iterable"));
  }
}

namespace {

// The sandbox's limit on range() (jinja2.sandbox.MAX_RANGE).
constexpr int64_t kMaxRange = 100000;

absl::StatusOr<Value> Range(Renderer&, const CallArgs& args) {
  if (!args.keyword.empty() || args.positional.empty() ||
      args.positional.size() > 3) {
    return absl::InvalidArgumentError("range() takes 1 to 3 integer arguments");
  }
  int64_t v[3] = {0, 0, 1};
  for (size_t i = 0; i < args.positional.size(); ++i) {
    const Value& a = args.positional[i];
    if (a.type() != Value::Type::kInt && a.type() != Value::Type::kBool) {
      return absl::InvalidArgumentError(
          absl::StrCat("range(): '", a.TypeName(),
                       "' object cannot be interpreted as an "
                       "integer"));
    }
  }
  if (args.positional.size() == 1) {
    v[1] = args.positional[0].as_int();
  } else {
    v[0] = args.positional[0].as_int();
    v[1] = args.positional[1].as_int();
    if (args.positional.size() == 3) v[2] = args.positional[2].as_int();
  }
  if (v[2] == 0)
    return absl::InvalidArgumentError("range() arg 3 must not be zero");
  // Python's len(range(…)) in unsigned arithmetic (a difference of two
  // int64 fits in uint64), then that many items.
  const int64_t start = v[0], stop = v[1], step = v[2];
  uint64_t count = 0;
  if (step > 0 && start < stop) {
    const uint64_t span =
        static_cast<uint64_t>(stop) - static_cast<uint64_t>(start);
    count = (span - 1) / static_cast<uint64_t>(step) + 1;
  } else if (step < 0 && start > stop) {
    const uint64_t span =
        static_cast<uint64_t>(start) - static_cast<uint64_t>(stop);
    count = (span - 1) / (0 - static_cast<uint64_t>(step)) + 1;
  }
  if (count > static_cast<uint64_t>(kMaxRange)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Range too big. The sandbox blocks ranges larger than MAX_RANGE (",
        kMaxRange, ")."));
  }
  std::vector<Value> out;
  for (uint64_t k = 0; k < count; ++k) {
    out.push_back(Value::Int(static_cast<int64_t>(
        static_cast<uint64_t>(start) + k * static_cast<uint64_t>(step))));
  }
  return Value::List(std::move(out));
}

absl::StatusOr<Value> MakeDict(bool as_namespace, const CallArgs& args) {
  Dict d;
  if (args.positional.size() > 1) {
    return absl::InvalidArgumentError(
        "dict() and namespace() take at most one positional argument");
  }
  if (!args.positional.empty()) {
    const Value& init = args.positional[0];
    if (!init.is_dict()) {
      return absl::InvalidArgumentError(
          "dict() and namespace() take a mapping as their positional argument");
    }
    for (const auto& [k, v] : init.as_dict().items()) d.Set(k, v);
  }
  for (const auto& [k, v] : args.keyword) d.Set(k, v);
  return as_namespace ? Value::Namespace(std::move(d))
                      : Value::DictOf(std::move(d));
}

}  // namespace

Dict Globals() {
  Dict g;
  g.Set("range", Value::Callable("range", Range));
  g.Set("dict", Value::Callable("dict", [](Renderer&, const CallArgs& a) {
          return MakeDict(false, a);
        }));
  g.Set("namespace",
        Value::Callable("namespace", [](Renderer&, const CallArgs& a) {
          return MakeDict(true, a);
        }));
  g.Set("raise_exception",
        Value::Callable(
            "raise_exception",
            [](Renderer&, const CallArgs& a) -> absl::StatusOr<Value> {
              auto bound = BindArgs("raise_exception", a, {"message"});
              if (!bound.ok()) return bound.status();
              return absl::FailedPreconditionError((*bound)[0].Str());
            }));
  g.Set("strftime_now",
        Value::Callable(
            "strftime_now",
            [](Renderer&, const CallArgs& a) -> absl::StatusOr<Value> {
              auto bound = BindArgs("strftime_now", a, {"format"});
              if (!bound.ok()) return bound.status();
              if (!(*bound)[0].is_string()) {
                return absl::InvalidArgumentError(
                    "strftime_now() takes a format string");
              }
              const std::time_t now = std::time(nullptr);
              std::tm local;
              localtime_r(&now, &local);
              char buf[512];
              const size_t n = std::strftime(
                  buf, sizeof buf, (*bound)[0].as_string().c_str(), &local);
              return Value::String(std::string(buf, n));
            }));
  return g;
}

}  // namespace linattn::jinja
