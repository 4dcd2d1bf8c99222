// The model types linattn serves, in one table (model_types.cc). A type is
// one ModelTypeDef: how config.json's own fields of the type are read, how
// one layer's mixer loads its weights and runs in the batched forward, the
// state rule it runs, and the name of its reference in tools/linattn_ref.py
// (the PyTorch model, written from the type's upstream source, that the
// tests hold it to). Each lives in core/model/types/<type>.cc; the five
// rule types share the mixer flow of core/model/types/rule_mixer.h (rwkv7
// and rwkv6 run their whole block, channel mix included). A new type is a file
// there and a line in the table.
//
// Everything else — the common config fields, embeddings, the MLP, the
// final norm and lm_head, the session's state — is the model's, whatever
// the type (model.h, forward.h).
#ifndef LINATTN_CORE_MODEL_MODEL_TYPES_H_
#define LINATTN_CORE_MODEL_MODEL_TYPES_H_

#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/attention/spec.h"
#include "core/model/config.h"
#include "core/model/config_json.h"
#include "core/model/model.h"

namespace linattn {

class ForwardRunner;
class TensorReader;
struct LayerPass;

class ModelTypeDef {
 public:
  virtual ~ModelTypeDef() = default;

  ModelType type() const { return type_; }
  // config.json's model_type.
  absl::string_view name() const { return name_; }
  // The class in tools/linattn_ref.py that is its reference.
  absl::string_view reference() const { return reference_; }

  // --- config.json ---
  // The defaults of the fields every type has, where the type's fla config
  // class sets its own.
  struct CommonDefaults {
    uint32_t layers = 24;
    uint32_t vocab_size = 32000;
    // The activation when config.json names none, and the one it takes:
    // swish (or silu, the same), or rwkv7's sqrelu alone.
    const char* hidden_act = "swish";
    double norm_eps = 1e-6;
    // Older configs spell norm_eps layer_norm_epsilon (mamba2's).
    bool layer_norm_epsilon = false;
    // Whether blocks end with fla's GatedMLP, and its hidden_ratio when
    // config.json has none (a present null is GatedMLP's own 4).
    bool mlp = true;
    double hidden_ratio = 4;
    // attn_mode may also be "parallel" (RetNet's).
    bool parallel_mode = false;
    // The norms' ε is rms_norm_eps (transformers' types), not norm_eps.
    bool rms_norm_eps = false;
  };
  virtual CommonDefaults defaults() const { return {}; }
  // Reads the type's own fields into `c` (the common ones are read),
  // INVALID_ARGUMENT naming the field.
  virtual absl::Status ReadConfig(const json& j, ModelConfig& c) const = 0;
  // Every width the layer's buffers are cut into stays within linattn's
  // limits (checked in 64 bits once the config is read).
  virtual absl::Status CheckSizes(const ModelConfig& /*c*/) const {
    return absl::OkStatus();
  }

  // --- Weights ---
  // Where the file keeps the model's tensors (fla's names).
  struct TensorNames {
    std::string base = "model.";  // then "layers.<i>."
    std::string input_norm = "attn_norm.weight";
    std::vector<std::string> embeddings = {"model.embeddings.weight"};
    std::string final_norm = "model.norm.weight";
    // The final norm's bias (LayerNorm types; read when norm_bias), or empty.
    std::string final_norm_bias;
    // Under the layer's prefix: a hybrid's softmax-attention module, and
    // the MLP's norm and products (gate and up stacked, or one fused
    // matrix of 2·I rows, the gate's first, when `mlp_up` is empty).
    std::string attention = "attn.";
    std::string mlp_norm = "mlp_norm.weight";
    std::string mlp_gate = "mlp.gate_proj.weight";
    std::string mlp_up = "mlp.up_proj.weight";
    std::string mlp_down = "mlp.down_proj.weight";
    // Mixture-of-experts feed-forwards (num_experts > 0), or empty, and
    // their tensors under it.
    std::string experts;
    ExpertTensorNames expert_names;
    // A layer with experts keeps its MLP under these names when they are
    // given (qwen3_next's shared expert), and the MLP's output gate
    // (1 × hidden) with shared_expert_gate.
    std::string expert_mlp_gate, expert_mlp_up, expert_mlp_down;
    std::string expert_mlp_out_gate;
    // Tensors a checkpoint may carry that linattn does not run, by prefix
    // and what they are (qwen3_next's "mtp.", multi-token-prediction
    // layers): left unread, and said so in Model::ignored_note().
    struct Ignored {
      std::string prefix, what;
    };
    std::vector<Ignored> ignored;
  };
  virtual TensorNames names() const { return {}; }
  // The state rule every layer runs, with the shapes config.json implies.
  virtual AttentionSpec Spec(const ModelConfig& c) const = 0;
  // Where each part of the mixer's in_proj output starts (rule types).
  virtual MixerColumns Columns(const ModelConfig& /*c*/) const { return {}; }
  // One layer's mixer weights, its tensors under `layer` ("model.layers.3.")
  // into `L`, packed as `weights`.
  virtual absl::Status LoadMixer(TensorReader& r, const ModelConfig& c,
                                 const std::string& layer, WeightType weights,
                                 Model::Layer& L) const = 0;

  // --- Forward ---
  // x += mixer(rmsnorm(x)) for the rows of `pass` through its layer
  // (forward.h has the runner's workspaces and the steps mixers share).
  virtual absl::Status RunMixer(ForwardRunner& runner,
                                const LayerPass& pass) const = 0;

  // --- A hybrid's softmax-attention layers (softmax_attention.h) ---
  // The layer's weights around fla's Attention beyond attn_norm and the
  // attention's own (rwkv6: its block's other norms and its channel mix);
  // none for fla's common block.
  virtual absl::Status LoadAttentionBlock(TensorReader& /*r*/,
                                          const ModelConfig& /*c*/,
                                          const std::string& /*layer*/,
                                          WeightType /*weights*/,
                                          Model::Layer& /*L*/) const {
    return absl::OkStatus();
  }
  // The layer's block with Attention as its mixer: fla's common block by
  // default, x += Attention(rmsnorm(x)) (the MLP follows as in every
  // layer).
  virtual absl::Status RunAttentionBlock(ForwardRunner& runner,
                                         const LayerPass& pass) const;

 protected:
  ModelTypeDef(ModelType type, absl::string_view name,
               absl::string_view reference)
      : type_(type), name_(name), reference_(reference) {}

 private:
  const ModelType type_;
  const absl::string_view name_;
  const absl::string_view reference_;
};

// A residual branch's output projection `w` and its bias, times the
// config's residual_multiplier (granitemoehybrid's; nothing when it is 1).
void ScaleResidualBranch(const ModelConfig& c, AlignedBuffer& w,
                         std::vector<float>& bias);

// The table: every type, in ModelType's order.
std::span<const ModelTypeDef* const> ModelTypes();
const ModelTypeDef& ModelTypeOf(ModelType type);
// Null for a name no type has.
const ModelTypeDef* FindModelType(absl::string_view name);

// The types' definitions (core/model/types/).
const ModelTypeDef& LinearAttnType();
const ModelTypeDef& RetNetType();
const ModelTypeDef& GlaType();
const ModelTypeDef& DeltaNetType();
const ModelTypeDef& GatedDeltaNetType();
const ModelTypeDef& Mamba2Type();
const ModelTypeDef& Rwkv7Type();
const ModelTypeDef& Rwkv6Type();
const ModelTypeDef& GraniteMoeHybridType();
const ModelTypeDef& Qwen3NextType();

}  // namespace linattn

#endif  // LINATTN_CORE_MODEL_MODEL_TYPES_H_
