// AttentionState: the fixed-size recurrent state of one session's layer.
//
// Per head h: S_h (d_φ×d_v, row-major) followed by z_h (d_φ) — the gated
// and delta rules keep S_h alone — all heads in one contiguous,
// 64-byte-aligned fp32 block; for FAVOR+ the block ends with
// one key log-scale per head (S_h and z_h are stored times e^{-shift_h}, see
// feature_map.h). The size never depends on how many tokens were consumed.
//
// Not thread-safe: a state is updated by one caller at a time (the session
// layer serialises steps). Copies are explicit: Copy() is O(state).
#ifndef LINATTN_CORE_ATTENTION_STATE_H_
#define LINATTN_CORE_ATTENTION_STATE_H_

#include <cmath>
#include <cstdint>

#include "core/attention/spec.h"
#include "core/util/aligned_buffer.h"

namespace linattn {

class AttentionState {
 public:
  // A zero state at position 0 for a valid spec. Throws std::bad_alloc if
  // the block cannot be allocated.
  explicit AttentionState(const AttentionSpec& spec);
  AttentionState(AttentionState&&) noexcept = default;
  AttentionState& operator=(AttentionState&&) noexcept = default;

  // Deep copy (state block and position).
  AttentionState Copy() const;
  // The same into this state's own block (no allocation when the shapes
  // already agree).
  void CopyFrom(const AttentionState& other);

  uint32_t num_heads() const { return num_heads_; }
  uint32_t feature_dim() const { return feature_dim_; }  // d_φ
  uint32_t value_dim() const { return value_dim_; }      // d_v
  bool has_key_shift() const { return has_key_shift_; }
  // False for the gated and delta rules, which keep no z.
  bool has_z() const { return has_z_; }

  float* s(uint32_t h) { return block_.data() + h * head_stride_; }
  const float* s(uint32_t h) const { return block_.data() + h * head_stride_; }
  // z of head h; only valid when has_z().
  float* z(uint32_t h) { return s(h) + uint64_t{feature_dim_} * value_dim_; }
  const float* z(uint32_t h) const {
    return s(h) + uint64_t{feature_dim_} * value_dim_;
  }
  // FAVOR+ key log-scale of head h (−inf before the first key); only valid
  // when has_key_shift().
  float& key_shift(uint32_t h) { return block_.data()[shift_offset_ + h]; }
  float key_shift(uint32_t h) const { return block_.data()[shift_offset_ + h]; }

  // Tokens consumed so far.
  uint64_t position() const { return position_; }
  void set_position(uint64_t position) { position_ = position; }

  // The whole block: heads × (d_φ·d_v + d_φ) floats (d_φ·d_v without z),
  // then the FAVOR+ shifts.
  // Writing through data() (a restore) leaves the magnitude bound unknown
  // (+inf), so the next step measures the state before it trusts a bound.
  float* data() {
    magnitude_bound_ = INFINITY;
    return block_.data();
  }
  const float* data() const { return block_.data(); }
  uint64_t size() const { return block_.size(); }
  // Exact bytes of state: heads × (d_φ·d_v + d_φ) × 4, plus heads × 4 for
  // FAVOR+'s key log-scales.
  uint64_t bytes() const { return block_.size() * sizeof(float); }

  // An upper bound on every |entry| of S and z, kept by the evaluation orders
  // so that a step which could overflow the state is found without reading
  // the state (docs/design.md, "Overflow").
  double magnitude_bound() const { return magnitude_bound_; }
  void set_magnitude_bound(double bound) { magnitude_bound_ = bound; }
  // Measures the state (O(state)), tightens the bound to it and returns the
  // new bound: the largest |entry| of S and z over all heads, exactly; for
  // the delta rules, whose bound is one on each head's Frobenius norm,
  // √(d_k·d_v) times that. +inf when an entry is NaN or ±inf.
  double MeasureMagnitude();
  // Whether magnitude_bound() bounds each head's Frobenius norm (the delta
  // rules) rather than each entry.
  bool bound_is_norm() const { return bound_is_norm_; }

  // True when this state has the shape `spec` describes.
  bool Matches(const AttentionSpec& spec) const;
  // Back to zero at position 0.
  void Reset();

 private:
  AttentionState() = default;

  uint32_t num_heads_ = 0;
  uint32_t feature_dim_ = 0;
  uint32_t value_dim_ = 0;
  bool has_key_shift_ = false;
  bool has_z_ = true;
  bool bound_is_norm_ = false;
  uint64_t head_stride_ = 0;   // d_φ·d_v + d_φ
  uint64_t shift_offset_ = 0;  // heads × head_stride_
  uint64_t position_ = 0;
  double magnitude_bound_ = 0.0;
  AlignedBuffer block_;
};

// Bytes of state a session with `spec` holds (what AttentionState::bytes()
// will be), computed without allocating.
uint64_t StateBytes(const AttentionSpec& spec);

}  // namespace linattn

#endif  // LINATTN_CORE_ATTENTION_STATE_H_
