// What RWKV's blocks share (rwkv7.cc, rwkv6.cc): the config fields of fla's
// RWKV configs around the time mix (the channel mix's width, norm_first,
// norm_bias), the LayerNorms' weights, and the token shift, whose last
// rows of each layer are the session's window (model.h); and the part of
// the type definition both share (RwkvBlockDef).
#ifndef LINATTN_CORE_MODEL_TYPES_RWKV_BLOCK_H_
#define LINATTN_CORE_MODEL_TYPES_RWKV_BLOCK_H_

#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/model/config.h"
#include "core/model/config_json.h"
#include "core/model/forward.h"
#include "core/model/model_types.h"
#include "core/model/tensor_reader.h"

namespace linattn {

// The layer index in a tensor prefix "model.layers.<i>.".
uint32_t RwkvLayerIndex(const std::string& prefix);

// The channel mix's width: intermediate_size, or int(hidden·hidden_ratio)
// rounded up to a multiple of 32 (`ratio` when hidden_ratio is absent or
// null: RWKV7FeedForward's 4, RWKV6FeedForward's 3.5); then norm_first,
// norm_bias and fuse_norm (default true each).
absl::Status ReadRwkvBlockConfig(const json& j, double ratio, ModelConfig& c);

// The block's LayerNorms: pre_norm on layer 0 with norm_first, attn_norm's
// bias (its weight is Model::Layer::attn_norm), ffn_norm; biases only with
// norm_bias.
struct RwkvNorms {
  std::vector<float> pre_norm_w, pre_norm_b;
  std::vector<float> attn_norm_b;
  std::vector<float> ffn_norm_w, ffn_norm_b;
};
absl::Status LoadRwkvNorms(TensorReader& r, const ModelConfig& c,
                           const std::string& layer, RwkvNorms* norms);

// δ rows of the pass for the token shift whose row sits at `offset` in
// each session's window (x_{t−1} − x_t, the window's row before a piece's
// first), then the window advanced to each piece's last row (into `into`'s
// window for a one-token item that has one).
void RwkvTokenShift(const LayerPass& pass, const ModelConfig& c,
                    const float* xn, uint64_t offset, float* delta);

// The inputs of the two mixes for the rows of `pass`, in the workspace's
// x and xn: the time mix's x ← LN(x) (pre_norm, layer 0 with norm_first),
// xn = LN(x) (attn_norm) and its token shift's δ; the channel mix's
// xn = LN(x) (ffn_norm) and its own δ.
void RwkvTimeMixInput(const LayerPass& pass, const ModelConfig& c,
                      const Model::Layer& L, const RwkvNorms& norms,
                      ForwardWorkspace& ws, float* delta);
// The time mix's x and xn without its token shift: a hybrid's attention
// layer in RWKV's block (rwkv6), which keeps no time-mix shift.
void RwkvMixerInput(const LayerPass& pass, const ModelConfig& c,
                    const Model::Layer& L, const RwkvNorms& norms,
                    ForwardWorkspace& ws);
void RwkvChannelMixInput(const LayerPass& pass, const ModelConfig& c,
                         const RwkvNorms& norms, ForwardWorkspace& ws,
                         float* delta);

// The channel mix's activation on `rows` rows of `width`: h ← max(h, 0)²
// (ReLU², NaN kept). Branch-free, so that it vectorises: a branch on the
// sign of each hidden unit mispredicts about half the time.
void RwkvReluSquare(float* h, uint64_t rows, uint64_t width);

// ws.extra1 cut into blocks of `widths` floats per row (capacity rows each,
// each block rounded up to 16 floats, 64 bytes): their starts, in order.
std::vector<float*> RwkvRowBlocks(ForwardWorkspace& ws,
                                  std::initializer_list<uint64_t> widths);

// The RWKV types' definitions: RWKV7Config's and RWKV6Config's common
// defaults (24 layers, sqrelu, norm_eps 1e-5, their own channel mix rather
// than an MLP), the final LayerNorm's bias, and the rule's spec.
class RwkvBlockDef : public ModelTypeDef {
 public:
  CommonDefaults defaults() const override;
  TensorNames names() const override;

 protected:
  using ModelTypeDef::ModelTypeDef;
  // state_heads heads of head_k × head_v under `rule`, a gate per key
  // channel, q and k as given, scale 1 (chunk_rwkv7's and chunk_rwkv6's).
  static AttentionSpec RuleSpec(const ModelConfig& c, UpdateRule rule);
};

}  // namespace linattn

#endif  // LINATTN_CORE_MODEL_TYPES_RWKV_BLOCK_H_
