// RuleMixer: what the gated and delta-rule model types share (retnet, gla,
// delta_net, gated_deltanet, mamba2; docs/design.md §1, "Model types"). A
// layer's mixer is
//   rmsnorm → in_proj GEMM (every projection at once, MixerColumns)
//   → short convolution over each session's rows, continuing its window
//   → q, k, v, gates and β (Inputs: the type's shaping of each head)
//   → the state's rule (StepBatch or chunkwise, forward.h)
//   → output norm (× SiLU gate) (Outputs) → o_proj GEMM (+residual)
// and its weights are fla's q/k/v_proj (stacked with the type's own
// projections and the output gate's), q/k/v_conv1d, the output norm and
// o_proj. Each type adds its own through the hooks below; mamba2, whose
// in_proj and norm differ, replaces more of them.
#ifndef LINATTN_CORE_MODEL_TYPES_RULE_MIXER_H_
#define LINATTN_CORE_MODEL_TYPES_RULE_MIXER_H_

#include <cmath>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/attention/kernels.h"
#include "core/model/forward.h"
#include "core/model/model_types.h"
#include "core/model/tensor_reader.h"
#include "core/util/row_view.h"

namespace linattn {

// The elementwise maps of the layers, as torch computes them in fp32.
inline float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float Silu(float x) { return x / (1.0f + std::exp(-x)); }
// torch's softplus (β = 1, threshold 20), as fla and mamba_ssm use it.
inline float Softplus(float x) {
  return x > 20.0f ? x : std::log1p(std::exp(x));
}
// log σ(x) without overflow on either side.
inline float LogSigmoid(float x) {
  return x < 0 ? x - std::log1p(std::exp(x)) : -std::log1p(std::exp(-x));
}

// The names of fla's ACT2FN a type takes for its feature_map besides null,
// relu, sigmoid, silu and swish.
struct QkMapNames {
  std::span<const std::pair<const char*, QkActivation>> extra;
  const char* listed;  // every name it takes, for the error
};
// RetNet's MultiScaleRetention and GLA's GatedLinearAttention: q heads and
// k/v heads (GQA), widths from expand_k/expand_v (defaults given), their
// feature_map, an output gate and its norm.
absl::Status ReadGroupedHeads(const json& j, ModelConfig& c, uint32_t heads,
                              double expand_k, double expand_v,
                              const QkMapNames& maps);
// DeltaNet and Gated DeltaNet: the output gate (`use_gate`, default
// `gate`), the short convolution, negative eigenvalues; the output norm
// is always affine.
absl::Status ReadDeltaCommon(const json& j, ModelConfig& c, bool gate);
// num_heads heads of d_k × d_v from expand_k and expand_v (defaults given),
// each width divided evenly among the heads; one state head per head.
absl::Status ReadHeadWidths(const json& j, ModelConfig& c, double expand_k,
                            double expand_v);

class RuleMixer : public ModelTypeDef {
 public:
  AttentionSpec Spec(const ModelConfig& c) const override;
  MixerColumns Columns(const ModelConfig& c) const override;
  absl::Status CheckSizes(const ModelConfig& c) const override;
  absl::Status LoadMixer(TensorReader& r, const ModelConfig& c,
                         const std::string& layer, WeightType weights,
                         Model::Layer& L) const override;
  absl::Status RunMixer(ForwardRunner& runner,
                        const LayerPass& pass) const override;

 protected:
  using ModelTypeDef::ModelTypeDef;

  // --- The rule ---
  virtual UpdateRule rule() const { return UpdateRule::kGated; }
  virtual GateShape gate() const { return GateShape::kHead; }
  // q × d_k^−½ before the rule (not mamba2's C).
  virtual bool scaled() const { return true; }

  // --- Sizes (CheckSizes) ---
  // A width beyond the heads' (mamba2's in_proj) and the fields that name
  // the sizes in errors.
  virtual uint64_t ExtraWidth(const ModelConfig&) const { return 0; }
  virtual const char* size_field() const { return "num_heads"; }
  virtual const char* head_field() const { return "head_dim"; }

  // --- Weights (fla's names under `p`, the layer's "attn.") ---
  // The type's projections after q|k|v in in_proj, and where they start.
  virtual void ExtraProjections(
      const TensorReader&, const ModelConfig&, const std::string& /*p*/,
      std::vector<std::pair<std::string, int64_t>>& /*parts*/) const {}
  virtual void ExtraColumns(const ModelConfig&, MixerColumns&,
                            uint32_t& /*at*/) const {}
  // The type's other tensors (decays, gate weights).
  virtual absl::Status LoadExtras(TensorReader&, const ModelConfig&,
                                  const std::string& /*p*/,
                                  Model::Layer&) const {
    return absl::OkStatus();
  }
  // The output norm's weight (d_v, shared by the heads).
  virtual std::string HeadNormName(const TensorReader& r, const ModelConfig& c,
                                   const std::string& p) const;

  // --- Forward ---
  // What the type computes from the whole pass before its heads (GLA's
  // gate products).
  virtual absl::Status PrepareInputs(ForwardRunner&, const LayerPass&,
                                     const Model::Layer&) const {
    return absl::OkStatus();
  }
  // One (row, head) after q, k and v were shaped (activation, feature map,
  // sum norm): the type's rotation, log-gates and β.
  struct Head {
    const ModelConfig& c;
    const Model::Layer& L;
    const MixerColumns& cols;
    const ForwardWorkspace& ws;
    const float* in;  // the row's in_proj output
    uint64_t row;
    uint32_t h;
    uint64_t position;  // of the row in its session
    float* q;
    float* k;
    float* g;     // the head's log-gates (1 or d_k)
    float* beta;  // the row's β (all heads)
  };
  virtual void HeadInputs(const Head&) const {}
  // q, k, v, g and β of every row and head into the workspace.
  virtual absl::Status Inputs(ForwardRunner& runner, const LayerPass& pass,
                              const Model::Layer& L) const;
  // The heads' outputs into o_proj's input: per head RMSNorm over d_v with
  // the heads' shared weight, times SiLU(g_proj(x)) with an output gate.
  virtual void Outputs(ForwardRunner& runner, const LayerPass& pass,
                       const Model::Layer& L) const;

  // What every step of a layer's pass reads: the config, the workspace,
  // the pass's rows and the in_proj output's columns.
  struct PassRows {
    const ModelConfig& c;
    ForwardWorkspace& ws;
    uint32_t rows;
    MixerColumns cols;
    RowView<const float> proj;  // rows × cols.width
  };
  PassRows RowsOf(ForwardRunner& runner, const LayerPass& pass) const;

  // A's and dt's parameters (gated_deltanet, mamba2): −exp(A_log) and
  // dt_bias per state head.
  static absl::Status LoadDecay(TensorReader& r, const ModelConfig& c,
                                const std::string& p, Model::Layer& L);
};

}  // namespace linattn

#endif  // LINATTN_CORE_MODEL_TYPES_RULE_MIXER_H_
