// Mixture-of-experts feed-forwards (ModelConfig::num_experts > 0): beside a
// layer's MLP, each token goes through experts_per_token of num_experts
// gated MLPs, chosen by a router, and their outputs are summed with the
// router's weights. granitemoehybrid's block_sparse_moe
// (transformers' GraniteMoeHybridMoE) and qwen3_next's sparse block
// (Qwen3NextSparseMoeBlock, its shared expert being the layer's MLP):
//   logits = router · x (fp32 weights whatever the projections' type)
//   the top k logits (ties to the lower index), and their gates:
//     granitemoehybrid: softmax of those k;
//     qwen3_next: softmax over all experts' logits at those k, divided by
//     their sum with norm_topk_prob (then the same as granitemoehybrid's)
//   x += residual_multiplier · Σ gate_e · down_e(SiLU(gate_e(x)) · up_e(x))
// with x the MLP's normed input. Experts run only for the tokens routed to
// them: the rows of a pass are grouped by expert and each expert's
// products run once over its rows.
#ifndef LINATTN_CORE_MODEL_MOE_H_
#define LINATTN_CORE_MODEL_MOE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/model/config.h"
#include "core/onednn/linear.h"

namespace linattn {

class TensorReader;
class ForwardRunner;

// The most experts a layer may have (Granite 4.0-H-Small has 72, Qwen3-Next
// 512; each is two packed products of its own).
inline constexpr uint32_t kMaxExperts = 4096;

// Where a layer's experts are, under its experts' prefix: the router's
// (E × H) weight; all experts' gate|up (E × 2I × H, gate rows first) and
// down (E × H × I) stacked in two tensors (transformers' ParallelExperts,
// and qwen3_next's fused experts from transformers v5); or, when `each` is
// given and the file holds "<each>0.gate_proj.weight", one Linear per
// expert: <each><e>.gate_proj, up_proj (I × H) and down_proj (H × I), as
// Qwen's checkpoints keep them.
struct ExpertTensorNames {
  std::string router = "router.layer.weight";
  std::string gate_up = "input_linear.weight";
  std::string down = "output_linear.weight";
  std::string each;
};

struct Experts {
  std::unique_ptr<PackedLinear> router;  // hidden → experts, f32
  // Per expert: hidden → 2·expert_size (gate rows first), and
  // expert_size → hidden scaled by residual_multiplier (not adding).
  std::vector<std::unique_ptr<PackedLinear>> gate_up, down;
};

// The experts under `p` ("model.layers.3.block_sparse_moe."), named as
// `names` says.
absl::Status LoadExperts(TensorReader& r, const ModelConfig& c,
                         const std::string& p, const ExpertTensorNames& names,
                         WeightType weights, Experts& out);

// x += the experts' sum for each of `rows` rows of the workspace's normed
// rows xn (the MLP block's input), in layer `layer` (named in errors).
absl::Status RunExperts(ForwardRunner& runner, const Experts& experts,
                        size_t layer, uint32_t rows);

}  // namespace linattn

#endif  // LINATTN_CORE_MODEL_MOE_H_
