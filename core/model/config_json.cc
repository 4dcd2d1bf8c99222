#include "core/model/config_json.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace linattn {

absl::Status ConfigFieldError(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("config.json: ", field, ": ", what));
}

absl::Status Dim(const json& j, const char* field, uint32_t* out,
                 std::optional<uint32_t> fallback) {
  auto v = Optional<int64_t>(j, field);
  if (!v.ok()) return v.status();
  if (!v->has_value()) {
    if (!fallback) return ConfigFieldError(field, "required");
    *out = *fallback;
    return absl::OkStatus();
  }
  int64_t x = **v;
  if (x <= 0 || x > kMaxModelDim) {
    return ConfigFieldError(
        field, absl::StrCat("must be in [1, ", kMaxModelDim, "], got ", x));
  }
  *out = static_cast<uint32_t>(x);
  return absl::OkStatus();
}

absl::Status Bool(const json& j, const char* field, bool* out, bool fallback) {
  *out = fallback;
  return Value(j, field, out);
}

absl::StatusOr<double> Number(const json& v, absl::string_view field) {
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    const std::string& w = v.get_ref<const std::string&>();
    if (w == "Infinity") return std::numeric_limits<double>::infinity();
    if (w == "-Infinity") return -std::numeric_limits<double>::infinity();
  }
  return ConfigFieldError(field, "must be a number (or Infinity)");
}

absl::Status Expand(const json& j, const char* field, double fallback,
                    uint32_t hidden, uint32_t* out) {
  double ratio = fallback;
  if (auto s = Value(j, field, &ratio); !s.ok()) return s;
  if (!(ratio > 0) || !std::isfinite(ratio)) {
    return ConfigFieldError(field, "must be > 0");
  }
  const double dim = std::floor(hidden * ratio);
  if (dim < 1 || dim > kMaxModelDim) {
    return ConfigFieldError(field, absl::StrCat("hidden_size × ", field,
                                                " is out of range, got ", dim));
  }
  *out = static_cast<uint32_t>(dim);
  return absl::OkStatus();
}

absl::Status Divides(const char* field, uint32_t whole, uint32_t part,
                     absl::string_view what) {
  if (part == 0 || whole % part != 0) {
    return ConfigFieldError(
        field, absl::StrCat(what, " ", whole, " is not divisible by ", part));
  }
  return absl::OkStatus();
}

absl::Status Affine(const json& j, bool* out) {
  auto it = j.find("elementwise_affine");
  if (it != j.end() && it->is_null()) {
    *out = false;
    return absl::OkStatus();
  }
  return Bool(j, "elementwise_affine", out, true);
}

std::string QuoteNonFiniteWords(absl::string_view text) {
  std::string out;
  out.reserve(text.size() + 16);
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (in_string) {
      out.push_back(ch);
      if (ch == '\\' && i + 1 < text.size()) {
        out.push_back(text[++i]);
      } else if (ch == '"') {
        in_string = false;
      }
      continue;
    }
    if (ch == '"') in_string = true;
    bool replaced = false;
    for (absl::string_view word : {"-Infinity", "Infinity", "NaN"}) {
      if (text.substr(i, word.size()) == word) {
        absl::StrAppend(&out, "\"", word, "\"");
        i += word.size() - 1;
        replaced = true;
        break;
      }
    }
    if (!replaced) out.push_back(ch);
  }
  return out;
}

}  // namespace linattn
