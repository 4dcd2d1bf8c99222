#include "server/convert.h"

#include "absl/strings/str_cat.h"

namespace linattn {

absl::StatusOr<SpecRequest> FromProto(const v1::AttentionSpec& proto) {
  SpecRequest out;
  AttentionSpec& s = out.spec;
  s.num_heads = proto.num_heads();
  s.key_dim = proto.key_dim();
  s.value_dim = proto.value_dim();
  if (!proto.feature_map().empty()) {
    auto map = ParseFeatureMap(proto.feature_map());
    if (!map.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.", map.status().message()));
    }
    s.feature_map = *map;
  }
  s.unnormalized = proto.unnormalized();
  if (proto.has_epsilon()) out.epsilon = proto.epsilon();
  s.decay.assign(proto.decay().begin(), proto.decay().end());
  s.feature_dim = proto.feature_dim();
  s.seed = proto.seed();
  s.horizon = proto.horizon();
  if (!proto.rule().empty()) {
    auto rule = ParseUpdateRule(proto.rule());
    if (!rule.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.", rule.status().message()));
    }
    s.rule = *rule;
    // rwkv7 and rwkv6 decay each key channel: their only gate shape, the
    // default.
    if (s.rule == UpdateRule::kRwkv7 || s.rule == UpdateRule::kRwkv6) {
      s.gate = GateShape::kKey;
    }
  }
  if (!proto.gate().empty()) {
    auto gate = ParseGateShape(proto.gate());
    if (!gate.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.", gate.status().message()));
    }
    s.gate = *gate;
  }
  s.qk_l2norm = proto.qk_l2norm();
  s.scale = proto.scale();
  s.bonus.assign(proto.bonus().begin(), proto.bonus().end());
  // The gated, delta and rwkv7 rules take q and k as given: an unset feature
  // map is identity for them, and their read-out is unnormalised.
  if (s.rule != UpdateRule::kLinear && proto.feature_map().empty()) {
    s.feature_map = FeatureMapKind::kIdentity;
    s.unnormalized = true;
  }
  return out;
}

void ToProto(const AttentionSpec& spec, v1::AttentionSpec* proto) {
  proto->set_num_heads(spec.num_heads);
  proto->set_key_dim(spec.key_dim);
  proto->set_value_dim(spec.value_dim);
  proto->set_feature_map(std::string(FeatureMapName(spec.feature_map)));
  proto->set_unnormalized(spec.unnormalized);
  proto->set_epsilon(spec.epsilon);
  proto->mutable_decay()->Assign(spec.decay.begin(), spec.decay.end());
  proto->set_feature_dim(FeatureDim(spec));
  proto->set_seed(spec.seed);
  proto->set_horizon(spec.horizon);
  proto->set_rule(std::string(UpdateRuleName(spec.rule)));
  if (spec.rule == UpdateRule::kGated || spec.rule == UpdateRule::kRwkv7 ||
      spec.rule == UpdateRule::kRwkv6) {
    proto->set_gate(std::string(GateShapeName(spec.gate)));
  }
  proto->set_qk_l2norm(spec.qk_l2norm);
  proto->set_scale(spec.scale);
  proto->mutable_bonus()->Assign(spec.bonus.begin(), spec.bonus.end());
}

void ToProto(const SessionInfo& info, v1::Session* proto) {
  proto->set_session_id(info.id);
  ToProto(info.spec, proto->mutable_spec());
  proto->set_position(info.position);
  proto->set_state_bytes(info.state_bytes);
  proto->set_feature_dim(info.feature_dim);
  proto->set_idle_ms(info.idle_ms);
}

}  // namespace linattn
