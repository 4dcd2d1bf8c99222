// The values a chat template computes with, as Jinja (over Python) has
// them: undefined, None, booleans, integers, floats, strings, lists and
// tuples, dicts that keep insertion order, namespaces and callables.
//
// Lists and dicts are immutable once built (Hugging Face renders templates
// in Jinja's ImmutableSandboxedEnvironment), so values share them; a
// namespace is the one mutable object (`{% set ns.x = … %}`). Strings are
// UTF-8; where Python counts characters (length, indexing, slicing) these
// count code points.
#ifndef LINATTN_CORE_MODEL_JINJA_VALUE_H_
#define LINATTN_CORE_MODEL_JINJA_VALUE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace linattn::jinja {

class Value;
class Dict;
struct CallArgs;
class Renderer;

// A callable: a built-in global (range, namespace, raise_exception …), a
// bound method of a value, or a macro.
using Function =
    std::function<absl::StatusOr<Value>(Renderer&, const CallArgs&)>;

class Value {
 public:
  enum class Type {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,  // a list or (tuple()) a tuple
    kDict,
    kNamespace,
    kFunction,
  };

  Value() = default;  // undefined
  // An undefined value that remembers the name it stands for (errors
  // name it, as Jinja does).
  static Value Undefined(std::string name);
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double d);
  static Value String(std::string s);
  static Value List(std::vector<Value> items, bool tuple = false);
  static Value DictOf(Dict dict);
  static Value Namespace(Dict initial);
  static Value Callable(std::string name, Function f);
  // A JSON document (objects keep their order; integers that fit int64 are
  // ints, other numbers floats).
  static Value FromJson(const nlohmann::ordered_json& j);

  Type type() const { return type_; }
  bool is_undefined() const { return type_ == Type::kUndefined; }
  bool is_none() const { return type_ == Type::kNone; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_number() const {
    return type_ == Type::kInt || type_ == Type::kFloat || type_ == Type::kBool;
  }
  bool is_list() const { return type_ == Type::kList; }
  bool is_tuple() const { return type_ == Type::kList && tuple_; }
  bool is_dict() const { return type_ == Type::kDict; }
  bool is_namespace() const { return type_ == Type::kNamespace; }
  bool is_callable() const { return type_ == Type::kFunction; }

  bool as_bool() const { return int_ != 0; }
  int64_t as_int() const { return int_; }  // kInt and kBool
  double as_float() const {
    return type_ == Type::kFloat ? float_ : static_cast<double>(int_);
  }
  const std::string& as_string() const { return *string_; }
  const std::vector<Value>& as_list() const { return *list_; }
  const Dict& as_dict() const { return *dict_; }   // kDict and kNamespace
  Dict& namespace_dict() const { return *dict_; }  // kNamespace only
  const Function& as_function() const { return *function_; }
  // The name an undefined value stands for, or a callable's name.
  const std::string& name() const { return *string_; }

  // Python truth: empty strings, lists, dicts, 0, None and undefined are
  // false.
  bool Truthy() const;
  // str(): what `{{ value }}` prints.
  std::string Str() const;
  // repr(): how a value prints inside a list or dict.
  std::string Repr() const;
  // Python's type name, for error messages.
  const char* TypeName() const;
  // How many lists and dicts nest in this value (0 for a scalar).
  uint32_t depth() const { return depth_; }

  // ==, as Python compares (1 == 1.0 == True; lists and dicts by value).
  friend bool operator==(const Value& a, const Value& b);
  friend bool operator!=(const Value& a, const Value& b) { return !(a == b); }

 private:
  Type type_ = Type::kUndefined;
  bool tuple_ = false;
  uint32_t depth_ = 0;
  int64_t int_ = 0;
  double float_ = 0.0;
  std::shared_ptr<const std::string> string_;
  std::shared_ptr<const std::vector<Value>> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<const Function> function_;
};

// A dict: string keys in insertion order.
class Dict {
 public:
  void Set(const std::string& key, Value value);
  const Value* Find(absl::string_view key) const;
  const std::vector<std::pair<std::string, Value>>& items() const {
    return items_;
  }
  size_t size() const { return items_.size(); }

 private:
  std::vector<std::pair<std::string, Value>> items_;
  absl::flat_hash_map<std::string, size_t> index_;
};

// The most a list may hold, and a string that filters build (the
// renderer's output limit bounds the rest).
inline constexpr size_t kMaxListItems = 1'000'000;
inline constexpr size_t kMaxStringBytes = size_t{64} << 20;
// The deepest a value built by a template may nest (printing, comparing
// and freeing a value recurse per level).
inline constexpr uint32_t kMaxValueDepth = 256;

// Arguments of a call: positional, then keyword in the order written.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// Python's <, for sort and comparisons: numbers with numbers, strings with
// strings (code point order), lists and tuples element by element;
// INVALID_ARGUMENT for other pairs.
absl::StatusOr<bool> Less(const Value& a, const Value& b);

// Python's repr() of a float ('1.0', '1e+16', '0.0001', 'inf').
std::string FloatRepr(double d);

// json.dumps(value, ensure_ascii=…, indent=…, separators=…, sort_keys=…)
// as Python writes it; indent < 0 is None. INVALID_ARGUMENT for a value
// JSON cannot hold (undefined, a namespace, a callable).
struct JsonStyle {
  bool ensure_ascii = false;
  int indent = -1;
  std::string item_separator;  // empty: Python's default for the indent
  std::string key_separator;
  bool sort_keys = false;
};
absl::StatusOr<std::string> DumpJson(const Value& v, const JsonStyle& style);

// UTF-8 ⇄ code points (invalid bytes pass through as U+FFFD-free Latin-1
// code points so that slicing never fails; rendered text is what the
// template and its inputs held).
std::u32string ToCodePoints(absl::string_view s);
std::string FromCodePoints(const std::u32string& s);
size_t CodePointCount(absl::string_view s);

}  // namespace linattn::jinja

#endif  // LINATTN_CORE_MODEL_JINJA_VALUE_H_
