#include "core/model/model_types.h"

#include <array>

#include "core/model/forward.h"
#include "core/model/row_ops.h"
#include "core/model/softmax_attention.h"

namespace linattn {

std::span<const ModelTypeDef* const> ModelTypes() {
  // In ModelType's order.
  static const std::array<const ModelTypeDef*, 10> kTypes = {
      &LinearAttnType(),       &RetNetType(),   &GlaType(),   &DeltaNetType(),
      &GatedDeltaNetType(),    &Mamba2Type(),   &Rwkv7Type(), &Rwkv6Type(),
      &GraniteMoeHybridType(), &Qwen3NextType()};
  return kTypes;
}

const ModelTypeDef& ModelTypeOf(ModelType type) {
  return *ModelTypes()[static_cast<size_t>(type)];
}

const ModelTypeDef* FindModelType(absl::string_view name) {
  for (const ModelTypeDef* def : ModelTypes()) {
    if (def->name() == name) return def;
  }
  return nullptr;
}

void ScaleResidualBranch(const ModelConfig& c, AlignedBuffer& w,
                         std::vector<float>& bias) {
  const float m = static_cast<float>(c.residual_multiplier);
  if (m == 1.0f) return;
  for (uint64_t i = 0; i < w.size(); ++i) w.data()[i] *= m;
  for (float& b : bias) b *= m;
}

absl::Status ModelTypeDef::RunAttentionBlock(ForwardRunner& runner,
                                             const LayerPass& pass) const {
  const ModelConfig& c = runner.model().config();
  ForwardWorkspace& ws = runner.workspace();
  RmsNorm(ws.x.data(), pass.rows, c.hidden_size,
          runner.model().layers()[pass.layer].attn_norm.data(), c.norm_eps,
          ws.xn.data());
  return RunSoftmaxAttention(runner, pass);
}

absl::string_view ModelTypeName(ModelType type) {
  return ModelTypeOf(type).name();
}

}  // namespace linattn
