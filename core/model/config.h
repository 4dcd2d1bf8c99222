// ModelConfig: the config.json of a flash-linear-attention (fla) checkpoint,
// parsed and checked, with the sizes it implies. Ten model types load:
// `linear_attn`, `retnet`, `gla`, `delta_net`, `gated_deltanet`, `mamba2`,
// `rwkv7`, `rwkv6` and transformers' `granitemoehybrid` and `qwen3_next`
// (docs/design.md, "Model types").
//
// Field names and defaults are those of fla's config classes (and the
// older spellings fla wrote before: rms_norm_eps, layer_norm_epsilon,
// time_step_limit), so a config.json written by fla, transformers or
// tools/linattn_ref.py loads unchanged; Python's non-standard `Infinity`
// (mamba2's dt_limit) is accepted. Anything linattn cannot serve exactly
// (hybrid softmax layers, another activation, an unknown feature map) is
// refused with INVALID_ARGUMENT naming the field, never approximated.
#ifndef LINATTN_CORE_MODEL_CONFIG_H_
#define LINATTN_CORE_MODEL_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

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

enum class ModelType {
  kLinearAttn,     // fla LinearAttention: φ(q)ᵀS (/ φ(q)ᵀz)
  kRetNet,         // multi-scale retention: fixed per-head decay, rotary q/k
  kGla,            // gated linear attention: low-rank per-key gates
  kDeltaNet,       // the delta rule
  kGatedDeltaNet,  // the gated delta rule
  kMamba2,         // SSD: scalar decay per head, D skip, gated RMSNorm
  kRwkv7,          // RWKV-7: token shift, LoRA decays, the rwkv7 rule, ReLU²
  kRwkv6,          // RWKV-6: token shift, data-dependent mixes, the rwkv6 rule
  // IBM Granite 4.0-H (transformers' layout): mamba2's mixer and softmax
  // attention by layer_types, a shared MLP and mixture-of-experts
  // feed-forwards, multipliers on the embeddings, residuals and logits.
  kGraniteMoeHybrid,
  // Qwen3-Next (transformers' layout): gated delta rule layers (GVA, one
  // fused in_proj, a gated RMSNorm) and gated softmax attention by
  // layer_types, mixture-of-experts with a gated shared expert or a dense
  // MLP per layer, zero-centred RMSNorms.
  kQwen3Next,
};
// The config.json spelling ("linear_attn", "retnet", …).
absl::string_view ModelTypeName(ModelType type);

// An elementwise map fla applies to q and k: RetNet's and GLA's
// feature_map (transformers' and fla's ACT2FN), DeltaNet's qk_activation.
enum class QkActivation {
  kNone,
  kRelu,
  kSigmoid,
  kLogSigmoid,  // log σ(x)
  kSilu,        // x·σ(x) ("silu", "swish")
  kGelu,        // exact (erf) GELU
  kSqRelu,      // relu(x)²
  kElu1,        // ELU(x) + 1
};

struct ModelConfig {
  ModelType type = ModelType::kLinearAttn;
  std::string model_type;  // ModelTypeName(type)
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
  // "linattn_tokenizer": "bytes" declares a model whose tokens are UTF-8
  // bytes (ids 0..255), for a directory with no tokenizer file.
  bool byte_tokens = false;

  // The gated and delta-rule types (every type but linear_attn). Their
  // state has `state_heads` heads of head_k × head_v (mamba2: state_size ×
  // head_dim); num_heads are the q/k heads (gated_deltanet's num_v_heads
  // may be a multiple: GVA) and num_kv_heads RetNet's and GLA's k/v heads.
  uint32_t state_heads = 0;
  uint32_t head_k = 0, head_v = 0;
  QkActivation qk_activation = QkActivation::kNone;  // after any silu below
  bool silu_qk = false;    // q, k through SiLU after the projection (and conv)
  bool silu_v = false;     // v likewise
  bool qk_l2norm = false;  // q, k ÷ √(Σx² + 1e-6) (the rule's own step)
  bool qk_sum_norm = false;      // delta_net qk_norm "sum": x ÷ Σx
  bool output_gate = false;      // o = norm(o)·SiLU(g_proj(x))
  bool fused_gate_norm = false;  // the norm is named g_norm_swish_gate
  bool use_short_conv = false;
  uint32_t conv_size = 0;          // the depthwise causal window W
  std::optional<float> clamp_min;  // GLA: gk = max(gk, clamp_min)
  bool use_beta = false;           // delta rules: β = σ(b_proj(x)), else 1
  bool allow_neg_eigval = false;   // β ×2
  // mamba2 (intermediate_size is expand × hidden; no MLP) and
  // granitemoehybrid's Mamba-2 layers.
  uint32_t mamba_inner = 0;  // I = expand × hidden: x's and z's width
  uint32_t state_size = 0;   // N
  uint32_t n_groups = 0;     // G: B and C groups, head h reads h / (H / G)
  bool use_conv_bias = false;
  bool use_bias = false;  // in_proj and out_proj biases
  bool rmsnorm = false;   // the gated RMSNorm (else y·SiLU(z))
  bool norm_before_gate = false;
  // The gated RMSNorm's groups: mamba2's n_groups (fla's RMSNormGated over
  // I / G channels); 1 for granitemoehybrid (its RMSNormGated is over I).
  uint32_t gated_norm_groups = 1;
  bool d_has_hdim = false;        // D per channel (intermediate) or per head
  double dt_min = 0, dt_max = 0;  // dt_limit (dt_max may be +inf)
  // rwkv7 (num_heads × head_k keys = hidden_size, head_v values per head;
  // intermediate_size is its channel mix's) and rwkv6 (decay_rank its
  // gate_low_rank_dim, mix_rank its proj_low_rank_dim).
  uint32_t decay_rank = 0, a_rank = 0, v_rank = 0, gate_rank = 0;  // LoRAs
  uint32_t mix_rank = 0;
  // rwkv6: the per-head group norm's ε (config.json's
  // linattn_group_norm_eps; norm_eps, as fla has it, when absent).
  float group_norm_eps = 0;
  bool norm_first = true;  // layer 0's input through pre_norm (ln0)
  bool norm_bias = true;   // the LayerNorms have biases
  bool fuse_norm = true;  // kk ÷ √(Σx² + 1e-6), else ÷ max(‖x‖, 1e-12)

  // granitemoehybrid's multipliers (1 elsewhere): the embeddings times
  // embedding_multiplier, every residual branch (mixer, attention, MLP and
  // experts) times residual_multiplier before it is added, the logits
  // divided by logits_scaling.
  double embedding_multiplier = 1, residual_multiplier = 1, logits_scaling = 1;
  // Mixture-of-experts feed-forwards beside the MLP (granitemoehybrid's
  // block_sparse_moe, qwen3_next's sparse blocks): num_experts experts of
  // expert_size (0: none), each token through experts_per_token of them
  // (moe.h).
  uint32_t num_experts = 0, experts_per_token = 0, expert_size = 0;
  // The layers that have them (qwen3_next's decoder_sparse_step and
  // mlp_only_layers); empty: every layer.
  std::vector<uint8_t> expert_layers;
  // The router's gates: a softmax over every expert's logit, the top k of
  // those, divided by their sum with norm_topk_prob (qwen3_next); false:
  // a softmax over the top k logits alone (granitemoehybrid; the same as
  // the former with norm_topk_prob).
  bool router_softmax_all = false;
  bool norm_topk_prob = true;
  // The MLP beside the experts in a layer that has them: of
  // expert_mlp_size (qwen3_next's shared_expert_intermediate_size; 0:
  // intermediate_size, granitemoehybrid's shared MLP), its output times
  // σ(w·x) with shared_expert_gate (qwen3_next's shared_expert_gate).
  uint32_t expert_mlp_size = 0;
  bool shared_expert_gate = false;
  bool layer_has_experts(size_t l) const {
    return num_experts > 0 &&
           (expert_layers.empty() ||
            (l < expert_layers.size() && expert_layers[l] != 0));
  }
  // Layer l's MLP width (0: none), and the widest of them.
  uint32_t mlp_width(size_t l) const {
    return layer_has_experts(l) && expert_mlp_size != 0 ? expert_mlp_size
                                                        : intermediate_size;
  }
  uint32_t widest_mlp() const;
  // Every RMSNorm's weight is an offset from this (qwen3_next's
  // zero-centred norms: x̂ · (1 + w)); folded into the weights at load.
  float norm_weight_offset = 0;

  // fla's hybrids (fla/models/hybrid.py, `attn` in every fla config):
  // softmax-attention layers (fla/layers/attn.py's Attention) in the layers
  // a spec names, the type's mixer in the others. Each layer's spec, or -1.
  struct SoftmaxAttention {
    uint32_t num_heads = 0, num_kv_heads = 0;  // num_heads % num_kv_heads == 0
    uint32_t head_dim = 0;                     // hidden_size / num_heads
    uint32_t window =
        0;  // window_size: query i sees keys i − w < j ≤ i; 0 = all
    double rope_theta = 10000;
    bool qkv_bias = false;
    // granitemoehybrid's: o_proj has a bias too (attention_bias), scores
    // are q·k·attention_multiplier (0 here: d^−½, fla's), and
    // position_embedding_type may leave out the rotary embedding.
    bool o_bias = false;
    double scale = 0;
    bool rope = true;
    // qwen3_next's: the rotary embedding turns the first rotary_dim
    // channels of each head (0: all of them; partial_rotary_factor), q
    // and k are RMSNormed per head before it (q_norm, k_norm), and the
    // output is gated, o · σ(gate) with the gate from q_proj (each head's
    // query and gate rows interleaved there) before o_proj; head_dim may
    // differ from hidden_size / num_heads.
    uint32_t rotary_dim = 0;
    bool qk_norm = false;
    bool output_gate = false;
    uint32_t q_width() const { return num_heads * head_dim; }
    uint32_t rotated() const { return rotary_dim != 0 ? rotary_dim : head_dim; }
  };
  std::vector<SoftmaxAttention> attn;
  std::vector<int32_t> attn_of_layer;  // num_hidden_layers entries
  const SoftmaxAttention* attention_layer(size_t l) const {
    return l < attn_of_layer.size() && attn_of_layer[l] >= 0
               ? &attn[attn_of_layer[l]]
               : nullptr;
  }
  bool is_hybrid() const {
    for (int32_t a : attn_of_layer) {
      if (a >= 0) return true;
    }
    return false;
  }

  bool is_linear_attn() const { return type == ModelType::kLinearAttn; }
  // Mamba-2's mixer (mamba2, and granitemoehybrid's recurrent layers).
  bool is_mamba2() const {
    return type == ModelType::kMamba2 || type == ModelType::kGraniteMoeHybrid;
  }
  // RWKV's block (rwkv7, rwkv6): LayerNorms, two token shifts, its own
  // channel mix.
  bool is_rwkv() const {
    return type == ModelType::kRwkv7 || type == ModelType::kRwkv6;
  }
  // fla's GatedMLP after the mixer (mamba2 has none; RWKV's channel mix is
  // its own type's).
  bool has_mlp() const { return type != ModelType::kMamba2 && !is_rwkv(); }
  // The norms around the blocks and before lm_head are LayerNorms (with a
  // bias when norm_bias), not RMSNorms.
  bool layer_norms() const { return is_rwkv(); }

  // Derived sizes.
  uint32_t key_dim() const;    // all query heads' q width
  uint32_t value_dim() const;  // all heads' values (the o_proj input)
  uint32_t head_k_dim() const {
    return is_linear_attn() ? key_dim() / num_heads : head_k;
  }
  uint32_t head_v_dim() const {
    return is_linear_attn() ? value_dim() / num_heads : head_v;
  }
  // The q, k and v projections' widths: k and v per key/value head (GQA),
  // v per value head with gated_deltanet's GVA.
  uint32_t q_width() const { return num_heads * head_k_dim(); }
  uint32_t k_width() const { return num_kv_heads * head_k_dim(); }
  uint32_t v_width() const {
    return is_linear_attn() ? num_kv_heads * head_v_dim()
                            : state_heads / kv_groups() * head_v;
  }
  // Channels of one layer's short-convolution window: q|k|v for the
  // attention types with use_short_conv, x|B|C for mamba2, else 0.
  uint32_t conv_channels() const;
  uint32_t kv_groups() const { return num_heads / num_kv_heads; }
  uint32_t feature_dim() const;  // d_φ per head after the feature map
  // Whether the map has weights, and whether those have biases.
  bool feature_map_has_weights() const;
  // Whether φ is never negative (then z, a sum of features, never is):
  // elu, relu, t2r and hedgehog; not identity, dpfp (fla's has −relu(x))
  // or elementwise_product. False for the rule types (no z).
  bool features_nonnegative() const;
};

// Parses and checks config.json's text. INVALID_ARGUMENT naming the field.
absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text);

}  // namespace linattn

#endif  // LINATTN_CORE_MODEL_CONFIG_H_
