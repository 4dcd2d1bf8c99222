// ForwardRunner: the model's forward pass over a batch of sessions.
//
// One Run() takes any mix of sessions: a decode token (one id) or a prompt
// piece (many ids) each. All of their rows go through every layer together:
//   rmsnorm → (q|k|v) GEMM → feature map (φ, norm_q/k, q·d_φ^−½)
//   → attention: one-token items in one StepBatch (recurrent step),
//     longer pieces in one chunkwise prefill batch
//   → per-head rmsnorm → o_proj GEMM (+residual)
//   → rmsnorm → (gate|up) GEMM → SiLU(gate)·up → down GEMM (+residual)
// and the final norm and lm_head GEMM run only for rows whose logits are
// wanted. The projections run over all rows of the batch (PackedLinear:
// the panel kernels on AVX2, oneDNN's matmul elsewhere); a learned feature
// map's small product runs on oneDNN's sgemm over rows × heads.
//
// The gated and delta-rule types (retnet, gla, delta_net, gated_deltanet,
// mamba2; forward_mixers.cc) replace the attention block by their mixer:
//   rmsnorm → in_proj GEMM (every projection at once) → short convolution
//   over each session's rows, continuing its window → q, k, v, gates and β
//   per type → the gated/delta rule (StepBatch or chunkwise, as above)
//   → output norm (× SiLU gate) → o_proj GEMM (+residual)
// followed by the same MLP block (mamba2 has none).
//
// Long prompts go through in passes of at most `max_rows` rows, so the
// workspaces are bounded whatever the prompt length.
//
// All input is validated before any state changes. A Run that fails later
// (a oneDNN primitive that cannot be created, activations that are not
// finite) leaves the states unspecified: atomicity is the caller's, who
// keeps the one backup it needs (the generation engine's jobs do,
// core/scheduler/generation_job.h); nothing here copies a state. Not
// thread-safe: one runner per thread (the model itself is shared).
#ifndef LINATTN_CORE_MODEL_FORWARD_H_
#define LINATTN_CORE_MODEL_FORWARD_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "core/attention/chunkwise.h"
#include "core/model/model.h"
#include "core/util/aligned_buffer.h"

namespace linattn {

struct ForwardItem {
  ModelState* state = nullptr;
  std::span<const int32_t> tokens;  // at least one id, each < vocab_size
  // vocab_size floats: the next-token logits after the last token.
  float* logits = nullptr;
  // tokens × vocab_size floats: the logits after every token (tests).
  float* all_logits = nullptr;
  // For a one-token item: another state of the model that receives the
  // state after the token (windows, position and all), `state` being left
  // as it was (its magnitude bounds aside, which the checks may tighten). The
  // generation engine keeps the state from before a token it may have to take
  // back this way, without copying it. Distinct from every state and `into` of
  // the batch.
  ModelState* into = nullptr;
};

struct ForwardOptions {
  uint32_t max_rows = 512;  // rows (tokens) per pass
  ChunkwiseOptions chunkwise;
};

class ForwardRunner {
 public:
  explicit ForwardRunner(std::shared_ptr<const Model> model,
                         ForwardOptions options = {});

  // Runs every item; each state may appear once. INVALID_ARGUMENT naming
  // the item and field for bad input (nothing changed); after a failure
  // later the states are unspecified (see the file comment).
  absl::Status Run(std::span<const ForwardItem> items);
  // One item.
  absl::Status Run(ModelState& state, std::span<const int32_t> tokens,
                   float* logits);

  const Model& model() const { return *model_; }

 private:
  struct Piece {
    uint32_t item;
    uint64_t first;  // index of the first token of the item in this pass
    uint32_t rows;
    uint32_t row0;      // first row in the pass
    uint64_t position;  // the session's position before this piece
  };
  // One pass: the rows of `pieces` through every layer, as named blocks.
  absl::Status Pass(std::span<const ForwardItem> items,
                    std::span<const Piece> pieces, uint32_t rows);
  void Embed(std::span<const ForwardItem> items, std::span<const Piece> pieces);
  absl::Status AttentionBlock(std::span<const ForwardItem> items,
                              std::span<const Piece> pieces, uint32_t rows,
                              size_t layer);
  absl::Status MlpBlock(const Model::Layer& layer, uint32_t rows);
  // The gated and delta-rule types' mixer block (forward_mixers.cc): x +=
  // o_proj(out(rule(q, k, v, g, β))) from in_proj(rmsnorm(x)).
  absl::Status MixerBlock(std::span<const ForwardItem> items,
                          std::span<const Piece> pieces, uint32_t rows,
                          size_t layer);
  // The causal depthwise convolution over the columns it covers, per
  // piece continuing (and then advancing) its session's window.
  void ShortConvolution(std::span<const ForwardItem> items,
                        std::span<const Piece> pieces, size_t layer);
  // proj_ into q_, k_, v_ (fq_, fk_, v_), g_ and beta_ per the type.
  absl::Status MixerInputs(std::span<const Piece> pieces, uint32_t rows,
                           const Model::Layer& layer);
  // o_ into the o_proj input: per-head norm and gate, mamba2's D skip and
  // grouped gated norm.
  void MixerOutputs(uint32_t rows, const Model::Layer& layer);
  // The layer's attention (its rule) over every piece: one-token pieces in
  // one StepBatch, longer ones in one chunkwise prefill, in place.
  absl::Status RunAttention(std::span<const ForwardItem> items,
                            std::span<const Piece> pieces, uint32_t rows,
                            size_t layer, const float* g, const float* beta);
  absl::Status Logits(std::span<const ForwardItem> items,
                      std::span<const Piece> pieces);
  // φ(q)·d_φ^−½ and φ(k) into fq_, fk_ and the values into v_, every
  // key/value head repeated over its group.
  absl::Status FeatureMaps(const Model::Layer& layer, uint32_t rows);
  void EnsureWorkspace(uint32_t rows);

  std::shared_ptr<const Model> model_;
  ForwardOptions options_;
  ChunkwiseRunner chunkwise_;
  uint32_t capacity_ = 0;
  AlignedBuffer x_;      // rows × H   residual stream
  AlignedBuffer xn_;     // rows × H   normalised
  AlignedBuffer qkv_;    // rows × (Dq + Dk + Dv)
  AlignedBuffer heads_;  // rows × heads × d_k  (gathered q or k, learned maps)
  AlignedBuffer mapped_;  // rows × heads × (2)d_k (learned maps' linear output)
  AlignedBuffer fq_;      // rows × heads × d_φ
  AlignedBuffer fk_;      // rows × heads × d_φ
  AlignedBuffer v_;       // rows × heads × d_v
  AlignedBuffer o_;       // rows × heads × d_v
  AlignedBuffer den_;     // rows × heads
  std::vector<uint8_t> available_;
  AlignedBuffer gu_;           // rows × 2I
  AlignedBuffer act_;          // rows × I
  AlignedBuffer logits_rows_;  // rows × H (final-normed rows needing logits)
  AlignedBuffer logits_out_;   // rows × V
  // The gated and delta-rule types.
  AlignedBuffer proj_;           // rows × MixerColumns width
  AlignedBuffer g_;              // rows × heads × (1 or d_k) log-gates
  AlignedBuffer beta_;           // rows × heads
  AlignedBuffer low_rank_;       // rows × 16 (GLA's gk_proj.0 output)
  AlignedBuffer gk_;             // rows × k_width (GLA's gk_proj.1 output)
  AlignedBuffer conv_ext_;       // (rows + W − 1) × channels
  std::vector<float> inv_freq_;  // RetNet's rotary frequencies, head_k / 2
};

}  // namespace linattn

#endif  // LINATTN_CORE_MODEL_FORWARD_H_
