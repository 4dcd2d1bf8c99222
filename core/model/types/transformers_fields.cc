#include "core/model/types/transformers_fields.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/model/moe.h"
#include "core/util/status_macros.h"

namespace linattn {

absl::Status Multiplier(const json& j, const char* field, double fallback,
                        bool positive, double* out) {
  *out = fallback;
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (it->is_boolean()) return ConfigFieldError(field, "must be a number");
  LINATTN_ASSIGN_OR_RETURN(*out, Number(*it, field));
  // Applied in fp32 (folded into weights): finite there, and so is its
  // reciprocal for a divisor.
  const double most = std::numeric_limits<float>::max();
  if (!(std::fabs(*out) <= most) || (positive && !(*out >= 1 / most))) {
    return ConfigFieldError(
        field, positive ? "must be positive and within fp32's range (its "
                          "reciprocal too)"
                        : "must be finite within fp32's range");
  }
  return absl::OkStatus();
}

absl::Status Count(const json& j, const char* field, uint32_t fallback,
                   uint32_t* out) {
  auto v = Optional<int64_t>(j, field);
  if (!v.ok()) return v.status();
  const int64_t n = v->value_or(fallback);
  if (n < 0 || n > int64_t{kMaxModelDim}) {
    return ConfigFieldError(
        field, absl::StrCat("must be in [0, ", kMaxModelDim, "], got ", n));
  }
  *out = static_cast<uint32_t>(n);
  return absl::OkStatus();
}

absl::Status ReadExpertSizes(const json& j, const ExpertFields& f,
                             ModelConfig& c) {
  LINATTN_RETURN_IF_ERROR(Count(j, f.count, f.count_default, &c.num_experts));
  if (c.num_experts > kMaxExperts) {
    return ConfigFieldError(
        f.count,
        absl::StrCat("must be at most ", kMaxExperts, ", got ", c.num_experts));
  }
  if (c.num_experts == 0) return absl::OkStatus();
  if (auto s = Dim(j, f.size, &c.expert_size, f.size_default); !s.ok())
    return s;
  if (auto s = Dim(j, f.per_token, &c.experts_per_token, f.per_token_default);
      !s.ok())
    return s;
  if (c.experts_per_token > c.num_experts) {
    return ConfigFieldError(
        f.per_token,
        absl::StrCat("must be at most ", f.count, " = ", c.num_experts,
                     ", got ", c.experts_per_token));
  }
  return absl::OkStatus();
}

namespace {

// A fraction in (0, 1].
absl::Status Fraction(const json& j, const char* field, absl::string_view name,
                      double* out) {
  auto it = j.find(field);
  if (it == j.end()) return absl::OkStatus();
  // transformers' releases read a null differently (the whole head, or an
  // error): refused rather than guessed.
  if (it->is_null()) {
    return ConfigFieldError(name, "must be a number, not null");
  }
  auto v =
      it->is_boolean()
          ? absl::StatusOr<double>(ConfigFieldError(name, "must be a number"))
          : Number(*it, name);
  if (!v.ok()) return v.status();
  if (!(*v > 0 && *v <= 1)) {
    return ConfigFieldError(name, absl::StrCat("must be in (0, 1], got ", *v));
  }
  *out = *v;
  return absl::OkStatus();
}

}  // namespace

absl::Status ReadRope(const json& j, double* theta, double* factor) {
  LINATTN_RETURN_IF_ERROR(Multiplier(j, "rope_theta", *theta, true, theta));
  if (factor != nullptr) {
    LINATTN_RETURN_IF_ERROR(
        Fraction(j, "partial_rotary_factor", "partial_rotary_factor", factor));
  }
  for (const char* field : {"rope_scaling", "rope_parameters"}) {
    auto it = j.find(field);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_object()) {
      return ConfigFieldError(field, "must be null or a dictionary");
    }
    if (it->size() == 0) continue;
    for (const auto& [key, value] : it->items()) {
      if (value.is_object()) {
        return ConfigFieldError(
            absl::StrCat(field, ".", key),
            "rotary parameters per layer type are not supported");
      }
    }
    for (const char* kind : {"rope_type", "type"}) {
      auto k = it->find(kind);
      if (k != it->end() &&
          !(k->is_string() && k->get_ref<const std::string&>() == "default")) {
        return ConfigFieldError(
            absl::StrCat(field, ".", kind),
            absl::StrCat(k->dump(),
                         " is not supported (the default rotary only)"));
      }
    }
    if (auto t = it->find("rope_theta"); t != it->end() && !t->is_null()) {
      if (absl::Status s = Multiplier(*it, "rope_theta", *theta, true, theta);
          !s.ok()) {
        return ConfigFieldError(absl::StrCat(field, ".rope_theta"),
                                "must be positive and finite");
      }
    }
    if (factor != nullptr) {
      const std::string name = absl::StrCat(field, ".partial_rotary_factor");
      LINATTN_RETURN_IF_ERROR(
          Fraction(*it, "partial_rotary_factor", name, factor));
    }
    // transformers reads the first of the two that is given.
    break;
  }
  return absl::OkStatus();
}

ModelTypeDef::TensorNames TransformersTensorNames() {
  ModelTypeDef::TensorNames n;
  n.base = "model.";
  n.input_norm = "input_layernorm.weight";
  n.embeddings = {"model.embed_tokens.weight"};
  n.final_norm = "model.norm.weight";
  n.attention = "self_attn.";
  n.mlp_norm = "post_attention_layernorm.weight";
  return n;
}

absl::Status RefuseNulls(const json& j,
                         std::initializer_list<const char*> fields) {
  for (const char* field : fields) {
    if (auto it = j.find(field); it != j.end() && it->is_null()) {
      return ConfigFieldError(field, "must be given, not null");
    }
  }
  return absl::OkStatus();
}

absl::Status RefuseMultiTokenPrediction(const json& j) {
  for (const char* field : {"num_nextn_predict_layers", "mtp_layers"}) {
    if (auto it = j.find(field);
        it != j.end() && !it->is_null() && !(*it == 0)) {
      return ConfigFieldError(
          field, "multi-token-prediction layers are not supported");
    }
  }
  return absl::OkStatus();
}

}  // namespace linattn
