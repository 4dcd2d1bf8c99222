#include "core/model/model_types.h"

#include <array>

namespace linattn {

std::span<const ModelTypeDef* const> ModelTypes() {
  // In ModelType's order.
  static const std::array<const ModelTypeDef*, 8> kTypes = {
      &LinearAttnType(),    &RetNetType(), &GlaType(),   &DeltaNetType(),
      &GatedDeltaNetType(), &Mamba2Type(), &Rwkv7Type(), &Rwkv6Type()};
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

absl::string_view ModelTypeName(ModelType type) {
  return ModelTypeOf(type).name();
}

}  // namespace linattn
