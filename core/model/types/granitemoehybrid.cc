// granitemoehybrid: IBM Granite 4.0-H in transformers' layout
// (transformers/models/granitemoehybrid, GraniteMoeHybridForCausalLM).
// Per layer, by layer_types: x += m·mamba(rmsnorm(x)) with Mamba-2's mixer
// (mamba2.h; its gated RMSNorm over all I channels, D per head), or
// x += m·attention(rmsnorm(x)) with softmax attention (GQA, scores times
// attention_multiplier, rotary only with position_embedding_type "rope",
// attention_bias on q, k, v and o); then
// x += m·(shared_mlp(h) + moe(h)), h = rmsnorm(x), the shared MLP a gated
// SiLU MLP of shared_intermediate_size and the experts (moe.h) present
// when num_local_experts > 0. m is residual_multiplier; the embeddings are
// times embedding_multiplier and the logits divided by logits_scaling.
// Reference: tools/linattn_ref.py's GraniteMoeHybridMambaLayer and its
// language model.
#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/model/types/mamba2.h"
#include "core/model/types/transformers_fields.h"
#include "core/util/status_macros.h"

namespace linattn {
namespace {

class GraniteMoeHybridDef final : public Mamba2Def {
 public:
  GraniteMoeHybridDef()
      : Mamba2Def(ModelType::kGraniteMoeHybrid, "granitemoehybrid",
                  "GraniteMoeHybridMambaLayer") {}

  CommonDefaults defaults() const override {
    CommonDefaults d;
    d.layers = 32;
    d.hidden_act = "silu";
    d.norm_eps = 1e-6;
    d.rms_norm_eps = true;
    d.mlp = false;  // its sizes are read below
    return d;
  }
  absl::Status ReadConfig(const json& j, ModelConfig& c) const override;
  TensorNames names() const override {
    TensorNames n = TransformersTensorNames();
    n.mlp_gate = "shared_mlp.input_linear.weight";
    n.mlp_up = "";
    n.mlp_down = "shared_mlp.output_linear.weight";
    n.experts = "block_sparse_moe.";
    return n;
  }

 protected:
  const char* MixerModule() const override { return "mamba."; }
  const char* size_field() const override { return "mamba_d_state"; }
  const char* head_field() const override { return "mamba_d_head"; }
};

absl::Status GraniteMoeHybridDef::ReadConfig(const json& j,
                                             ModelConfig& c) const {
  const uint32_t H = c.hidden_size;
  // The multipliers.
  LINATTN_RETURN_IF_ERROR(
      Multiplier(j, "embedding_multiplier", 1, false, &c.embedding_multiplier));
  LINATTN_RETURN_IF_ERROR(
      Multiplier(j, "residual_multiplier", 1, false, &c.residual_multiplier));
  LINATTN_RETURN_IF_ERROR(
      Multiplier(j, "logits_scaling", 1, true, &c.logits_scaling));

  // Feed-forwards: the shared MLP (GraniteMoeHybridMLP, always built; of
  // width 0 it adds nothing), the experts with num_local_experts > 0.
  LINATTN_RETURN_IF_ERROR(
      Count(j, "shared_intermediate_size", 1024, &c.intermediate_size));
  LINATTN_RETURN_IF_ERROR(
      ReadExpertSizes(j,
                      {"num_local_experts", 8, "intermediate_size", 11008,
                       "num_experts_per_tok", 2},
                      c));

  // Mamba-2 layers.
  uint32_t expand = 2;
  if (auto s = Dim(j, "mamba_expand", &expand, 2); !s.ok()) return s;
  if (uint64_t{expand} * H > kMaxModelDim) {
    return ConfigFieldError("mamba_expand",
                            "gives an inner width out of range");
  }
  c.mamba_inner = expand * H;
  if (auto s = Dim(j, "mamba_n_heads", &c.num_heads, 128); !s.ok()) return s;
  LINATTN_RETURN_IF_ERROR(Divides("mamba_n_heads", c.mamba_inner, c.num_heads,
                                  "mamba_expand × hidden_size"));
  c.head_v = c.mamba_inner / c.num_heads;
  if (auto d = j.find("mamba_d_head");
      d != j.end() && !d->is_null() && !(d->is_string() && *d == "auto")) {
    uint32_t head = 0;
    if (auto s = Dim(j, "mamba_d_head", &head); !s.ok()) return s;
    if (head != c.head_v) {
      return ConfigFieldError(
          "mamba_d_head",
          absl::StrCat("must be mamba_expand × hidden_size / mamba_n_heads = ",
                       c.head_v, " (or \"auto\"), got ", head));
    }
  }
  LINATTN_RETURN_IF_ERROR(
      ReadMamba2Shape(j,
                      {"mamba_d_state", 256, "mamba_n_groups", "mamba_d_conv",
                       "mamba_conv_bias", "mamba_proj_bias"},
                      c));
  c.rmsnorm = true;
  c.norm_before_gate = false;
  c.d_has_hdim = false;
  c.gated_norm_groups = 1;
  LINATTN_RETURN_IF_ERROR(ReadTimeStepLimit(j, "time_step_limit", c));

  // layer_types (or its alias layers_block_type): mamba or attention per
  // layer, every layer mamba when neither is given.
  auto listed = [&](const char* field) {
    auto it = j.find(field);
    return it != j.end() && !it->is_null() ? &*it : nullptr;
  };
  const json* types = listed("layer_types");
  const char* types_field = "layer_types";
  if (const json* alias = listed("layers_block_type")) {
    if (types != nullptr && *types != *alias) {
      return ConfigFieldError(
          "layers_block_type",
          "differs from layer_types (its alias); give one of them");
    }
    types = alias;
    types_field = "layers_block_type";
  }
  c.attn_of_layer.assign(c.num_hidden_layers, -1);
  if (types != nullptr) {
    if (!types->is_array() || types->size() != c.num_hidden_layers) {
      return ConfigFieldError(
          types_field,
          absl::StrCat("must list num_hidden_layers = ", c.num_hidden_layers,
                       " layer types (\"mamba\" or "
                       "\"attention\")"));
    }
    for (size_t l = 0; l < types->size(); ++l) {
      const json& t = (*types)[l];
      if (t == "attention") {
        c.attn_of_layer[l] = 0;
      } else if (t != "mamba") {
        return ConfigFieldError(
            absl::StrCat(types_field, "[", l, "]"),
            absl::StrCat(t.dump(), " is not \"mamba\" or \"attention\""));
      }
    }
  }
  // Softmax-attention layers, read when layer_types has one (transformers
  // builds none otherwise).
  if (!c.is_hybrid()) return RefuseMultiTokenPrediction(j);
  ModelConfig::SoftmaxAttention a;
  if (auto s = Dim(j, "num_attention_heads", &a.num_heads, 32); !s.ok())
    return s;
  a.num_kv_heads = a.num_heads;
  if (auto s = Dim(j, "num_key_value_heads", &a.num_kv_heads, a.num_heads);
      !s.ok())
    return s;
  LINATTN_RETURN_IF_ERROR(
      Divides("num_attention_heads", H, a.num_heads, "hidden_size"));
  LINATTN_RETURN_IF_ERROR(Divides("num_key_value_heads", a.num_heads,
                                  a.num_kv_heads, "num_attention_heads"));
  a.head_dim = H / a.num_heads;
  if (auto d = j.find("head_dim"); d != j.end() && !d->is_null()) {
    uint32_t head = 0;
    if (auto s = Dim(j, "head_dim", &head); !s.ok()) return s;
    if (head != a.head_dim) {
      return ConfigFieldError(
          "head_dim",
          absl::StrCat("linattn takes hidden_size / num_attention_heads = ",
                       a.head_dim, ", got ", head));
    }
  }
  LINATTN_RETURN_IF_ERROR(Bool(j, "attention_bias", &a.qkv_bias, false));
  a.o_bias = a.qkv_bias;
  LINATTN_RETURN_IF_ERROR(
      Multiplier(j, "attention_multiplier", 1, false, &a.scale));
  if (a.scale == 0) {
    return ConfigFieldError("attention_multiplier", "must not be 0");
  }
  auto position = Optional<std::string>(j, "position_embedding_type");
  if (!position.ok()) return position.status();
  // transformers builds the rotary embedding for "rope" alone.
  if (position->has_value() && **position != "rope" && **position != "nope") {
    return ConfigFieldError(
        "position_embedding_type",
        absl::StrCat("'", **position, "' is not one of rope, nope"));
  }
  a.rope = position->has_value() && **position == "rope";
  if (a.rope) {
    a.rope_theta = 10000;
    LINATTN_RETURN_IF_ERROR(ReadRope(j, &a.rope_theta, nullptr));
    if (a.head_dim % 2 != 0) {
      return ConfigFieldError(
          "num_attention_heads",
          absl::StrCat("gives an odd head size ", a.head_dim,
                       " (rotary rotates halves)"));
    }
  }

  c.attn.push_back(a);
  return RefuseMultiTokenPrediction(j);
}

}  // namespace

const ModelTypeDef& GraniteMoeHybridType() {
  static const GraniteMoeHybridDef kDef;
  return kDef;
}

}  // namespace linattn
