// Model: a loaded language model of one of fla's linear-attention layouts
// (config.h: linear_attn, retnet, gla, delta_net, gated_deltanet, mamba2,
// rwkv7, rwkv6; fla's hybrids of the first five with softmax-attention
// layers), immutable and shared by every session that uses it.
//
// A model directory holds config.json, model.safetensors (F32, F16 or BF16;
// or the shards model.safetensors.index.json names)
// and optionally a SentencePiece tokenizer.model (without one the model is
// byte-level). Load() checks every tensor's name and shape against the
// config, converts the weights to fp32 once, and packs them for the GEMMs:
// every projection a layer takes from its normed input as one matrix
// (linear_attn q|k|v; the others MixerColumns), gate and up as one matrix.
//
// The only per-session memory is ModelState: the state of every layer and
// head (S, and z for linear_attn) and the short convolutions' last W − 1
// inputs (rwkv7, rwkv6: the token shifts' last rows), nothing that grows with
// the context but a hybrid's keys and values (kv_cache.h).
//
//   auto model = Model::Load("models/tiny").value();
//   ModelState state = model->NewState();
//   ForwardRunner runner(model);            // forward.h
#ifndef LINATTN_CORE_MODEL_MODEL_H_
#define LINATTN_CORE_MODEL_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/attention/attention.h"
#include "core/model/chat_template.h"
#include "core/model/config.h"
#include "core/model/kv_cache.h"
#include "core/model/moe.h"
#include "core/model/tokenizer.h"
#include "core/onednn/linear.h"
#include "core/util/aligned_buffer.h"

namespace linattn {

// The recurrent state of one model session: one AttentionState per layer
// (all heads), at the same position (a hybrid's softmax-attention layers
// hold a position-only state of one 1 × 1 head, and their keys and values
// in kv()), and for models with short
// convolutions each layer's window of the last W − 1 inputs (time-major:
// W − 1 rows of conv_channels floats, oldest first; zeros at position 0).
// rwkv7's and rwkv6's window is their token shifts': the time mix's last normed
// input, then the channel mix's (hidden_size floats each).
class ModelState {
 public:
  ModelState() = default;
  ModelState(ModelState&&) noexcept = default;
  ModelState& operator=(ModelState&&) noexcept = default;

  ModelState Copy() const;
  // The same into this state's blocks (no allocation when the shapes agree).
  void CopyFrom(const ModelState& other);
  uint64_t position() const {
    return layers_.empty() ? 0 : layers_[0].position();
  }
  uint64_t bytes() const;  // attention states and windows
  std::vector<AttentionState>& layers() { return layers_; }
  const std::vector<AttentionState>& layers() const { return layers_; }
  // Layer l's convolution window (empty without short convolutions).
  std::vector<std::vector<float>>& conv() { return conv_; }
  const std::vector<std::vector<float>>& conv() const { return conv_; }
  // Hybrids: layer l's keys and values (an empty cache for recurrent
  // layers); empty for other models.
  std::vector<KvCache>& kv() { return kv_; }
  const std::vector<KvCache>& kv() const { return kv_; }
  uint64_t kv_bytes() const;

 private:
  friend class Model;
  std::vector<AttentionState> layers_;
  std::vector<std::vector<float>> conv_;
  std::vector<KvCache> kv_;
};

// Where each part of a gated or delta-rule layer's in_proj output starts,
// in the columns of one row. Attention types: q | k | v then their extras;
// the short convolution covers q|k|v (columns [0, conv_channels)). mamba2:
// z | x B C | dt as its in_proj is laid out, the convolution over x B C.
struct MixerColumns {
  uint32_t q = 0, k = 0, v = 0;  // mamba2: C, B and x
  uint32_t gate = 0;             // the output gate's g_proj; mamba2's z
  uint32_t gk = 0;               // GLA: gk_proj.0 (16 wide)
  uint32_t beta = 0;             // b_proj (delta rules with use_beta)
  uint32_t a = 0;                // gated_deltanet's a_proj; mamba2's dt
  uint32_t conv = 0;             // first column the convolution covers
  uint32_t width = 0;
};
// (The model type's, core/model/model_types.h.)
MixerColumns MixerColumnsOf(const ModelConfig& c);
// GLA's low-rank gate width (fla's gate_low_rank_dim, not configurable).
inline constexpr uint32_t kGlaGateRank = 16;

// A type's weights of one layer beyond Layer's fields (rwkv7's, rwkv6's),
// defined by the type (core/model/types/).
struct LayerExtras {
  virtual ~LayerExtras() = default;
  // Every projection kept here (the benchmarks count their products).
  virtual std::vector<const PackedLinear*> Projections() const = 0;
};

class Model {
 public:
  // Weights of one layer, fp32. The projections are prepacked
  // (PackedLinear); the small feature-map weights stay (out, in) row-major
  // as nn.Linear stores them.
  struct Layer {
    std::vector<float> attn_norm;       // hidden
    std::unique_ptr<PackedLinear> qkv;  // hidden → Dq + Dk + Dv
    // Feature-map weights for q and k (the same buffers when tied):
    // t2r W (d_k×d_k); hedgehog W (d_k×d_k) and b; elementwise_product
    // [W₁; W₂] (2d_k×d_k) and [b₁; b₂].
    AlignedBuffer fq_w, fk_w;
    std::vector<float> fq_b, fk_b;
    std::vector<float> head_norm;     // d_v, empty without elementwise_affine
    std::unique_ptr<PackedLinear> o;  // value_dim → hidden, adds
    std::vector<float> mlp_norm;      // hidden
    std::unique_ptr<PackedLinear> gate_up;  // hidden → 2·intermediate
    std::unique_ptr<PackedLinear> down;     // intermediate → hidden, adds
    // qwen3_next's shared_expert_gate (hidden): the MLP's output times
    // σ(w · its normed input); empty without one.
    std::vector<float> mlp_out_gate;
    // Mixture-of-experts beside the MLP (config().num_experts > 0), or null.
    std::unique_ptr<const Experts> experts;

    // The gated and delta-rule types. attn_norm is the mixer's input norm
    // (mamba2's `norm`), head_norm the output norm's weight (d_v, shared
    // by the heads; mamba2's gated norm: intermediate), o the o_proj
    // (mamba2's out_proj).
    std::unique_ptr<PackedLinear> in_proj;  // hidden → MixerColumns width
    std::vector<float> in_bias;             // mamba2 use_bias
    AlignedBuffer conv;  // W × channels: tap j, channel c at j·C + c
    std::vector<float> conv_bias;  // mamba2 use_conv_bias
    // GLA gk_proj.1 (16 → k_width), f32 whatever the projections' type.
    std::unique_ptr<PackedLinear> gk_up;
    std::vector<float> gk_bias;    // its bias, k_width
    std::vector<float> neg_exp_a;  // −exp(A_log) per state head (fp32)
    std::vector<float> dt_bias;    // per state head
    std::vector<float> d_skip;     // mamba2 D: per head or per channel
    // o_proj's bias: mamba2's under use_bias, a softmax-attention layer's
    // under o_bias (both × residual_multiplier).
    std::vector<float> out_bias;
    std::vector<float> log_decay;  // RetNet: log(1 − 2^(−5−h)) in fp32
    // RetNet's rotary frequencies, head_k / 2 (fp32 as torch computes them).
    std::vector<float> rotary_inv_freq;
    // The type's own (rwkv7, rwkv6: their time and channel mixes), or null.
    std::unique_ptr<const LayerExtras> extras;
    // (A hybrid's softmax-attention layer, config().attention_layer(l),
    // uses attn_norm, qkv for q|k|v_proj (and the output gate's rows),
    // in_bias for their biases under qkv_bias, o for o_proj and
    // rotary_inv_freq, half the rotated channels: softmax_attention.h.)
    std::vector<float> q_norm, k_norm;  // head_dim each, with qk_norm
  };

  // NOT_FOUND when a file is missing; INVALID_ARGUMENT naming the file and
  // field or tensor for anything malformed or inconsistent. `name` is how
  // clients refer to the model (default: the directory's last component).
  // `weights` is how the projections are packed (linear.h): f32, bf16 or
  // int8 (FAILED_PRECONDITION on a CPU without native products of the type).
  // `initial_state`, when given, is a state file (RWKV's habit: a tuned
  // initial state per layer, shared as a file) that every new session of
  // the model starts from instead of zeros: safetensors with one
  // blocks.<i>.att.time_state of (heads, head_v, head_k) per layer, each
  // head's S as RWKV keeps it (value × key; RWKV-PEFT's and rwkv.cpp's
  // orientation), for rwkv7 models. The model holds it once; it is part of
  // the fingerprint, so a snapshot of a session that started elsewhere is
  // refused. INVALID_ARGUMENT naming the file and tensor otherwise.
  static absl::StatusOr<std::shared_ptr<const Model>> Load(
      const std::string& dir, const std::string& name = "",
      WeightType weights = WeightType::kF32,
      const std::string& initial_state = "");

  const std::string& name() const { return name_; }
  // The name of a model loaded from `dir` without one: its last component.
  static std::string DefaultName(const std::string& dir);
  WeightType weight_type() const { return weight_type_; }
  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  // The chat template the directory names (chat_template.h), read when
  // the model loads; chat_template_note() says which file gave it, or why
  // it is refused or linattn's plain one is used.
  const ChatTemplate& chat_template() const { return *chat_template_; }
  const std::string& chat_template_note() const { return chat_template_note_; }
  // What of the checkpoint was left unread, and why ("" when nothing was):
  // tensors of parts linattn does not run that the type names as ignored.
  const std::string& ignored_note() const { return ignored_note_; }
  // 64-bit hash of the config and every tensor (names, shapes, bytes):
  // snapshots carry it and are refused by any other model.
  uint64_t fingerprint() const { return fingerprint_; }
  std::string fingerprint_hex() const;
  uint64_t parameter_count() const { return parameter_count_; }

  // The attention every layer runs: premapped features (φ applied by the
  // model), d_φ = config().feature_dim(), normalised per norm_feature_map
  // with fla's 1e-10 in the denominator.
  const Attention& attention() const { return *attention_; }

  // Zeros at position 0, or the initial state the model was loaded with.
  ModelState NewState() const;
  // The state file new sessions start from ("" without one).
  const std::string& initial_state_file() const { return initial_state_file_; }
  // Bytes of one session's state: layers × heads × (d_φ·d_v + d_φ) × 4
  // (the rule types: heads × d_k·d_v), plus the convolution windows (rwkv7,
  // rwkv6: the token-shift rows). A hybrid's softmax-attention layers add
  // their keys and values as the context grows (kv_bytes_per_token).
  uint64_t state_bytes() const;
  // Hybrids: the keys and values one more position adds over every
  // softmax-attention layer (a windowed layer's stop growing at its ring,
  // kv_bytes_at); 0 for other models.
  uint64_t kv_bytes_per_token() const;
  // The bytes of every layer's keys and values at `position`, as KvCache
  // allocates them (whole blocks).
  uint64_t kv_bytes_at(uint64_t position) const;
  // The most kv_bytes_at reaches: every layer's ring when each attention
  // layer is windowed; nullopt when one attends to the whole context.
  std::optional<uint64_t> kv_bytes_max() const;
  // A session's state at `position`: state_bytes() + kv_bytes_at(position)
  // (state_bytes() for models without softmax-attention layers). What a
  // server charges a session against its memory budget.
  uint64_t state_bytes_at(uint64_t position) const {
    return state_bytes() + kv_bytes_at(position);
  }
  // The most a copy of a session's state (a request's backup, a rollback
  // slot) comes to hold beyond what the session itself is charged: its
  // fixed part, plus the key/value blocks the session may write while the
  // copy shares them (KvCache is copy-on-write) — the one partly filled
  // block of a full-attention layer (later blocks are new, the session's
  // own), every block of a windowed layer's ring.
  uint64_t working_copy_bytes() const;
  // The attention states' part of it, and one layer's window in floats.
  uint64_t attention_state_bytes() const;
  uint64_t conv_window_floats() const;
  // True when `state` has this model's shape.
  bool Matches(const ModelState& state) const;

  const std::vector<Layer>& layers() const { return layers_; }
  const AlignedBuffer& embeddings() const { return embeddings_; }  // V×H
  const std::vector<float>& final_norm() const { return final_norm_; }
  // Its bias (empty without one; LayerNorm types with norm_bias).
  const std::vector<float>& final_norm_bias() const { return final_norm_bias_; }
  // hidden → vocab (the embeddings' matrix when tie_word_embeddings).
  const PackedLinear& lm_head() const { return *lm_head_; }
  // Every packed product of a forward step: each layer's (its type's own
  // too), then the lm_head.
  std::vector<const PackedLinear*> Projections() const;
  // Their weight_bytes(): what a decode step reads of the weights.
  uint64_t projection_bytes() const { return projection_bytes_; }

 private:
  Model() = default;
  // Load without the catch for an allocation that fails.
  static absl::StatusOr<std::shared_ptr<const Model>> LoadChecked(
      const std::string& dir, const std::string& name, WeightType weights,
      const std::string& initial_state);
  // Reads `path` into initial_state_ (Load's comment); `hash` receives
  // every tensor it holds, for the fingerprint.
  absl::Status LoadInitialState(
      const std::string& path,
      const std::function<void(const std::string&, const void*, size_t)>& hash);
  std::string name_;
  WeightType weight_type_ = WeightType::kF32;
  std::string dir_;
  ModelConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ChatTemplate> chat_template_;
  std::string chat_template_note_;
  std::string ignored_note_;
  std::unique_ptr<Attention> attention_;
  // A hybrid's softmax-attention layers' position-only state.
  std::unique_ptr<Attention> position_only_;
  uint64_t fingerprint_ = 0;
  uint64_t parameter_count_ = 0;
  uint64_t projection_bytes_ = 0;
  AlignedBuffer embeddings_;
  std::vector<Layer> layers_;
  std::vector<float> final_norm_;
  std::vector<float> final_norm_bias_;
  std::string initial_state_file_;
  std::unique_ptr<const ModelState> initial_state_;
  std::unique_ptr<PackedLinear> lm_head_;
};

// A hybrid's softmax-attention layers in one line, as the server logs
// them and --check prints them: "layers 0 (full), 3 (window 256); keys and
// values 4096 bytes per position, without bound".
std::string HybridSummary(const Model& model);

}  // namespace linattn

#endif  // LINATTN_CORE_MODEL_MODEL_H_
