// Model: a loaded linear-attention language model (fla `linear_attn`
// layout), immutable and shared by every session that uses it.
//
// A model directory holds config.json, model.safetensors (F32, F16 or BF16)
// and optionally a SentencePiece tokenizer.model (without one the model is
// byte-level). Load() checks every tensor's name and shape against the
// config, converts the weights to fp32 once, and packs them for the GEMMs:
// q/k/v projections as one (q|k|v) matrix, gate and up as one matrix.
//
// The only per-session memory is ModelState: S and z for every layer and
// head, nothing that grows with the context.
//
//   auto model = Model::Load("models/tiny").value();
//   ModelState state = model->NewState();
//   ForwardRunner runner(model);            // forward.h
#ifndef LINATTN_CORE_MODEL_MODEL_H_
#define LINATTN_CORE_MODEL_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/attention/attention.h"
#include "core/model/config.h"
#include "core/model/tokenizer.h"
#include "core/onednn/linear.h"
#include "core/util/aligned_buffer.h"

namespace linattn {

// The recurrent state of one model session: one AttentionState per layer
// (all heads), at the same position.
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
  uint64_t bytes() const;
  std::vector<AttentionState>& layers() { return layers_; }
  const std::vector<AttentionState>& layers() const { return layers_; }

 private:
  friend class Model;
  std::vector<AttentionState> layers_;
};

class Model {
 public:
  // Weights of one layer, fp32. The projections are prepacked for oneDNN's
  // matmul (PackedLinear); the small feature-map weights stay (out, in)
  // row-major as nn.Linear stores them.
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
  };

  // NOT_FOUND when a file is missing; INVALID_ARGUMENT naming the file and
  // field or tensor for anything malformed or inconsistent. `name` is how
  // clients refer to the model (default: the directory's last component).
  // `weights` is how the projections are packed (linear.h): f32, or bf16
  // (FAILED_PRECONDITION on a CPU without native bf16 products).
  static absl::StatusOr<std::shared_ptr<const Model>> Load(
      const std::string& dir, const std::string& name = "",
      WeightType weights = WeightType::kF32);

  const std::string& name() const { return name_; }
  WeightType weight_type() const { return weight_type_; }
  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  // 64-bit hash of the config and every tensor (names, shapes, bytes):
  // snapshots carry it and are refused by any other model.
  uint64_t fingerprint() const { return fingerprint_; }
  std::string fingerprint_hex() const;
  uint64_t parameter_count() const { return parameter_count_; }

  // The attention every layer runs: premapped features (φ applied by the
  // model), d_φ = config().feature_dim(), normalised per norm_feature_map
  // with fla's 1e-10 in the denominator.
  const Attention& attention() const { return *attention_; }

  ModelState NewState() const;
  // Bytes of one session's state: layers × heads × (d_φ·d_v + d_φ) × 4.
  uint64_t state_bytes() const;
  // True when `state` has this model's shape.
  bool Matches(const ModelState& state) const;

  const std::vector<Layer>& layers() const { return layers_; }
  const AlignedBuffer& embeddings() const { return embeddings_; }  // V×H
  const std::vector<float>& final_norm() const { return final_norm_; }
  // hidden → vocab (the embeddings' matrix when tie_word_embeddings).
  const PackedLinear& lm_head() const { return *lm_head_; }

 private:
  Model() = default;
  // Load without the catch for an allocation that fails.
  static absl::StatusOr<std::shared_ptr<const Model>> LoadChecked(
      const std::string& dir, const std::string& name, WeightType weights);
  std::string name_;
  WeightType weight_type_ = WeightType::kF32;
  std::string dir_;
  ModelConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Attention> attention_;
  uint64_t fingerprint_ = 0;
  uint64_t parameter_count_ = 0;
  AlignedBuffer embeddings_;
  std::vector<Layer> layers_;
  std::vector<float> final_norm_;
  std::unique_ptr<PackedLinear> lm_head_;
};

}  // namespace linattn

#endif  // LINATTN_CORE_MODEL_MODEL_H_
