// Mamba-2's mixer as a rule type (core/model/types/rule_mixer.h): fla's
// mamba2 (mamba2.cc), and the recurrent layers of granitemoehybrid
// (granitemoehybrid.cc), which read their own config fields and names.
#ifndef LINATTN_CORE_MODEL_TYPES_MAMBA2_H_
#define LINATTN_CORE_MODEL_TYPES_MAMBA2_H_

#include <string>

#include "core/model/types/rule_mixer.h"

namespace linattn {

// The fields after the heads (c.num_heads set): the state size, B/C groups,
// the convolution's width and bias and the projections' bias, under a
// type's names; B/C groups must divide the heads.
struct Mamba2Fields {
  const char* state_size;
  uint32_t state_size_default;
  const char* n_groups;
  const char* conv_kernel;
  const char* conv_bias;
  const char* bias;
};
absl::Status ReadMamba2Shape(const json& j, const Mamba2Fields& f,
                             ModelConfig& c);
// dt's clamp [min, max] from `field` (0 ≤ min ≤ max; [0, ∞) when absent).
absl::Status ReadTimeStepLimit(const json& j, const char* field,
                               ModelConfig& c);

class Mamba2Def : public RuleMixer {
 public:
  Mamba2Def() : RuleMixer(ModelType::kMamba2, "mamba2", "Mamba2Mixer") {}

  CommonDefaults defaults() const override {
    CommonDefaults d;
    d.layers = 48;
    d.hidden_act = "silu";  // its convolution's (the same function)
    d.norm_eps = 1e-5;
    d.layer_norm_epsilon = true;
    d.mlp = false;
    return d;
  }
  absl::Status ReadConfig(const json& j, ModelConfig& c) const override;
  // fla's Mamba2 is `backbone.*` (mamba_ssm's checkpoints say
  // `backbone.embedding`).
  TensorNames names() const override {
    TensorNames n;
    n.base = "backbone.";
    n.input_norm = "norm.weight";
    n.embeddings = {"backbone.embeddings.weight", "backbone.embedding.weight"};
    n.final_norm = "backbone.norm_f.weight";
    return n;
  }
  MixerColumns Columns(const ModelConfig& c) const override {
    // z | x B C | dt, as its in_proj is laid out; the convolution over
    // x B C.
    MixerColumns m;
    const uint32_t I = c.mamba_inner, GN = c.n_groups * c.state_size;
    m.gate = 0;
    m.conv = m.v = I;
    m.k = 2 * I;
    m.q = 2 * I + GN;
    m.a = 2 * I + 2 * GN;
    m.width = m.a + c.num_heads;
    return m;
  }
  absl::Status LoadMixer(TensorReader& r, const ModelConfig& c,
                         const std::string& layer, WeightType weights,
                         Model::Layer& L) const override;

 protected:
  using RuleMixer::RuleMixer;
  // The module under the layer's prefix its tensors are in.
  virtual const char* MixerModule() const { return "mixer."; }
  bool scaled() const override { return false; }
  uint64_t ExtraWidth(const ModelConfig& c) const override {
    return 2 * uint64_t{c.mamba_inner} +
           2 * uint64_t{c.n_groups} * c.state_size + c.num_heads;
  }
  const char* size_field() const override { return "state_size"; }
  const char* head_field() const override { return "state_size"; }
  absl::Status Inputs(ForwardRunner& runner, const LayerPass& pass,
                      const Model::Layer& L) const override;
  void Outputs(ForwardRunner& runner, const LayerPass& pass,
               const Model::Layer& L) const override;
};

}  // namespace linattn

#endif  // LINATTN_CORE_MODEL_TYPES_MAMBA2_H_
