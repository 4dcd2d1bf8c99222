#include "core/model/config.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/model/config_json.h"
#include "core/model/model_types.h"
#include "core/util/status_macros.h"

namespace linattn {

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
  if (!is_linear_attn()) return num_heads * head_k;
  return static_cast<uint32_t>(hidden_size * expand_k);
}
uint32_t ModelConfig::value_dim() const {
  if (!is_linear_attn()) return state_heads * head_v;
  return static_cast<uint32_t>(hidden_size * expand_v);
}

uint32_t ModelConfig::widest_mlp() const {
  uint32_t widest = 0;
  for (uint32_t l = 0; l < num_hidden_layers; ++l) {
    widest = std::max(widest, mlp_width(l));
  }
  return widest;
}

uint32_t ModelConfig::conv_channels() const {
  if (is_mamba2()) return mamba_inner + 2 * n_groups * state_size;
  if (is_linear_attn() || !use_short_conv) return 0;
  return q_width() + k_width() + v_width();
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
  return is_linear_attn() && (feature_map == ModelFeatureMap::kElu ||
                              feature_map == ModelFeatureMap::kRelu ||
                              feature_map == ModelFeatureMap::kT2R ||
                              feature_map == ModelFeatureMap::kHedgehog);
}

bool ModelConfig::feature_map_has_weights() const {
  return is_linear_attn() &&
         (feature_map == ModelFeatureMap::kT2R ||
          feature_map == ModelFeatureMap::kHedgehog ||
          feature_map == ModelFeatureMap::kElementwiseProduct);
}

namespace {

// The fields every type shares: sizes, vocabulary, special ids, the MLP,
// the norms' ε, and the parts linattn refuses.
absl::Status ParseCommon(const json& j, const ModelTypeDef::CommonDefaults& d,
                         ModelConfig& c) {
  if (auto s = Dim(j, "hidden_size", &c.hidden_size, 2048); !s.ok()) return s;
  if (auto s = Dim(j, "num_hidden_layers", &c.num_hidden_layers, d.layers);
      !s.ok())
    return s;
  if (auto s = Dim(j, "vocab_size", &c.vocab_size, d.vocab_size); !s.ok())
    return s;
  if (auto s = Value(j, "tie_word_embeddings", &c.tie_word_embeddings); !s.ok())
    return s;
  auto act = Optional<std::string>(j, "hidden_act");
  if (!act.ok()) return act.status();
  // fla's GatedMLP and output gates are built for swish; mamba2's
  // convolution takes silu (the same function).
  std::string act_name = act->value_or(d.hidden_act);
  const bool sqrelu = absl::string_view(d.hidden_act) == "sqrelu";
  if (sqrelu ? act_name != "sqrelu"
             : act_name != "swish" && act_name != "silu") {
    return ConfigFieldError("hidden_act",
                            absl::StrCat("'", act_name, "' is not supported (",
                                         sqrelu ? "sqrelu" : "swish", ")"));
  }
  double eps = d.norm_eps;
  // mamba2's older fla configs (and transformers') say layer_norm_epsilon;
  // transformers' own types rms_norm_eps.
  const char* eps_field = d.rms_norm_eps ? "rms_norm_eps" : "norm_eps";
  if (d.layer_norm_epsilon && !j.contains("norm_eps")) {
    if (auto s = Value(j, "layer_norm_epsilon", &eps); !s.ok()) return s;
  }
  if (auto s = Value(j, eps_field, &eps); !s.ok()) return s;
  if (!(eps > 0) || !std::isfinite(eps)) {
    return ConfigFieldError(eps_field, "must be > 0");
  }
  c.norm_eps = static_cast<float>(eps);
  if (d.mlp) {
    // fla's GatedMLP: intermediate = 256·⌈(hidden·ratio·2/3) / 256⌉, the
    // ratio 4 when null (RetNetConfig's default is 2).
    auto inter = Optional<int64_t>(j, "intermediate_size");
    if (!inter.ok()) return inter.status();
    if (inter->has_value()) {
      if (auto s = Dim(j, "intermediate_size", &c.intermediate_size); !s.ok())
        return s;
    } else {
      // The type's default when the field is absent; a present null is
      // GatedMLP's own 4.
      double ratio = j.contains("hidden_ratio") ? 4 : d.hidden_ratio;
      if (auto s = Value(j, "hidden_ratio", &ratio); !s.ok()) return s;
      if (!(ratio > 0) || !std::isfinite(ratio)) {
        return ConfigFieldError("hidden_ratio", "must be > 0");
      }
      // As fla: int(hidden·ratio·2/3), rounded up to a multiple of 256; in
      // double and range-checked before any conversion, so that a huge
      // ratio is refused rather than converted past int64's range.
      const double wanted = std::floor(c.hidden_size * ratio * 2 / 3);
      const double rounded = 256 * std::ceil(wanted / 256);
      if (!(rounded >= 1) || rounded > kMaxModelDim) {
        return ConfigFieldError("hidden_ratio",
                                "gives an intermediate size out of range");
      }
      c.intermediate_size = static_cast<uint32_t>(rounded);
    }
  }
  for (auto [field, out] : {std::pair<const char*, std::optional<int64_t>*>{
                                "bos_token_id", &c.bos_token_id},
                            {"eos_token_id", &c.eos_token_id}}) {
    auto id = Optional<int64_t>(j, field);
    if (!id.ok()) return id.status();
    *out = *id;
    if (id->has_value() && (**id < 0 || **id >= c.vocab_size)) {
      return ConfigFieldError(
          field, absl::StrCat("must be in [0, vocab_size = ", c.vocab_size,
                              "), got ", **id));
    }
  }
  if (auto tok = Optional<std::string>(j, "linattn_tokenizer"); !tok.ok()) {
    return tok.status();
  } else if (tok->has_value()) {
    if (**tok != "bytes") {
      return ConfigFieldError(
          "linattn_tokenizer",
          absl::StrCat("'", **tok,
                       "' is not a tokenizer linattn names here (\"bytes\"; "
                       "tokenizer files are found beside config.json)"));
    }
    c.byte_tokens = true;
  }
  if (auto res = j.find("attnres_block_size");
      res != j.end() && !res->is_null()) {
    return ConfigFieldError(
        "attnres_block_size",
        "block attention residuals are not supported (set it to "
        "null)");
  }
  if (auto mode = Optional<std::string>(j, "attn_mode"); !mode.ok()) {
    return mode.status();
  } else if (mode->has_value() && **mode != "chunk" &&
             **mode != "fused_chunk" && **mode != "fused_recurrent" &&
             !(**mode == "parallel" && d.parallel_mode)) {
    // A kernel choice only; RetNet also has a parallel form.
    return ConfigFieldError("attn_mode",
                            absl::StrCat("'", **mode,
                                         "' is not one of chunk, fused_chunk, "
                                         "fused_recurrent",
                                         d.parallel_mode ? ", parallel" : ""));
  }
  return absl::OkStatus();
}

// fla's normalize_hybrid_attention_config (fla/models/hybrid.py) and what
// fla/layers/attn.py's Attention needs of it: `attn` is null, one spec or a
// list of specs; each spec's `layers` a list of distinct layer indices in
// [0, num_hidden_layers), each layer in one spec only; num_heads and
// num_kv_heads (num_heads when absent or null) positive integers, qkv_bias
// a Boolean (false), window_size null or a positive integer, rope_theta
// positive and finite (10000); hidden_size / num_heads whole (the head
// reshape) and even (rotary halves), num_heads / num_kv_heads whole.
absl::Status ParseHybridAttention(const json& j, ModelConfig& c) {
  auto it = j.find("attn");
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  switch (c.type) {
    case ModelType::kLinearAttn:
    case ModelType::kRetNet:
    case ModelType::kGla:
    case ModelType::kDeltaNet:
    case ModelType::kGatedDeltaNet:
    case ModelType::kRwkv6:  // RWKV6Block: Attention in place of its time mix
      break;
    case ModelType::kMamba2:
      return ConfigFieldError(
          "attn",
          "fla's mamba2 has no softmax-attention layers (its config "
          "takes no attn)");
    case ModelType::kGraniteMoeHybrid:
    case ModelType::kQwen3Next:
      return ConfigFieldError(
          "attn", absl::StrCat(ModelTypeName(c.type),
                               " names its attention layers in layer_types"));
    case ModelType::kRwkv7:
      return ConfigFieldError(
          "attn",
          "fla's rwkv7 hybrids do not run in fla itself (RWKV7Block "
          "unpacks four values from Attention, which returns three)");
  }
  const json& attn = *it;
  if (!attn.is_object() && !attn.is_array()) {
    return ConfigFieldError(
        "attn", "must be null, a dictionary, or a list of dictionaries");
  }
  const bool single = attn.is_object();
  c.attn_of_layer.assign(c.num_hidden_layers, -1);
  const size_t specs = single ? 1 : attn.size();
  for (size_t i = 0; i < specs; ++i) {
    const json& spec = single ? attn : attn[i];
    const std::string where = single ? "attn" : absl::StrCat("attn[", i, "]");
    auto error = [&](absl::string_view field, absl::string_view what) {
      return ConfigFieldError(absl::StrCat(where, ".", field), what);
    };
    if (!spec.is_object()) {
      return ConfigFieldError(where, "must be a dictionary");
    }
    auto positive = [&](const char* field, std::optional<uint32_t> fallback,
                        uint32_t* out) -> absl::Status {
      auto f = spec.find(field);
      if (f == spec.end() || f->is_null()) {
        if (!fallback) return error(field, "is required");
        *out = *fallback;
        return absl::OkStatus();
      }
      if (!f->is_number_integer() || f->get<int64_t>() <= 0 ||
          f->get<int64_t>() > int64_t{kMaxModelDim}) {
        return error(field, absl::StrCat("must be a positive integer (at most ",
                                         kMaxModelDim, ")"));
      }
      *out = static_cast<uint32_t>(f->get<int64_t>());
      return absl::OkStatus();
    };
    ModelConfig::SoftmaxAttention a;
    auto layers = spec.find("layers");
    if (layers == spec.end()) return error("layers", "is required");
    if (!layers->is_array()) {
      return error("layers", "must be a list of integer layer indices");
    }
    LINATTN_RETURN_IF_ERROR(positive("num_heads", std::nullopt, &a.num_heads));
    LINATTN_RETURN_IF_ERROR(
        positive("num_kv_heads", a.num_heads, &a.num_kv_heads));
    if (auto b = spec.find("qkv_bias"); b != spec.end() && !b->is_null()) {
      if (!b->is_boolean()) return error("qkv_bias", "must be a Boolean");
      a.qkv_bias = b->get<bool>();
    }
    if (auto w = spec.find("window_size"); w != spec.end() && !w->is_null()) {
      LINATTN_RETURN_IF_ERROR(positive("window_size", std::nullopt, &a.window));
    }
    if (auto t = spec.find("rope_theta"); t != spec.end() && !t->is_null()) {
      auto theta = Number(*t, absl::StrCat(where, ".rope_theta"));
      if (!theta.ok()) return theta.status();
      if (t->is_boolean() || !(*theta > 0) || !std::isfinite(*theta)) {
        return error("rope_theta", "must be positive and finite");
      }
      a.rope_theta = *theta;
    }
    if (c.hidden_size % a.num_heads != 0) {
      return error("num_heads", absl::StrCat("hidden_size ", c.hidden_size,
                                             " is not a multiple of num_heads ",
                                             a.num_heads));
    }
    a.head_dim = c.hidden_size / a.num_heads;
    if (a.head_dim % 2 != 0) {
      return error("num_heads",
                   absl::StrCat("gives an odd head size ", a.head_dim,
                                " (rotary rotates halves)"));
    }
    if (a.num_heads % a.num_kv_heads != 0) {
      return error(
          "num_kv_heads",
          absl::StrCat("num_heads ", a.num_heads,
                       " is not a multiple of num_kv_heads ", a.num_kv_heads));
    }
    const int32_t index = static_cast<int32_t>(c.attn.size());
    for (const json& l : *layers) {
      if (!l.is_number_integer() || l.get<int64_t>() < 0 ||
          l.get<int64_t>() >= int64_t{c.num_hidden_layers}) {
        return error("layers",
                     absl::StrCat("must hold layer indices in [0, ",
                                  c.num_hidden_layers, "), got ", l.dump()));
      }
      int32_t& slot = c.attn_of_layer[l.get<int64_t>()];
      if (slot != -1) {
        return error("layers", absl::StrCat("layer ", l.get<int64_t>(),
                                            " is named more than once"));
      }
      slot = index;
    }
    c.attn.push_back(a);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text) {
  json j;
  try {
    const std::string text = QuoteNonFiniteWords(json_text);
    j = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: not valid JSON: ", e.what()));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError("config.json: must be a JSON object");
  }
  auto name = Optional<std::string>(j, "model_type");
  if (!name.ok()) return name.status();
  const ModelTypeDef* def = name->has_value() ? FindModelType(**name) : nullptr;
  if (def == nullptr) {
    std::string known;
    for (const ModelTypeDef* t : ModelTypes()) {
      absl::StrAppend(&known, known.empty() ? "" : ", ", t->name());
    }
    return ConfigFieldError(
        "model_type", absl::StrCat("must be one of ", known, "; got ",
                                   name->has_value() ? "\"" + **name + "\""
                                                     : std::string("nothing")));
  }
  ModelConfig c;
  c.type = def->type();
  c.model_type = std::string(def->name());
  LINATTN_RETURN_IF_ERROR(ParseCommon(j, def->defaults(), c));
  LINATTN_RETURN_IF_ERROR(def->ReadConfig(j, c));
  LINATTN_RETURN_IF_ERROR(def->CheckSizes(c));
  LINATTN_RETURN_IF_ERROR(ParseHybridAttention(j, c));
  return c;
}

}  // namespace linattn
