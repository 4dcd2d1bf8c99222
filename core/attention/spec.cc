#include "core/attention/spec.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace linattn {

namespace {

constexpr FeatureMapKind kAllMaps[] = {
    FeatureMapKind::kElu1, FeatureMapKind::kRelu, FeatureMapKind::kIdentity,
    FeatureMapKind::kFavor, FeatureMapKind::kCosine};

absl::Status CheckDim(absl::string_view field, uint32_t value) {
  if (value == 0 || value > kMaxDim) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": must be in [1, ", kMaxDim, "], got ", value));
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view FeatureMapName(FeatureMapKind kind) {
  switch (kind) {
    case FeatureMapKind::kElu1:
      return "elu1";
    case FeatureMapKind::kRelu:
      return "relu";
    case FeatureMapKind::kIdentity:
      return "identity";
    case FeatureMapKind::kFavor:
      return "favor";
    case FeatureMapKind::kCosine:
      return "cosine";
  }
  return "unknown";
}

absl::StatusOr<FeatureMapKind> ParseFeatureMap(absl::string_view name) {
  for (FeatureMapKind kind : kAllMaps) {
    if (FeatureMapName(kind) == name) return kind;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("feature_map: unknown '", name,
                   "' (expected elu1, relu, identity, favor or cosine)"));
}

uint32_t FeatureDim(const AttentionSpec& spec) {
  switch (spec.feature_map) {
    case FeatureMapKind::kFavor:
      return spec.feature_dim != 0 ? spec.feature_dim : 2 * spec.key_dim;
    case FeatureMapKind::kCosine:
      return 2 * spec.key_dim;
    default:
      return spec.key_dim;
  }
}

uint64_t StateFloatsPerHead(const AttentionSpec& spec) {
  const uint64_t d_phi = FeatureDim(spec);
  return d_phi * spec.value_dim + d_phi;
}

uint64_t FeatureMapBytes(const AttentionSpec& spec) {
  if (spec.feature_map != FeatureMapKind::kFavor) return 0;
  return uint64_t{FeatureDim(spec)} * spec.key_dim * sizeof(float);
}

uint64_t FeatureMapSetupBytes(const AttentionSpec& spec) {
  if (spec.feature_map != FeatureMapKind::kFavor) return 0;
  return uint64_t{spec.key_dim} * spec.key_dim * sizeof(double);
}

absl::Status ValidateSpec(const AttentionSpec& spec) {
  if (auto s = CheckDim("num_heads", spec.num_heads); !s.ok()) return s;
  if (auto s = CheckDim("key_dim", spec.key_dim); !s.ok()) return s;
  if (auto s = CheckDim("value_dim", spec.value_dim); !s.ok()) return s;
  bool known = false;
  for (FeatureMapKind kind : kAllMaps) known |= kind == spec.feature_map;
  if (!known) {
    return absl::InvalidArgumentError("feature_map: unknown value");
  }
  if (spec.premapped && spec.feature_map != FeatureMapKind::kIdentity) {
    return absl::InvalidArgumentError(
        "premapped: only the identity feature map takes premapped features");
  }
  if (spec.feature_map == FeatureMapKind::kIdentity && !spec.unnormalized &&
      !spec.premapped) {
    return absl::InvalidArgumentError(
        "feature_map: identity can go negative, so its denominator φ(q)ᵀz "
        "can cancel; use it with unnormalized = true");
  }
  if (!std::isfinite(spec.epsilon) || spec.epsilon < 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("epsilon: must be finite and >= 0, got ", spec.epsilon));
  }
  if (!spec.decay.empty()) {
    if (spec.decay.size() != spec.num_heads) {
      return absl::InvalidArgumentError(absl::StrCat(
          "decay: expected ", spec.num_heads,
          " values (one per head) or none, got ", spec.decay.size()));
    }
    for (size_t h = 0; h < spec.decay.size(); ++h) {
      float g = spec.decay[h];
      if (!(g >= 0.0f && g <= 1.0f)) {  // also rejects NaN
        return absl::InvalidArgumentError(
            absl::StrCat("decay[", h, "]: must be in [0, 1], got ", g));
      }
    }
  }
  if (spec.feature_map == FeatureMapKind::kFavor) {
    if (spec.key_dim > kMaxFavorKeyDim) {
      return absl::InvalidArgumentError(absl::StrCat(
          "key_dim: favor takes at most ", kMaxFavorKeyDim,
          " (its projection is orthogonalised in d_k×d_k blocks), got ",
          spec.key_dim));
    }
    if (FeatureDim(spec) > kMaxFavorFeatureDim) {
      return absl::InvalidArgumentError(absl::StrCat(
          "feature_dim: favor takes at most ", kMaxFavorFeatureDim, ", got ",
          FeatureDim(spec),
          spec.feature_dim == 0 ? " (the default 2·key_dim)" : ""));
    }
  } else if (spec.feature_dim != 0 && spec.feature_dim != FeatureDim(spec)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "feature_dim: ", FeatureMapName(spec.feature_map),
        " has d_φ = ", FeatureDim(spec),
        "; leave feature_dim at 0 or set it to that, got ", spec.feature_dim));
  }
  if (spec.feature_map == FeatureMapKind::kCosine) {
    if (spec.horizon == 0) {
      return absl::InvalidArgumentError(
          "horizon: cosine needs a horizon M > 0 (the longest sequence the "
          "session will see)");
    }
  } else if (spec.horizon != 0) {
    return absl::InvalidArgumentError(
        "horizon: only the cosine feature map uses a horizon");
  }
  return absl::OkStatus();
}

}  // namespace linattn
