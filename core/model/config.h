// ModelConfig: the config.json of a flash-linear-attention (fla)
// `linear_attn` checkpoint, parsed and checked, with the sizes it implies.
//
// Field names and defaults are those of fla's LinearAttentionConfig, so a
// config.json written by fla (or by tools/linattn_ref.py) loads unchanged.
// Anything linattn cannot serve exactly (hybrid softmax layers, another
// activation, an unknown feature map) is refused with INVALID_ARGUMENT
// naming the field, never approximated.
#ifndef LINATTN_CORE_MODEL_CONFIG_H_
#define LINATTN_CORE_MODEL_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace linattn {

// fla's feature maps (LinearAttention's `feature_map` argument).
enum class ModelFeatureMap {
  kElu,                 // ELU(x) + 1
  kRelu,                // max(x, 0)
  kIdentity,            // x
  kT2R,                 // relu(W x), W d_k×d_k, no bias
  kHedgehog,            // softmax([2(Wx+b), −2(Wx+b)]), d_φ = 2·d_k
  kDpfp,                // DPFP, ν = 4: d_φ = 8·d_k
  kElementwiseProduct,  // (W₁x+b₁) ⊙ (W₂x+b₂)
};

absl::string_view ModelFeatureMapName(ModelFeatureMap map);

struct ModelConfig {
  std::string model_type;  // "linear_attn"
  uint32_t hidden_size = 0;
  uint32_t num_hidden_layers = 0;
  uint32_t num_heads = 0;
  uint32_t num_kv_heads = 0;  // num_heads when the file leaves it null
  double expand_k = 1;
  double expand_v = 1;
  ModelFeatureMap feature_map = ModelFeatureMap::kElu;
  bool tie_feature_map_qk = false;
  bool norm_q = false;
  bool norm_k = false;
  bool norm_feature_map = false;   // normalised read-out (÷ φ(q)ᵀz)
  uint32_t intermediate_size = 0;  // from hidden_ratio when null
  float norm_eps = 1e-6f;
  bool elementwise_affine = true;  // the per-head output norm has a weight
  uint32_t vocab_size = 0;
  bool tie_word_embeddings = false;
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> eos_token_id;

  // Derived sizes.
  uint32_t key_dim() const;    // hidden·expand_k (all query heads)
  uint32_t value_dim() const;  // hidden·expand_v
  uint32_t head_k_dim() const { return key_dim() / num_heads; }
  uint32_t head_v_dim() const { return value_dim() / num_heads; }
  uint32_t kv_groups() const { return num_heads / num_kv_heads; }
  uint32_t feature_dim() const;  // d_φ per head after the feature map
  // Whether the map has weights, and whether those have biases.
  bool feature_map_has_weights() const;
  // Whether φ is never negative (then z, a sum of features, never is):
  // elu, relu, t2r and hedgehog; not identity, dpfp (fla's has −relu(x))
  // or elementwise_product.
  bool features_nonnegative() const;
};

// Parses and checks config.json's text. INVALID_ARGUMENT naming the field.
absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text);

}  // namespace linattn

#endif  // LINATTN_CORE_MODEL_CONFIG_H_
