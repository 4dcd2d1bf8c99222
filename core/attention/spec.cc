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

absl::string_view UpdateRuleName(UpdateRule rule) {
  switch (rule) {
    case UpdateRule::kLinear:
      return "linear";
    case UpdateRule::kGated:
      return "gated";
    case UpdateRule::kDelta:
      return "delta";
    case UpdateRule::kGatedDelta:
      return "gated_delta";
    case UpdateRule::kRwkv7:
      return "rwkv7";
    case UpdateRule::kRwkv6:
      return "rwkv6";
  }
  return "unknown";
}

absl::StatusOr<UpdateRule> ParseUpdateRule(absl::string_view name) {
  for (UpdateRule rule :
       {UpdateRule::kLinear, UpdateRule::kGated, UpdateRule::kDelta,
        UpdateRule::kGatedDelta, UpdateRule::kRwkv7, UpdateRule::kRwkv6}) {
    if (UpdateRuleName(rule) == name) return rule;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "rule: unknown '", name,
      "' (expected linear, gated, delta, gated_delta, rwkv7 or rwkv6)"));
}

absl::string_view GateShapeName(GateShape gate) {
  return gate == GateShape::kKey ? "key" : "head";
}

absl::StatusOr<GateShape> ParseGateShape(absl::string_view name) {
  if (name == "head") return GateShape::kHead;
  if (name == "key") return GateShape::kKey;
  return absl::InvalidArgumentError(
      absl::StrCat("gate: unknown '", name, "' (expected head or key)"));
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
  if (spec.rule != UpdateRule::kLinear) return d_phi * spec.value_dim;
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

namespace {

// The gated and delta rules' own fields, and what they leave out.
absl::Status ValidateRule(const AttentionSpec& spec) {
  const absl::string_view rule = UpdateRuleName(spec.rule);
  if (rule == "unknown") {
    return absl::InvalidArgumentError("rule: unknown value");
  }
  if (spec.gate != GateShape::kHead && spec.gate != GateShape::kKey) {
    return absl::InvalidArgumentError("gate: unknown value");
  }
  if (!std::isfinite(spec.scale) || spec.scale < 0.0f) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scale: must be finite and >= 0 (0 = 1), got ", spec.scale));
  }
  if (spec.rule == UpdateRule::kLinear) {
    if (spec.gate != GateShape::kHead) {
      return absl::InvalidArgumentError(
          "gate: only the gated rule takes per-key gates");
    }
    if (spec.qk_l2norm || spec.scale != 0.0f) {
      return absl::InvalidArgumentError(absl::StrCat(
          spec.qk_l2norm ? "qk_l2norm" : "scale",
          ": only the gated and delta rules take it (the linear rule's q "
          "and k go through its feature map)"));
    }
    if (!spec.bonus.empty()) {
      return absl::InvalidArgumentError(
          "bonus: only rule rwkv6 takes it (rule linear)");
    }
    return absl::OkStatus();
  }
  if (spec.feature_map != FeatureMapKind::kIdentity || spec.premapped) {
    return absl::InvalidArgumentError(absl::StrCat(
        "feature_map: rule ", rule,
        " takes q and k as given (identity; a model applies its own feature "
        "map first)"));
  }
  if (!spec.unnormalized) {
    return absl::InvalidArgumentError(
        absl::StrCat("unnormalized: rule ", rule,
                     " reads out S_tᵀq_t with no denominator; set it"));
  }
  if (spec.epsilon != 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("epsilon: rule ", rule, " has no denominator"));
  }
  if (!spec.decay.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "decay: rule ", rule,
        " takes no fixed decay (gates come per token as log-gates g)"));
  }
  if (spec.rule == UpdateRule::kRwkv6) {
    const uint64_t want = uint64_t{spec.num_heads} * spec.key_dim;
    if (spec.bonus.size() != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bonus: rule rwkv6 takes num_heads × key_dim = ", want,
          " values (u per head and key channel), got ", spec.bonus.size()));
    }
    for (size_t i = 0; i < spec.bonus.size(); ++i) {
      if (!std::isfinite(spec.bonus[i])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "bonus[", i, "]: must be finite, got ", spec.bonus[i]));
      }
    }
  } else if (!spec.bonus.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bonus: only rule rwkv6 takes it (rule ", rule, ")"));
  }
  if (spec.rule == UpdateRule::kRwkv7 || spec.rule == UpdateRule::kRwkv6) {
    if (spec.gate != GateShape::kKey) {
      return absl::InvalidArgumentError(
          absl::StrCat("gate: rule ", rule,
                       " decays each key channel on its own; set it to key"));
    }
  } else if (spec.gate == GateShape::kKey && spec.rule != UpdateRule::kGated) {
    return absl::InvalidArgumentError(
        absl::StrCat("gate: rule ", rule, " takes one gate per head"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateSpec(const AttentionSpec& spec) {
  if (auto s = CheckDim("num_heads", spec.num_heads); !s.ok()) return s;
  if (auto s = CheckDim("key_dim", spec.key_dim); !s.ok()) return s;
  if (auto s = CheckDim("value_dim", spec.value_dim); !s.ok()) return s;
  if (auto s = ValidateRule(spec); !s.ok()) return s;
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
