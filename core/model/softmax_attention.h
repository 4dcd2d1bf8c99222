// A hybrid model's softmax-attention layer (config.h SoftmaxAttention):
// fla/layers/attn.py's Attention as fla's blocks place it (attn_norm →
// Attention → residual; rwkv6's block: its LayerNorms and channel mix
// around it), over the session's KvCache (kv_cache.h):
//   normed rows → (q|k|v|gate) GEMM (+ qkv bias) → q_norm, k_norm per head
//   (qwen3_next) → GPT-NeoX rotary on q and k at each row's position over
//   the rotated channels (base rope_theta; none without rope) → per query
//   head h (key/value head h / (num_heads / num_kv_heads)):
//   softmax(q·kᵀ·scale) (d^−½, or granitemoehybrid's attention_multiplier)
//   over the keys at positions i − w < j ≤ i (all j ≤ i without a window)
//   → · σ(gate) (qwen3_next) → o_proj GEMM (+ its bias) (+ residual).
// A piece of many rows reads its earlier positions from the cache and its
// own from the workspace (causal within the piece), then writes its keys
// and values to the cache; a one-token piece is the same with one row. The
// query vectors of a tile of rows go over the keys together (each key and
// value read once for the tile), each vector's sums in the same order
// whatever the tile.
#ifndef LINATTN_CORE_MODEL_SOFTMAX_ATTENTION_H_
#define LINATTN_CORE_MODEL_SOFTMAX_ATTENTION_H_

#include <string>

#include "absl/status/status.h"
#include "core/model/config.h"
#include "core/model/model.h"

namespace linattn {

class ForwardRunner;
class TensorReader;
struct LayerPass;

// The layer's weights under `p` ("model.layers.3.attn."): q_proj, k_proj,
// v_proj (with biases when qkv_bias) and o_proj (with its bias when
// o_bias; both × residual_multiplier), into L.qkv, L.in_bias, L.o and
// L.out_bias; its rotary frequencies into L.rotary_inv_freq.
absl::Status LoadSoftmaxAttention(TensorReader& r, const ModelConfig& c,
                                  const ModelConfig::SoftmaxAttention& a,
                                  const std::string& p, WeightType weights,
                                  Model::Layer& L);

// x += Attention(xn) for the rows of `pass`, xn the workspace's normed
// rows (the type's block normalises them: ModelTypeDef::RunAttentionBlock),
// advancing each piece's cache and position.
absl::Status RunSoftmaxAttention(ForwardRunner& runner, const LayerPass& pass);

}  // namespace linattn

#endif  // LINATTN_CORE_MODEL_SOFTMAX_ATTENTION_H_
