// Reading tokenizer.json with every error naming the JSON path it is about:
// INVALID_ARGUMENT "tokenizer.json: pre_tokenizer.pretokenizers[2].type:
// 'Foo' is not supported".
#ifndef LINATTN_CORE_MODEL_TOKENIZER_JSON_JSON_FIELD_H_
#define LINATTN_CORE_MODEL_TOKENIZER_JSON_JSON_FIELD_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace linattn::tokenizer_json {

using json = nlohmann::json;

// A value inside the file and its path ("model.merges[3]").
class JsonField {
 public:
  JsonField(const json& value, std::string path, std::string file)
      : value_(&value), path_(std::move(path)), file_(std::move(file)) {}

  const json& value() const { return *value_; }
  const std::string& path() const { return path_; }
  bool is_null() const { return value_->is_null(); }
  // "tokenizer.json: model.merges[3]", as errors begin.
  std::string where() const { return absl::StrCat(file_, ": ", path_); }

  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(
        file_, ": ", path_.empty() ? "(top level)" : path_, ": ", what));
  }
  absl::Status Unsupported(absl::string_view thing) const {
    return Error(absl::StrCat("'", thing, "' is not supported"));
  }

  // A member (null, or absent, reads as a null field).
  JsonField operator[](const char* key) const {
    static const json kNull;
    const std::string path =
        path_.empty() ? key : absl::StrCat(path_, ".", key);
    if (!value_->is_object()) return JsonField(kNull, path, file_);
    auto it = value_->find(key);
    return JsonField(it == value_->end() ? kNull : *it, path, file_);
  }
  JsonField at(size_t i) const {
    return JsonField((*value_)[i], absl::StrCat(path_, "[", i, "]"), file_);
  }
  bool has(const char* key) const {
    return value_->is_object() && value_->contains(key);
  }

  absl::Status ExpectObject() const {
    return value_->is_object() ? absl::OkStatus() : Error("must be an object");
  }
  absl::StatusOr<size_t> ArraySize() const {
    if (!value_->is_array()) return Error("must be an array");
    return value_->size();
  }
  absl::StatusOr<std::string> String() const {
    if (!value_->is_string()) return Error("must be a string");
    return value_->get<std::string>();
  }
  // A string when present, `fallback` when null or absent.
  absl::StatusOr<std::optional<std::string>> OptionalString() const {
    if (value_->is_null()) return std::optional<std::string>();
    if (!value_->is_string()) return Error("must be a string or null");
    return std::optional<std::string>(value_->get<std::string>());
  }
  absl::StatusOr<bool> Bool(std::optional<bool> fallback) const {
    if (value_->is_null() && fallback) return *fallback;
    if (!value_->is_boolean()) return Error("must be true or false");
    return value_->get<bool>();
  }
  absl::StatusOr<int64_t> Int(std::optional<int64_t> fallback, int64_t lo,
                              int64_t hi) const {
    if (value_->is_null() && fallback) return *fallback;
    if (!value_->is_number_integer()) return Error("must be an integer");
    const int64_t v = value_->is_number_unsigned()
                          ? static_cast<int64_t>(std::min<uint64_t>(
                                value_->get<uint64_t>(), INT64_MAX))
                          : value_->get<int64_t>();
    if (v < lo || v > hi) {
      return Error(absl::StrCat(v, " is outside [", lo, ", ", hi, "]"));
    }
    return v;
  }
  absl::StatusOr<double> Number() const {
    if (!value_->is_number()) return Error("must be a number");
    return value_->get<double>();
  }
  // The single character a field such as Metaspace's replacement holds.
  absl::StatusOr<std::string> Char() const;
  // The "type" member, checked to be a string.
  absl::StatusOr<std::string> Type() const { return (*this)["type"].String(); }

 private:
  const json* value_;
  std::string path_;
  std::string file_;
};

}  // namespace linattn::tokenizer_json

#endif  // LINATTN_CORE_MODEL_TOKENIZER_JSON_JSON_FIELD_H_
