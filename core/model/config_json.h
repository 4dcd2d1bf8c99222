// Reading config.json's fields: each read names its field in the error
// (INVALID_ARGUMENT "config.json: <field>: …"), a present JSON null counts
// as absent, and every size is bounded before anything is made of it. The
// common fields and each model type's (core/model/model_types.h) are read
// with these.
#ifndef LINATTN_CORE_MODEL_CONFIG_JSON_H_
#define LINATTN_CORE_MODEL_CONFIG_JSON_H_

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace linattn {

using json = nlohmann::json;

// The largest width of any model dimension linattn takes.
inline constexpr uint32_t kMaxModelDim = 1u << 20;

absl::Status ConfigFieldError(absl::string_view field, absl::string_view what);

// An optional field of type T (bool, std::string, an integer or a number).
template <typename T>
absl::StatusOr<std::optional<T>> Optional(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return std::optional<T>();
  try {
    if constexpr (std::is_same_v<T, bool>) {
      if (!it->is_boolean())
        return ConfigFieldError(field, "must be true or false");
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!it->is_string()) return ConfigFieldError(field, "must be a string");
    } else if constexpr (std::is_integral_v<T>) {
      if (!it->is_number_integer()) {
        return ConfigFieldError(field, "must be an integer");
      }
    } else {
      if (!it->is_number()) return ConfigFieldError(field, "must be a number");
    }
    return std::optional<T>(it->get<T>());
  } catch (const json::exception& e) {
    return ConfigFieldError(field, e.what());
  }
}

// *out = the field when present.
template <typename T>
absl::Status Value(const json& j, const char* field, T* out) {
  auto v = Optional<T>(j, field);
  if (!v.ok()) return v.status();
  if (v->has_value()) *out = **v;
  return absl::OkStatus();
}

// A dimension in [1, kMaxModelDim]; `fallback` when absent (required
// without one).
absl::Status Dim(const json& j, const char* field, uint32_t* out,
                 std::optional<uint32_t> fallback = std::nullopt);
absl::Status Bool(const json& j, const char* field, bool* out, bool fallback);
// A number, or Infinity/-Infinity as Python writes them (NaN is refused).
absl::StatusOr<double> Number(const json& v, absl::string_view field);
// hidden × ratio as fla's int(hidden·ratio): a whole number in range.
absl::Status Expand(const json& j, const char* field, double fallback,
                    uint32_t hidden, uint32_t* out);
// `part` divides `whole` (named `what` in the error).
absl::Status Divides(const char* field, uint32_t whole, uint32_t part,
                     absl::string_view what);
// elementwise_affine as fla's norms read it (`if elementwise_affine:`): a
// present null means no weight.
absl::Status Affine(const json& j, bool* out);

// Python's json module writes float("inf") as the bare word Infinity (and
// -Infinity, NaN), which is not JSON: outside strings each such word
// becomes the string "Infinity", "-Infinity" or "NaN", which Number() reads
// back.
std::string QuoteNonFiniteWords(absl::string_view text);

}  // namespace linattn

#endif  // LINATTN_CORE_MODEL_CONFIG_JSON_H_
