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
// Each layer's mixer is its model type's (core/model/model_types.h; the
// linear_attn block above, core/model/types/linear_attn.cc), or in a
// hybrid's softmax-attention layers fla's Attention over the session's
// keys and values (core/model/softmax_attention.h). The gated and
// delta-rule types (retnet, gla, delta_net, gated_deltanet, mamba2;
// core/model/types/rule_mixer.h) run:
//   rmsnorm → in_proj GEMM (every projection at once) → short convolution
//   over each session's rows, continuing its window → q, k, v, gates and β
//   per type → the gated/delta rule (StepBatch or chunkwise, as above)
//   → output norm (× SiLU gate) → o_proj GEMM (+residual)
// followed by the same MLP block (mamba2 has none).
//
// Long prompts go through in passes of at most `max_rows` rows, so the
// workspaces are bounded whatever the prompt length.
//
// A decode step of many sessions (one token each) of a small model is
// instead split into contiguous groups of sessions, one per OpenMP thread,
// each run through every layer by a runner of its own on its own core:
// every group reads every weight, but the rules, the elementwise passes and
// the products of a group all run where its activations are, with no
// fork/join per pass. A small model's products are too small to share well
// between cores. Measured on 2 cores (medians of three runs): rwkv7 at the
// built-in size (13 MiB of f32 projections, a dozen small products and
// row-by-row token shifts per layer) stepped 1.6×, 1.4× and 1.2× faster
// split at 16, 32 and 64 sessions; gated_deltanet at the built-in size
// (17 MiB) and rwkv7 at hidden 512 × 2 (26 MiB) 0.94–1.09× one team's
// speed; rwkv7 at hidden 512 × 8 (101 MiB) the same speed either way; and
// at hidden 1024 × 12 (~600 MiB) the split was 1.1–1.2× slower, hence
// kMaxGroupWeightBytes. In groups of 2 sessions gated_deltanet's step was
// 1.3–1.5× slower, hence kMinGroupSessions (docs/benchmarks.md, "Measured
// figures behind constants in the code"). Both constants were measured on
// 2 cores only.
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
  // vocab_size floats: the next-token logits after the last token. Each
  // item's buffers are its own (the items of a step may be run at once).
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

// One session's rows in one pass: `rows` tokens from tokens[first] of
// items[item], at rows [row0, row0 + rows) of the pass, the session standing
// at `position` before them.
struct ForwardPiece {
  uint32_t item;
  uint64_t first;
  uint32_t rows;
  uint32_t row0;
  uint64_t position;
};

// The rows of one pass through one layer, as its mixer sees them
// (core/model/model_types.h).
struct LayerPass {
  std::span<const ForwardItem> items;
  std::span<const ForwardPiece> pieces;
  uint32_t rows = 0;
  size_t layer = 0;
};

// The runner's workspaces: `capacity` rows each, of the widths given (H
// hidden, heads the state's, I the MLP's).
struct ForwardWorkspace {
  uint32_t capacity = 0;
  AlignedBuffer x;      // rows × H   residual stream
  AlignedBuffer xn;     // rows × H   normalised
  AlignedBuffer qkv;    // rows × (Dq + Dk + Dv)  (linear_attn)
  AlignedBuffer heads;  // rows × heads × d_k  (gathered q or k, learned maps)
  AlignedBuffer mapped;  // rows × heads × (2)d_k (learned maps' output)
  AlignedBuffer fq;      // rows × heads × d_φ (or d_k): the rule's q
  AlignedBuffer fk;      // rows × heads × d_φ (or d_k): the rule's k
  AlignedBuffer v;       // rows × heads × d_v
  AlignedBuffer o;       // rows × heads × d_v
  AlignedBuffer den;     // rows × heads
  std::vector<uint8_t> available;
  AlignedBuffer gu;           // rows × 2I
  AlignedBuffer act;          // rows × I
  AlignedBuffer logits_rows;  // rows × H (final-normed rows needing logits)
  AlignedBuffer logits_out;   // rows × V
  // The rule types.
  AlignedBuffer proj;      // rows × MixerColumns width
  AlignedBuffer g;         // rows × heads × (1 or d_k) log-gates
  AlignedBuffer beta;      // rows × heads
  AlignedBuffer conv_ext;  // (rows + W − 1) × channels
  // A type's own (GLA: its low-rank gate's two products), sized by it.
  AlignedBuffer extra1, extra2;
  // A hybrid's softmax-attention layers (softmax_attention.h): rows × the
  // widest q|k|v, and rows × hidden of their heads' outputs.
  AlignedBuffer attn_qkv, attn_o;
  // Mixture-of-experts (moe.h): rows × experts router logits, and one
  // expert's rows gathered (× H), its gate|up (× 2I), SiLU·up (× I) and
  // output (× H).
  AlignedBuffer moe_logits, moe_in, moe_gu, moe_act, moe_out;
};

// A decode step of many sessions (every item one token, at least
// kMinGroupSessions of them per thread) of a model whose products read at
// most kMaxGroupWeightBytes of weights runs as groups of sessions, one
// group per thread (see the file comment). Each group reads every weight,
// so above that size the step's products are better shared between the
// cores.
inline constexpr uint32_t kMinGroupSessions = 8;
inline constexpr uint64_t kMaxGroupWeightBytes = uint64_t{64} << 20;

struct ForwardOptions {
  uint32_t max_rows = 512;  // rows (tokens) per pass
  ChunkwiseOptions chunkwise;
  // Groups a decode step of many sessions runs as: 0 one per OpenMP thread
  // when every thread gets kMinGroupSessions and the weights are within
  // kMaxGroupWeightBytes (else one team), 1 never split (one team over the
  // whole batch), more: that many, or as many as have kMinGroupSessions
  // each, whatever the threads and weights (tests, benchmarks).
  uint32_t session_groups = 0;
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
  // The groups of sessions the last Run's step ran as (1: one team over
  // the batch; see ForwardOptions::session_groups).
  uint32_t last_session_groups() const { return last_session_groups_; }

  // --- For the mixers (core/model/model_types.h) ---
  ForwardWorkspace& workspace() { return ws_; }
  // The causal depthwise convolution over the columns of the in_proj
  // output it covers, per piece continuing (and then advancing) its
  // session's window.
  void ShortConvolution(const LayerPass& pass);
  // The layer's rule over every piece: q, k and v from the workspace's fq,
  // fk and v (rows × heads × the spec's widths), g and β (the gated and
  // delta rules) rows × heads (× d_k per key), into o. One-token pieces in
  // one StepBatch, longer ones in one chunkwise prefill, in place.
  // rwkv7's low-rank vectors a and b: rows × heads × d_k each.
  absl::Status RunAttention(const LayerPass& pass, const float* g,
                            const float* beta, const float* a = nullptr,
                            const float* b = nullptr);

 private:
  // One pass: the rows of `pieces` through every layer, as named blocks.
  absl::Status Pass(std::span<const ForwardItem> items,
                    std::span<const ForwardPiece> pieces, uint32_t rows);
  void Embed(std::span<const ForwardItem> items,
             std::span<const ForwardPiece> pieces);
  absl::Status MlpBlock(size_t layer, uint32_t rows);
  absl::Status Logits(std::span<const ForwardItem> items,
                      std::span<const ForwardPiece> pieces);
  void EnsureWorkspace(uint32_t rows);
  uint32_t SessionGroups(std::span<const ForwardItem> items) const;
  absl::Status RunGroups(std::span<const ForwardItem> items, uint32_t groups);
  absl::Status RunPasses(std::span<const ForwardItem> items);

  std::shared_ptr<const Model> model_;
  ForwardOptions options_;
  ChunkwiseRunner chunkwise_;
  ForwardWorkspace ws_;
  std::vector<std::unique_ptr<ForwardRunner>> groups_;
  uint32_t last_session_groups_ = 1;
};

}  // namespace linattn

#endif  // LINATTN_CORE_MODEL_FORWARD_H_
