// Jinja's filters over sequences (join, sort, select, map, sum …), as
// jinja2/filters.py defines them.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/model/jinja/builtins.h"
#include "core/model/jinja/filters_internal.h"
#include "core/model/jinja/str_methods.h"

namespace linattn::jinja::filters {

namespace {

// What sort, unique, min and max compare an item by: an attribute of it
// (if given), strings lower-cased unless case_sensitive.
absl::StatusOr<Value> SortKey(const Value& x, const Value& attribute,
                              bool case_sensitive) {
  Value k = x;
  if (!attribute.is_undefined() && !attribute.is_none()) {
    auto got = AttrPath(x, attribute);
    if (!got.ok()) return got;
    k = *got;
  }
  if (!case_sensitive && k.is_string()) k = Value::String(Lower(k.as_string()));
  return k;
}

// Python's stable sort of `items` by `keys` (one each).
absl::StatusOr<Value> SortedBy(std::vector<Value> items,
                               const std::vector<Value>& keys, bool reverse) {
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  absl::Status error;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    if (!error.ok()) return false;
    auto lt = reverse ? Less(keys[y], keys[x]) : Less(keys[x], keys[y]);
    if (!lt.ok()) error = lt.status();
    return lt.ok() && *lt;
  });
  if (!error.ok()) return error;
  std::vector<Value> out;
  out.reserve(items.size());
  for (size_t i : order) out.push_back(std::move(items[i]));
  return Value::List(std::move(out));
}

// select / reject / selectattr / rejectattr.
absl::StatusOr<Value> SelectOrReject(const Value& v, const Args& a,
                                     bool by_attr, bool keep) {
  auto items = Items(v);
  if (!items.ok()) return items.status();
  const Value& attr = a[0];
  const Value& test = by_attr ? a[1] : a[0];
  CallArgs test_args;
  for (size_t i = by_attr ? 2 : 1; i < a.size() && !a[i].is_undefined(); ++i) {
    test_args.positional.push_back(a[i]);
  }
  if (!test.is_undefined() &&
      (!test.is_string() || !IsTest(test.as_string()))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no test named ", test.Repr(), " (not supported in chat templates)"));
  }
  std::vector<Value> out;
  for (const Value& x : *items) {
    Value subject = x;
    if (by_attr) {
      auto got = AttrPath(x, attr);
      if (!got.ok()) return got.status();
      subject = *got;
    }
    bool pass;
    if (test.is_undefined()) {
      pass = subject.Truthy();
    } else {
      auto t = ApplyTest(test.as_string(), subject, test_args);
      if (!t.ok()) return t.status();
      pass = *t;
    }
    if (pass == keep) out.push_back(x);
  }
  return Value::List(std::move(out));
}

absl::StatusOr<Value> MinMax(const Value& v, const Args& a, bool max) {
  auto items = Items(v);
  if (!items.ok()) return items.status();
  if (items->empty()) return Value::Undefined(max ? "max" : "min");
  size_t best = 0;
  Value best_key;
  for (size_t i = 0; i < items->size(); ++i) {
    auto k = SortKey((*items)[i], a[1], a[0].Truthy());
    if (!k.ok()) return k;
    bool better = i == 0;
    if (!better) {
      auto b = max ? Less(best_key, *k) : Less(*k, best_key);
      if (!b.ok()) return b.status();
      better = *b;
    }
    if (better) {
      best = i;
      best_key = std::move(*k);
    }
  }
  return (*items)[best];
}

}  // namespace

absl::StatusOr<Value> Join(const Value& v, const Args& a) {
  auto items = Items(v);
  if (!items.ok()) return items.status();
  const std::string sep = a[0].is_undefined() ? "" : a[0].Str();
  std::string out;
  for (size_t i = 0; i < items->size(); ++i) {
    Value item = (*items)[i];
    if (!a[1].is_undefined()) {
      auto got = AttrPath(item, a[1]);
      if (!got.ok()) return got.status();
      item = *got;
    }
    if (i) out += sep;
    out += item.Str();
    if (out.size() > kMaxStringBytes) {
      return absl::ResourceExhaustedError("join: past the string limit");
    }
  }
  return Value::String(std::move(out));
}

absl::StatusOr<Value> First(const Value& v, const Args&) {
  auto items = Items(v);
  if (!items.ok()) return items.status();
  return items->empty() ? Value::Undefined("first") : items->front();
}

absl::StatusOr<Value> Last(const Value& v, const Args&) {
  auto items = Items(v);
  if (!items.ok()) return items.status();
  return items->empty() ? Value::Undefined("last") : items->back();
}

absl::StatusOr<Value> ListFilter(const Value& v, const Args&) {
  auto items = Items(v);
  if (!items.ok()) return items.status();
  return Value::List(std::move(*items));
}

absl::StatusOr<Value> Reverse(const Value& v, const Args&) {
  if (v.is_string()) {
    std::u32string cps = ToCodePoints(v.as_string());
    std::reverse(cps.begin(), cps.end());
    return Value::String(FromCodePoints(cps));
  }
  auto items = Items(v);
  if (!items.ok()) return items.status();
  std::reverse(items->begin(), items->end());
  return Value::List(std::move(*items));
}

absl::StatusOr<Value> ItemsFilter(const Value& v, const Args&) {
  if (v.is_undefined()) return Value::List({});
  if (!v.is_dict())
    return absl::InvalidArgumentError("items: can only be used on a mapping");
  std::vector<Value> out;
  for (const auto& [k, x] : v.as_dict().items()) {
    out.push_back(Value::List({Value::String(k), x}, true));
  }
  return Value::List(std::move(out));
}

absl::StatusOr<Value> DictSort(const Value& v, const Args& a) {
  if (!v.is_dict()) return TypeError("dictsort", v);
  const bool by_value = a[1].is_string() && a[1].as_string() == "value";
  std::vector<Value> pairs, keys;
  for (const auto& [k, x] : v.as_dict().items()) {
    pairs.push_back(Value::List({Value::String(k), x}, true));
    auto key = SortKey(by_value ? x : Value::String(k), Value(), a[0].Truthy());
    if (!key.ok()) return key;
    keys.push_back(std::move(*key));
  }
  return SortedBy(std::move(pairs), keys, a[2].Truthy());
}

absl::StatusOr<Value> Sort(const Value& v, const Args& a) {
  auto items = Items(v);
  if (!items.ok()) return items.status();
  std::vector<Value> keys;
  for (const Value& x : *items) {
    auto key = SortKey(x, a[2], a[1].Truthy());
    if (!key.ok()) return key;
    keys.push_back(std::move(*key));
  }
  return SortedBy(std::move(*items), keys, a[0].Truthy());
}

absl::StatusOr<Value> Unique(const Value& v, const Args& a) {
  auto items = Items(v);
  if (!items.ok()) return items.status();
  std::vector<Value> out, seen;
  for (const Value& x : *items) {
    auto k = SortKey(x, a[1], a[0].Truthy());
    if (!k.ok()) return k;
    if (std::find(seen.begin(), seen.end(), *k) != seen.end()) continue;
    seen.push_back(std::move(*k));
    out.push_back(x);
  }
  return Value::List(std::move(out));
}

absl::StatusOr<Value> Select(const Value& v, const Args& a) {
  return SelectOrReject(v, a, false, true);
}
absl::StatusOr<Value> Reject(const Value& v, const Args& a) {
  return SelectOrReject(v, a, false, false);
}
absl::StatusOr<Value> SelectAttr(const Value& v, const Args& a) {
  return SelectOrReject(v, a, true, true);
}
absl::StatusOr<Value> RejectAttr(const Value& v, const Args& a) {
  return SelectOrReject(v, a, true, false);
}

// sum / min / max over items (optionally an attribute of each).
absl::StatusOr<Value> Sum(const Value& v, const Args& a) {
  auto items = Items(v);
  if (!items.ok()) return items.status();
  Value total = Or(a[1], Value::Int(0));
  for (const Value& x : *items) {
    Value y = x;
    if (!a[0].is_undefined() && !a[0].is_none()) {
      auto got = AttrPath(x, a[0]);
      if (!got.ok()) return got.status();
      y = *got;
    }
    if (!total.is_number() || !y.is_number()) return TypeError("sum", y);
    if (total.type() == Value::Type::kFloat ||
        y.type() == Value::Type::kFloat) {
      total = Value::Float(total.as_float() + y.as_float());
    } else {
      int64_t r;
      if (__builtin_add_overflow(total.as_int(), y.as_int(), &r)) {
        return absl::InvalidArgumentError("sum: integer overflow");
      }
      total = Value::Int(r);
    }
  }
  return total;
}

absl::StatusOr<Value> Min(const Value& v, const Args& a) {
  return MinMax(v, a, false);
}
absl::StatusOr<Value> Max(const Value& v, const Args& a) {
  return MinMax(v, a, true);
}

absl::StatusOr<Value> Map(const Value& v, const Args& a) {
  auto items = Items(v);
  if (!items.ok()) return items.status();
  // map(attribute='x', default=…) or map('filter', args…).
  std::vector<Value> out;
  if (!a[1].is_undefined()) {
    for (const Value& x : *items) {
      auto got = AttrPath(x, a[1]);
      if (!got.ok()) return got.status();
      out.push_back(got->is_undefined() && !a[2].is_undefined() ? a[2] : *got);
    }
    return Value::List(std::move(out));
  }
  if (!a[0].is_string() || !IsFilter(a[0].as_string())) {
    return absl::InvalidArgumentError(
        absl::StrCat("map: no filter named ", a[0].Repr(),
                     " (not supported in chat templates)"));
  }
  CallArgs filter_args;
  for (size_t i = 3; i < a.size() && !a[i].is_undefined(); ++i) {
    filter_args.positional.push_back(a[i]);
  }
  for (const Value& x : *items) {
    auto y = ApplyFilter(a[0].as_string(), x, filter_args);
    if (!y.ok()) return y.status();
    out.push_back(std::move(*y));
  }
  return Value::List(std::move(out));
}

}  // namespace linattn::jinja::filters
