#include "core/attention/state.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "core/attention/kernels.h"

namespace linattn {

namespace {
uint64_t StateFloats(const AttentionSpec& spec) {
  uint64_t floats = uint64_t{spec.num_heads} * StateFloatsPerHead(spec);
  if (spec.feature_map == FeatureMapKind::kFavor) floats += spec.num_heads;
  return floats;
}
}  // namespace

uint64_t StateBytes(const AttentionSpec& spec) {
  return StateFloats(spec) * sizeof(float);
}

AttentionState::AttentionState(const AttentionSpec& spec)
    : num_heads_(spec.num_heads),
      feature_dim_(FeatureDim(spec)),
      value_dim_(spec.value_dim),
      has_key_shift_(spec.feature_map == FeatureMapKind::kFavor),
      has_z_(spec.rule == UpdateRule::kLinear),
      bound_is_norm_(StateBoundIsNorm(spec.rule)),
      head_stride_(StateFloatsPerHead(spec)),
      shift_offset_(uint64_t{spec.num_heads} * StateFloatsPerHead(spec)),
      block_(StateFloats(spec)) {
  // block_ is zero already: Reset's other fields only.
  if (has_key_shift_) {
    for (uint32_t h = 0; h < num_heads_; ++h) key_shift(h) = -INFINITY;
  }
}

void AttentionState::Reset() {
  if (block_.size() != 0) {
    std::memset(block_.data(), 0, block_.size() * sizeof(float));
  }
  if (has_key_shift_) {
    for (uint32_t h = 0; h < num_heads_; ++h) key_shift(h) = -INFINITY;
  }
  position_ = 0;
  magnitude_bound_ = 0.0;
}

double AttentionState::MeasureMagnitude() {
  const uint32_t bits =
      ActiveKernels().max_abs_bits(shift_offset_, block_.data());
  double most = bits >= 0x7f800000u ? INFINITY : std::bit_cast<float>(bits);
  if (bound_is_norm_) {
    most *= std::sqrt(static_cast<double>(feature_dim_) * value_dim_);
  }
  magnitude_bound_ = most;
  return most;
}

AttentionState AttentionState::Copy() const {
  AttentionState out;
  out.num_heads_ = num_heads_;
  out.feature_dim_ = feature_dim_;
  out.value_dim_ = value_dim_;
  out.has_key_shift_ = has_key_shift_;
  out.has_z_ = has_z_;
  out.bound_is_norm_ = bound_is_norm_;
  out.head_stride_ = head_stride_;
  out.shift_offset_ = shift_offset_;
  out.position_ = position_;
  out.magnitude_bound_ = magnitude_bound_;
  out.block_ = block_.Copy();
  return out;
}

void AttentionState::CopyFrom(const AttentionState& other) {
  if (block_.size() != other.block_.size() || num_heads_ != other.num_heads_ ||
      feature_dim_ != other.feature_dim_ || value_dim_ != other.value_dim_ ||
      has_key_shift_ != other.has_key_shift_ || has_z_ != other.has_z_ ||
      bound_is_norm_ != other.bound_is_norm_) {
    *this = other.Copy();
    return;
  }
  std::memcpy(block_.data(), other.block_.data(),
              block_.size() * sizeof(float));
  position_ = other.position_;
  magnitude_bound_ = other.magnitude_bound_;
}

bool AttentionState::Matches(const AttentionSpec& spec) const {
  return num_heads_ == spec.num_heads && feature_dim_ == FeatureDim(spec) &&
         value_dim_ == spec.value_dim &&
         has_key_shift_ == (spec.feature_map == FeatureMapKind::kFavor) &&
         has_z_ == (spec.rule == UpdateRule::kLinear) &&
         bound_is_norm_ == StateBoundIsNorm(spec.rule);
}

}  // namespace linattn
