#include "core/model/config.h"

#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/attention/spec.h"
#include "core/util/status_macros.h"
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

absl::string_view ModelTypeName(ModelType type) {
  switch (type) {
    case ModelType::kLinearAttn:
      return "linear_attn";
    case ModelType::kRetNet:
      return "retnet";
    case ModelType::kGla:
      return "gla";
    case ModelType::kDeltaNet:
      return "delta_net";
    case ModelType::kGatedDeltaNet:
      return "gated_deltanet";
    case ModelType::kMamba2:
      return "mamba2";
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

uint32_t ModelConfig::conv_channels() const {
  if (type == ModelType::kMamba2)
    return intermediate_size + 2 * n_groups * state_size;
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

// Python's json module writes float("inf") as the bare word Infinity (and
// -Infinity, NaN), which is not JSON: mamba2 configs carry
// "dt_limit": [0.0, Infinity]. Outside strings each such word becomes the
// string "Infinity", "-Infinity" or "NaN", which Number() reads back.
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

// A number, or Infinity/-Infinity written as above (NaN is refused).
absl::StatusOr<double> Number(const json& v, absl::string_view field) {
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    const std::string& w = v.get_ref<const std::string&>();
    if (w == "Infinity") return std::numeric_limits<double>::infinity();
    if (w == "-Infinity") return -std::numeric_limits<double>::infinity();
  }
  return FieldError(field, "must be a number (or Infinity)");
}

absl::Status Bool(const json& j, const char* field, bool* out, bool fallback) {
  *out = fallback;
  return Value(j, field, out);
}

// fla's ACT2FN names for RetNet's and GLA's feature_map (null: none).
absl::StatusOr<QkActivation> ParseQkMap(const json& j, ModelType type) {
  auto name = Optional<std::string>(j, "feature_map");
  if (!name.ok()) return name.status();
  if (!name->has_value()) return QkActivation::kNone;
  const std::string& n = **name;
  if (n == "relu") return QkActivation::kRelu;
  if (n == "sigmoid") return QkActivation::kSigmoid;
  if (n == "silu" || n == "swish") return QkActivation::kSilu;
  if (type == ModelType::kRetNet && n == "gelu") return QkActivation::kGelu;
  if (type == ModelType::kGla && n == "logsigmoid") {
    return QkActivation::kLogSigmoid;
  }
  if (type == ModelType::kGla && n == "sqrelu") return QkActivation::kSqRelu;
  return FieldError(
      "feature_map",
      absl::StrCat("'", n, "' is not supported for ", ModelTypeName(type),
                   type == ModelType::kRetNet
                       ? " (null, relu, sigmoid, silu, swish, gelu)"
                       : " (null, relu, sigmoid, logsigmoid, silu, swish, "
                         "sqrelu)"));
}

// hidden × ratio as fla's int(hidden·ratio): a whole number in range.
absl::Status Expand(const json& j, const char* field, double fallback,
                    uint32_t hidden, uint32_t* out) {
  double ratio = fallback;
  if (auto s = Value(j, field, &ratio); !s.ok()) return s;
  if (!(ratio > 0) || !std::isfinite(ratio)) {
    return FieldError(field, "must be > 0");
  }
  const double dim = std::floor(hidden * ratio);
  if (dim < 1 || dim > kMaxModelDim) {
    return FieldError(field, absl::StrCat("hidden_size × ", field,
                                          " is out of range, got ", dim));
  }
  *out = static_cast<uint32_t>(dim);
  return absl::OkStatus();
}

absl::Status Divides(const char* field, uint32_t whole, uint32_t part,
                     absl::string_view what) {
  if (part == 0 || whole % part != 0) {
    return FieldError(
        field, absl::StrCat(what, " ", whole, " is not divisible by ", part));
  }
  return absl::OkStatus();
}

// The fields every type shares: sizes, vocabulary, special ids, the MLP,
// the norms' ε, and the parts linattn refuses.
absl::Status ParseCommon(const json& j, ModelConfig& c) {
  const bool mamba = c.type == ModelType::kMamba2;
  if (auto s = Dim(j, "hidden_size", &c.hidden_size, 2048); !s.ok()) return s;
  const uint32_t layers = c.type == ModelType::kGatedDeltaNet ? 21
                          : mamba                             ? 48
                                                              : 24;
  if (auto s = Dim(j, "num_hidden_layers", &c.num_hidden_layers, layers);
      !s.ok())
    return s;
  if (auto s = Dim(j, "vocab_size", &c.vocab_size, 32000); !s.ok()) return s;
  if (auto s = Value(j, "tie_word_embeddings", &c.tie_word_embeddings); !s.ok())
    return s;
  auto act = Optional<std::string>(j, "hidden_act");
  if (!act.ok()) return act.status();
  // fla's GatedMLP and output gates are built for swish; mamba2's
  // convolution takes silu (the same function).
  std::string act_name = act->value_or(mamba ? "silu" : "swish");
  if (act_name != "swish" && act_name != "silu") {
    return FieldError("hidden_act", absl::StrCat("'", act_name,
                                                 "' is not supported (swish)"));
  }
  double eps = mamba ? 1e-5 : 1e-6;
  // mamba2's older fla configs (and transformers') say layer_norm_epsilon.
  if (mamba && !j.contains("norm_eps")) {
    if (auto s = Value(j, "layer_norm_epsilon", &eps); !s.ok()) return s;
  }
  if (auto s = Value(j, "norm_eps", &eps); !s.ok()) return s;
  if (!(eps > 0) || !std::isfinite(eps)) {
    return FieldError("norm_eps", "must be > 0");
  }
  c.norm_eps = static_cast<float>(eps);
  if (!mamba) {
    // fla's GatedMLP: intermediate = 256·⌈(hidden·ratio·2/3) / 256⌉, the
    // ratio 4 when null (RetNetConfig's default is 2).
    auto inter = Optional<int64_t>(j, "intermediate_size");
    if (!inter.ok()) return inter.status();
    if (inter->has_value()) {
      if (auto s = Dim(j, "intermediate_size", &c.intermediate_size); !s.ok())
        return s;
    } else {
      double ratio =
          c.type == ModelType::kRetNet && !j.contains("hidden_ratio") ? 2 : 4;
      if (auto s = Value(j, "hidden_ratio", &ratio); !s.ok()) return s;
      if (!(ratio > 0) || !std::isfinite(ratio)) {
        return FieldError("hidden_ratio", "must be > 0");
      }
      // As fla: int(hidden·ratio·2/3), rounded up to a multiple of 256; in
      // double and range-checked before any conversion, so that a huge
      // ratio is refused rather than converted past int64's range.
      const double wanted = std::floor(c.hidden_size * ratio * 2 / 3);
      const double rounded = 256 * std::ceil(wanted / 256);
      if (!(rounded >= 1) || rounded > kMaxModelDim) {
        return FieldError("hidden_ratio",
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
             **mode != "fused_chunk" && **mode != "fused_recurrent" &&
             !(**mode == "parallel" && c.type == ModelType::kRetNet)) {
    // A kernel choice only; RetNet also has a parallel form.
    return FieldError(
        "attn_mode",
        absl::StrCat("'", **mode,
                     "' is not one of chunk, fused_chunk, "
                     "fused_recurrent",
                     c.type == ModelType::kRetNet ? ", parallel" : ""));
  }
  return absl::OkStatus();
}

absl::Status ParseLinearAttn(const json& j, ModelConfig& c) {
  if (auto s = Dim(j, "num_heads", &c.num_heads, 4); !s.ok()) return s;
  if (auto s = Dim(j, "num_kv_heads", &c.num_kv_heads, c.num_heads); !s.ok())
    return s;
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
                            {"elementwise_affine", &c.elementwise_affine}}) {
    if (auto s = Value(j, field, out); !s.ok()) return s;
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
  c.state_heads = c.num_heads;
  return absl::OkStatus();
}

// elementwise_affine as fla's norms read it (`if elementwise_affine:`): a
// present null means no weight.
absl::Status Affine(const json& j, bool* out) {
  auto it = j.find("elementwise_affine");
  if (it != j.end() && it->is_null()) {
    *out = false;
    return absl::OkStatus();
  }
  return Bool(j, "elementwise_affine", out, true);
}

// RetNet's MultiScaleRetention and GLA's GatedLinearAttention: q heads and
// k/v heads (GQA), widths from expand_k/expand_v, an output gate.
absl::Status ParseGroupedHeads(const json& j, ModelConfig& c, uint32_t heads,
                               double expand_k, double expand_v) {
  if (auto s = Dim(j, "num_heads", &c.num_heads, heads); !s.ok()) return s;
  if (auto s = Dim(j, "num_kv_heads", &c.num_kv_heads, c.num_heads); !s.ok())
    return s;
  LINATTN_RETURN_IF_ERROR(
      Divides("num_kv_heads", c.num_heads, c.num_kv_heads, "num_heads"));
  uint32_t key_dim = 0, value_dim = 0;
  LINATTN_RETURN_IF_ERROR(
      Expand(j, "expand_k", expand_k, c.hidden_size, &key_dim));
  LINATTN_RETURN_IF_ERROR(
      Expand(j, "expand_v", expand_v, c.hidden_size, &value_dim));
  LINATTN_RETURN_IF_ERROR(
      Divides("expand_k", key_dim, c.num_heads, "the key dim"));
  LINATTN_RETURN_IF_ERROR(
      Divides("expand_v", value_dim, c.num_heads, "the value dim"));
  c.head_k = key_dim / c.num_heads;
  c.head_v = value_dim / c.num_heads;
  c.state_heads = c.num_heads;
  LINATTN_ASSIGN_OR_RETURN(c.qk_activation, ParseQkMap(j, c.type));
  LINATTN_RETURN_IF_ERROR(Bool(j, "use_output_gate", &c.output_gate, true));
  LINATTN_RETURN_IF_ERROR(Affine(j, &c.elementwise_affine));
  bool fuse_norm = true;
  LINATTN_RETURN_IF_ERROR(Bool(j, "fuse_norm", &fuse_norm, true));
  auto act = Optional<std::string>(j, "hidden_act");
  if (!act.ok()) return act.status();
  // fla builds FusedRMSNormGated (g_norm_swish_gate) only for a fused norm
  // in front of an output gate named "swish"; otherwise an RMSNorm named
  // g_norm and the gate function (silu is the same function).
  c.fused_gate_norm =
      c.output_gate && fuse_norm && act->value_or("swish") == "swish";
  return absl::OkStatus();
}

absl::Status ParseRetNet(const json& j, ModelConfig& c) {
  LINATTN_RETURN_IF_ERROR(ParseGroupedHeads(j, c, 8, 1.0, 2.0));
  // MultiScaleRetention asserts head_k_dim ≤ 256; rotary needs it even.
  if (c.head_k > 256 || c.head_k % 2 != 0) {
    return FieldError("expand_k",
                      absl::StrCat("retnet's head key dim must be even and at "
                                   "most 256, got ",
                                   c.head_k));
  }
  // RetNetBlock never passes use_short_conv or conv_size on: ignored.
  return absl::OkStatus();
}

absl::Status ParseGla(const json& j, ModelConfig& c) {
  LINATTN_RETURN_IF_ERROR(ParseGroupedHeads(j, c, 4, 0.5, 1.0));
  LINATTN_RETURN_IF_ERROR(Bool(j, "use_short_conv", &c.use_short_conv, false));
  if (auto s = Dim(j, "conv_size", &c.conv_size, 4); !s.ok()) return s;
  c.silu_qk = c.silu_v = c.use_short_conv;  // the convolutions' activation
  auto clamp = Optional<double>(j, "clamp_min");
  if (!clamp.ok()) return clamp.status();
  if (clamp->has_value()) {
    // A log-gate: above 0 it would grow the state.
    if (!(**clamp <= 0)) {
      return FieldError(
          "clamp_min",
          absl::StrCat("must be ≤ 0 (a log forget gate), got ", **clamp));
    }
    c.clamp_min = static_cast<float>(**clamp);
  }
  return absl::OkStatus();
}

// DeltaNet and Gated DeltaNet: the output norm is always affine.
absl::Status ParseDeltaCommon(const json& j, ModelConfig& c, bool gate) {
  LINATTN_RETURN_IF_ERROR(Bool(j, "use_gate", &c.output_gate, gate));
  LINATTN_RETURN_IF_ERROR(Bool(j, "use_short_conv", &c.use_short_conv, true));
  if (auto s = Dim(j, "conv_size", &c.conv_size, 4); !s.ok()) return s;
  LINATTN_RETURN_IF_ERROR(
      Bool(j, "allow_neg_eigval", &c.allow_neg_eigval, false));
  c.elementwise_affine = true;
  c.num_kv_heads = c.num_heads;
  return absl::OkStatus();
}

absl::Status ParseDeltaNet(const json& j, ModelConfig& c) {
  if (auto s = Dim(j, "num_heads", &c.num_heads, 16); !s.ok()) return s;
  uint32_t key_dim = 0, value_dim = 0;
  LINATTN_RETURN_IF_ERROR(Expand(j, "expand_k", 1.0, c.hidden_size, &key_dim));
  LINATTN_RETURN_IF_ERROR(
      Expand(j, "expand_v", 1.0, c.hidden_size, &value_dim));
  LINATTN_RETURN_IF_ERROR(
      Divides("expand_k", key_dim, c.num_heads, "the key dim"));
  LINATTN_RETURN_IF_ERROR(
      Divides("expand_v", value_dim, c.num_heads, "the value dim"));
  c.head_k = key_dim / c.num_heads;
  c.head_v = value_dim / c.num_heads;
  c.state_heads = c.num_heads;
  LINATTN_RETURN_IF_ERROR(ParseDeltaCommon(j, c, false));
  LINATTN_RETURN_IF_ERROR(Bool(j, "use_beta", &c.use_beta, true));
  auto act = Optional<std::string>(j, "qk_activation");
  if (!act.ok()) return act.status();
  const std::string a = act->value_or("silu");
  // v goes through SiLU whatever qk_activation says (its convolution's
  // activation, or F.silu without one); q and k only for "silu".
  c.silu_v = true;
  if (a == "silu") {
    c.silu_qk = true;
  } else if (a == "relu") {
    c.qk_activation = QkActivation::kRelu;
  } else if (a == "elu") {
    c.qk_activation = QkActivation::kElu1;
  } else if (a != "identity") {
    return FieldError("qk_activation",
                      absl::StrCat("'", a,
                                   "' is not supported (silu, relu, elu, "
                                   "identity)"));
  }
  auto norm = Optional<std::string>(j, "qk_norm");
  if (!norm.ok()) return norm.status();
  const std::string n = norm->value_or("l2");
  if (n == "l2") {
    c.qk_l2norm = true;
  } else if (n == "sum") {
    c.qk_sum_norm = true;
  } else {
    return FieldError("qk_norm",
                      absl::StrCat("'", n, "' is not supported (l2, sum)"));
  }
  return absl::OkStatus();
}

absl::Status ParseGatedDeltaNet(const json& j, ModelConfig& c) {
  if (auto s = Dim(j, "num_heads", &c.num_heads, 6); !s.ok()) return s;
  if (auto s = Dim(j, "head_dim", &c.head_k, 256); !s.ok()) return s;
  if (auto s = Dim(j, "num_v_heads", &c.state_heads, c.num_heads); !s.ok())
    return s;
  LINATTN_RETURN_IF_ERROR(
      Divides("num_v_heads", c.state_heads, c.num_heads, "num_v_heads"));
  double expand_v = 2.0;
  LINATTN_RETURN_IF_ERROR(Value(j, "expand_v", &expand_v));
  const double dv = c.head_k * expand_v;
  // GatedDeltaNet.__init__ refuses a head_v_dim that is not whole.
  if (!(dv >= 1) || dv > kMaxModelDim ||
      std::fabs(dv - std::floor(dv)) > 1e-5 * dv) {
    return FieldError("expand_v",
                      absl::StrCat("head_dim × expand_v must be a whole "
                                   "number ≥ 1, got ",
                                   dv));
  }
  c.head_v = static_cast<uint32_t>(dv);
  LINATTN_RETURN_IF_ERROR(ParseDeltaCommon(j, c, true));
  c.use_beta = true;
  c.silu_qk = c.silu_v = true;
  c.qk_l2norm = true;
  return absl::OkStatus();
}

absl::Status ParseMamba2(const json& j, ModelConfig& c) {
  uint32_t inner = 0;
  LINATTN_RETURN_IF_ERROR(Expand(j, "expand", 2, c.hidden_size, &inner));
  if (auto s = Dim(j, "head_dim", &c.head_v, 64); !s.ok()) return s;
  LINATTN_RETURN_IF_ERROR(
      Divides("head_dim", inner, c.head_v, "expand × hidden_size"));
  c.intermediate_size = inner;
  c.num_heads = inner / c.head_v;
  // Mamba2Config derives num_heads; a stored one must agree (the layer
  // raises otherwise).
  uint32_t stored = c.num_heads;
  if (auto s = Dim(j, "num_heads", &stored, c.num_heads); !s.ok()) return s;
  if (stored != c.num_heads) {
    return FieldError("num_heads",
                      absl::StrCat("must be expand × hidden_size / head_dim = ",
                                   c.num_heads, ", got ", stored));
  }
  c.num_kv_heads = c.state_heads = c.num_heads;
  if (auto s = Dim(j, "state_size", &c.state_size, 128); !s.ok()) return s;
  c.head_k = c.state_size;
  if (auto s = Dim(j, "n_groups", &c.n_groups, 1); !s.ok()) return s;
  LINATTN_RETURN_IF_ERROR(
      Divides("n_groups", c.num_heads, c.n_groups, "the head count"));
  if (auto s = Dim(j, "conv_kernel", &c.conv_size, 4); !s.ok()) return s;
  c.use_short_conv = true;
  LINATTN_RETURN_IF_ERROR(Bool(j, "use_conv_bias", &c.use_conv_bias, true));
  LINATTN_RETURN_IF_ERROR(Bool(j, "use_bias", &c.use_bias, false));
  // fla wrote `rms_norm` before `rmsnorm`, and from September 2024 to April
  // 2026 applied the norm whatever it said (its first release honoured
  // it): false without `rmsnorm` has no one meaning.
  if (!j.contains("rmsnorm")) {
    bool old = true;
    LINATTN_RETURN_IF_ERROR(Bool(j, "rms_norm", &old, true));
    if (!old) {
      return FieldError("rms_norm",
                        "false is read differently by fla's releases; set "
                        "\"rmsnorm\" explicitly");
    }
  }
  LINATTN_RETURN_IF_ERROR(Bool(j, "rmsnorm", &c.rmsnorm, true));
  LINATTN_RETURN_IF_ERROR(
      Bool(j, "norm_before_gate", &c.norm_before_gate, false));
  LINATTN_RETURN_IF_ERROR(Bool(j, "D_has_hdim", &c.d_has_hdim, false));
  const char* limit_field =
      j.contains("dt_limit") || !j.contains("time_step_limit")
          ? "dt_limit"
          : "time_step_limit";
  c.dt_min = 0;
  c.dt_max = std::numeric_limits<double>::infinity();
  if (auto it = j.find(limit_field); it != j.end() && !it->is_null()) {
    if (!it->is_array() || it->size() != 2) {
      return FieldError(limit_field, "must be [min, max]");
    }
    LINATTN_ASSIGN_OR_RETURN(c.dt_min, Number((*it)[0], limit_field));
    LINATTN_ASSIGN_OR_RETURN(c.dt_max, Number((*it)[1], limit_field));
    if (!(c.dt_min >= 0) || !std::isfinite(c.dt_min) ||
        !(c.dt_max >= c.dt_min)) {
      return FieldError(limit_field,
                        absl::StrCat("must be [min, max] with 0 ≤ min ≤ max, "
                                     "got [",
                                     c.dt_min, ", ", c.dt_max, "]"));
    }
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
  ModelConfig c;
  auto type = Optional<std::string>(j, "model_type");
  if (!type.ok()) return type.status();
  bool known = false;
  for (ModelType t :
       {ModelType::kLinearAttn, ModelType::kRetNet, ModelType::kGla,
        ModelType::kDeltaNet, ModelType::kGatedDeltaNet, ModelType::kMamba2}) {
    if (type->has_value() && ModelTypeName(t) == **type) {
      c.type = t;
      known = true;
    }
  }
  if (!known) {
    return FieldError(
        "model_type",
        absl::StrCat(
            "must be one of linear_attn, retnet, gla, delta_net, "
            "gated_deltanet, mamba2; got ",
            type->has_value() ? "\"" + **type + "\"" : std::string("nothing")));
  }
  c.model_type = std::string(ModelTypeName(c.type));
  LINATTN_RETURN_IF_ERROR(ParseCommon(j, c));
  // In ModelType's order.
  using TypeParser = absl::Status (*)(const json&, ModelConfig&);
  constexpr TypeParser kParsers[] = {ParseLinearAttn,    ParseRetNet,
                                     ParseGla,           ParseDeltaNet,
                                     ParseGatedDeltaNet, ParseMamba2};
  LINATTN_RETURN_IF_ERROR(kParsers[static_cast<int>(c.type)](j, c));
  // Every width a layer's buffers are cut into, in 64 bits: each a model
  // dimension at most (so no product of them wraps around).
  if (!c.is_linear_attn()) {
    const uint64_t heads = c.num_heads, kv = c.num_kv_heads,
                   state = c.state_heads, dk = c.head_k, dv = c.head_v;
    const uint64_t widths[] = {
        heads * dk, kv * dk, state * dv,
        c.type == ModelType::kMamba2
            ? 2 * uint64_t{c.intermediate_size} +
                  2 * uint64_t{c.n_groups} * c.state_size + heads
            : 0};
    for (uint64_t w : widths) {
      if (w > kMaxModelDim) {
        return FieldError(
            c.type == ModelType::kMamba2 ? "state_size" : "num_heads",
            absl::StrCat("gives a projection of ", w,
                         " columns, beyond linattn's limit ", kMaxModelDim));
      }
    }
  }
  // The state's widths are the attention spec's (at most kMaxDim each).
  if (!c.is_linear_attn() &&
      (c.head_k > kMaxDim || c.head_v > kMaxDim || c.state_heads > kMaxDim)) {
    return FieldError(
        c.type == ModelType::kMamba2 ? "state_size" : "head_dim",
        absl::StrCat("a state head of ", c.head_k, " × ", c.head_v, " (",
                     c.state_heads, " heads) is beyond linattn's limit ",
                     kMaxDim));
  }
  return c;
}

}  // namespace linattn
