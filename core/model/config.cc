#include "core/model/config.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace linattn {
namespace {

using json = nlohmann::json;

constexpr uint32_t kMaxModelDim = 1u << 20;

absl::Status FieldError(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("config.json: ", field, ": ", what));
}

// Reads an optional field; a present JSON null counts as absent.
template <typename T>
absl::StatusOr<std::optional<T>> Optional(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return std::optional<T>();
  try {
    if constexpr (std::is_same_v<T, bool>) {
      if (!it->is_boolean()) return FieldError(field, "must be true or false");
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!it->is_string()) return FieldError(field, "must be a string");
    } else if constexpr (std::is_integral_v<T>) {
      if (!it->is_number_integer()) {
        return FieldError(field, "must be an integer");
      }
    } else {
      if (!it->is_number()) return FieldError(field, "must be a number");
    }
    return std::optional<T>(it->get<T>());
  } catch (const json::exception& e) {
    return FieldError(field, e.what());
  }
}

absl::Status Dim(const json& j, const char* field, uint32_t* out,
                 std::optional<uint32_t> fallback = std::nullopt) {
  auto v = Optional<int64_t>(j, field);
  if (!v.ok()) return v.status();
  if (!v->has_value()) {
    if (!fallback) return FieldError(field, "required");
    *out = *fallback;
    return absl::OkStatus();
  }
  int64_t x = **v;
  if (x <= 0 || x > kMaxModelDim) {
    return FieldError(
        field, absl::StrCat("must be in [1, ", kMaxModelDim, "], got ", x));
  }
  *out = static_cast<uint32_t>(x);
  return absl::OkStatus();
}

template <typename T>
absl::Status Value(const json& j, const char* field, T* out) {
  auto v = Optional<T>(j, field);
  if (!v.ok()) return v.status();
  if (v->has_value()) *out = **v;
  return absl::OkStatus();
}

}  // namespace

absl::string_view ModelFeatureMapName(ModelFeatureMap map) {
  switch (map) {
    case ModelFeatureMap::kElu:
      return "elu";
    case ModelFeatureMap::kRelu:
      return "relu";
    case ModelFeatureMap::kIdentity:
      return "identity";
    case ModelFeatureMap::kT2R:
      return "t2r";
    case ModelFeatureMap::kHedgehog:
      return "hedgehog";
    case ModelFeatureMap::kDpfp:
      return "dpfp";
    case ModelFeatureMap::kElementwiseProduct:
      return "elementwise_product";
  }
  return "?";
}

uint32_t ModelConfig::key_dim() const {
  return static_cast<uint32_t>(hidden_size * expand_k);
}
uint32_t ModelConfig::value_dim() const {
  return static_cast<uint32_t>(hidden_size * expand_v);
}

uint32_t ModelConfig::feature_dim() const {
  switch (feature_map) {
    case ModelFeatureMap::kHedgehog:
      return 2 * head_k_dim();
    case ModelFeatureMap::kDpfp:
      return 8 * head_k_dim();
    default:
      return head_k_dim();
  }
}

bool ModelConfig::features_nonnegative() const {
  return feature_map == ModelFeatureMap::kElu ||
         feature_map == ModelFeatureMap::kRelu ||
         feature_map == ModelFeatureMap::kT2R ||
         feature_map == ModelFeatureMap::kHedgehog;
}

bool ModelConfig::feature_map_has_weights() const {
  return feature_map == ModelFeatureMap::kT2R ||
         feature_map == ModelFeatureMap::kHedgehog ||
         feature_map == ModelFeatureMap::kElementwiseProduct;
}

absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text) {
  json j;
  try {
    j = json::parse(json_text.begin(), json_text.end());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: not valid JSON: ", e.what()));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError("config.json: must be a JSON object");
  }
  ModelConfig c;
  auto type = Optional<std::string>(j, "model_type");
  if (!type.ok()) return type.status();
  if (!type->has_value() || **type != "linear_attn") {
    return FieldError("model_type",
                      absl::StrCat("must be \"linear_attn\", got ",
                                   type->has_value() ? "\"" + **type + "\""
                                                     : std::string("nothing")));
  }
  c.model_type = **type;
  // fla's LinearAttentionConfig defaults, where it has them.
  if (auto s = Dim(j, "hidden_size", &c.hidden_size, 2048); !s.ok()) return s;
  if (auto s = Dim(j, "num_hidden_layers", &c.num_hidden_layers, 24); !s.ok())
    return s;
  if (auto s = Dim(j, "num_heads", &c.num_heads, 4); !s.ok()) return s;
  if (auto s = Dim(j, "num_kv_heads", &c.num_kv_heads, c.num_heads); !s.ok())
    return s;
  if (auto s = Dim(j, "vocab_size", &c.vocab_size, 32000); !s.ok()) return s;
  for (const char* field : {"expand_k", "expand_v"}) {
    double* out = field[7] == 'k' ? &c.expand_k : &c.expand_v;
    if (auto s = Value(j, field, out); !s.ok()) return s;
    if (!(*out > 0) || !std::isfinite(*out)) {
      return FieldError(field, "must be > 0");
    }
    double dim = c.hidden_size * *out;
    if (dim != std::floor(dim) || dim < 1 || dim > kMaxModelDim) {
      return FieldError(field,
                        absl::StrCat("hidden_size × ", field,
                                     " must be a whole number ≥ 1, got ", dim));
    }
  }
  auto fm = Optional<std::string>(j, "feature_map");
  if (!fm.ok()) return fm.status();
  std::string fm_name = fm->value_or("elementwise_product");
  bool known = false;
  for (ModelFeatureMap m : {ModelFeatureMap::kElu, ModelFeatureMap::kRelu,
                            ModelFeatureMap::kIdentity, ModelFeatureMap::kT2R,
                            ModelFeatureMap::kHedgehog, ModelFeatureMap::kDpfp,
                            ModelFeatureMap::kElementwiseProduct}) {
    if (ModelFeatureMapName(m) == fm_name) {
      c.feature_map = m;
      known = true;
    }
  }
  if (!known) {
    return FieldError(
        "feature_map",
        absl::StrCat("'", fm_name,
                     "' is not supported (elu, relu, identity, "
                     "t2r, hedgehog, dpfp, elementwise_product)"));
  }
  for (auto [field, out] : {std::pair<const char*, bool*>{
                                "tie_feature_map_qk", &c.tie_feature_map_qk},
                            {"norm_q", &c.norm_q},
                            {"norm_k", &c.norm_k},
                            {"norm_feature_map", &c.norm_feature_map},
                            {"elementwise_affine", &c.elementwise_affine},
                            {"tie_word_embeddings", &c.tie_word_embeddings}}) {
    if (auto s = Value(j, field, out); !s.ok()) return s;
  }
  auto act = Optional<std::string>(j, "hidden_act");
  if (!act.ok()) return act.status();
  std::string act_name = act->value_or("swish");
  if (act_name != "swish" && act_name != "silu") {
    return FieldError("hidden_act", absl::StrCat("'", act_name,
                                                 "' is not supported (swish)"));
  }
  double eps = 1e-6;
  if (auto s = Value(j, "norm_eps", &eps); !s.ok()) return s;
  if (!(eps > 0) || !std::isfinite(eps)) {
    return FieldError("norm_eps", "must be > 0");
  }
  c.norm_eps = static_cast<float>(eps);
  // fla's GatedMLP: intermediate = 256·⌈(hidden·ratio·2/3) / 256⌉.
  auto inter = Optional<int64_t>(j, "intermediate_size");
  if (!inter.ok()) return inter.status();
  if (inter->has_value()) {
    if (auto s = Dim(j, "intermediate_size", &c.intermediate_size); !s.ok())
      return s;
  } else {
    double ratio = 4;
    if (auto s = Value(j, "hidden_ratio", &ratio); !s.ok()) return s;
    if (!(ratio > 0) || !std::isfinite(ratio)) {
      return FieldError("hidden_ratio", "must be > 0");
    }
    // As fla: int(hidden·ratio·2/3), rounded up to a multiple of 256; in
    // double and range-checked before any conversion, so that a huge ratio
    // is refused rather than converted past int64's range.
    const double wanted = std::floor(c.hidden_size * ratio * 2 / 3);
    const double rounded = 256 * std::ceil(wanted / 256);
    if (!(rounded >= 1) || rounded > kMaxModelDim) {
      return FieldError("hidden_ratio",
                        "gives an intermediate size out of range");
    }
    c.intermediate_size = static_cast<uint32_t>(rounded);
  }
  for (auto [field, out] : {std::pair<const char*, std::optional<int64_t>*>{
                                "bos_token_id", &c.bos_token_id},
                            {"eos_token_id", &c.eos_token_id}}) {
    auto id = Optional<int64_t>(j, field);
    if (!id.ok()) return id.status();
    *out = *id;
    if (id->has_value() && (**id < 0 || **id >= c.vocab_size)) {
      return FieldError(field, absl::StrCat("must be in [0, vocab_size = ",
                                            c.vocab_size, "), got ", **id));
    }
  }
  if (auto attn = j.find("attn"); attn != j.end() && !attn->is_null()) {
    return FieldError("attn",
                      "hybrid models with softmax-attention layers are not "
                      "supported (linattn serves pure linear attention)");
  }
  if (auto res = j.find("attnres_block_size");
      res != j.end() && !res->is_null()) {
    return FieldError("attnres_block_size",
                      "block attention residuals are not supported (set it to "
                      "null)");
  }
  if (auto mode = Optional<std::string>(j, "attn_mode"); !mode.ok()) {
    return mode.status();
  } else if (mode->has_value() && **mode != "chunk" &&
             **mode != "fused_chunk" && **mode != "fused_recurrent") {
    return FieldError("attn_mode",
                      absl::StrCat("'", **mode,
                                   "' is not one of chunk, fused_chunk, "
                                   "fused_recurrent"));
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    return FieldError("num_kv_heads",
                      absl::StrCat("must divide num_heads = ", c.num_heads,
                                   ", got ", c.num_kv_heads));
  }
  if (c.key_dim() % c.num_heads != 0) {
    return FieldError("expand_k", absl::StrCat("key dim ", c.key_dim(),
                                               " must be divisible by "
                                               "num_heads = ",
                                               c.num_heads));
  }
  if (c.value_dim() % c.num_heads != 0) {
    return FieldError("expand_v", absl::StrCat("value dim ", c.value_dim(),
                                               " must be divisible by "
                                               "num_heads = ",
                                               c.num_heads));
  }
  return c;
}

}  // namespace linattn
