// Mixture-of-experts feed-forwards (ModelConfig::num_experts > 0): beside a
// layer's MLP, each token goes through experts_per_token of num_experts
// gated MLPs, chosen by a router, and their outputs are summed with the
// router's weights. granitemoehybrid's block_sparse_moe
// (transformers' GraniteMoeHybridMoE):
//   logits = router · x (fp32 weights whatever the projections' type)
//   the top k logits (ties to the lower index), gates = softmax of those k
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

struct Experts {
  std::unique_ptr<PackedLinear> router;  // hidden → experts, f32
  // Per expert: hidden → 2·expert_size (gate rows first), and
  // expert_size → hidden scaled by residual_multiplier (not adding).
  std::vector<std::unique_ptr<PackedLinear>> gate_up, down;
};

// The experts under `p` ("model.layers.3.block_sparse_moe."):
// router.layer.weight (E × H), input_linear.weight (E × 2I × H) and
// output_linear.weight (E × H × I), transformers' ParallelExperts layout.
absl::Status LoadExperts(TensorReader& r, const ModelConfig& c,
                         const std::string& p, WeightType weights,
                         Experts& out);

// x += the experts' sum for each of `rows` rows of the workspace's normed
// rows xn (the MLP block's input), in layer `layer` (named in errors).
absl::Status RunExperts(ForwardRunner& runner, const Experts& experts,
                        size_t layer, uint32_t rows);

}  // namespace linattn

#endif  // LINATTN_CORE_MODEL_MOE_H_
