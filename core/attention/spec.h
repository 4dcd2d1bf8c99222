// AttentionSpec: the shape and kind of one linear-attention layer, and its
// validation.
//
// A spec is plain data chosen by a client (docs/design.md §3, AttentionSpec).
// It fixes, per session: the state's update rule (docs/design.md §1: the
// linear sum, per-token gates, the delta rule, or both), the number of
// heads, the query/key and value widths, the feature map φ, normalised or
// unnormalised read-out, ε, a per-head decay γ, the parameters of the
// FAVOR+ and cosFormer feature maps, and for the gated and delta rules the
// gates' shape, L2 normalisation of q and k, and q's scale.
//
//   AttentionSpec spec{.num_heads = 8, .key_dim = 64, .value_dim = 64};
//   LINATTN_RETURN_IF_ERROR(ValidateSpec(spec));
//   int d_phi = FeatureDim(spec);
#ifndef LINATTN_CORE_ATTENTION_SPEC_H_
#define LINATTN_CORE_ATTENTION_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace linattn {

// The feature maps of docs/design.md §1. The public spelling is
// FeatureMapName().
enum class FeatureMapKind {
  kElu1,      // ELU(x)+1: x >= 0 ? x+1 : exp(x); d_φ = d_k
  kRelu,      // max(x, 0); d_φ = d_k
  kIdentity,  // x; d_φ = d_k; unnormalised only, unless `premapped`
  kFavor,     // Performer FAVOR+ positive random features; d_φ = m
  kCosine,    // cosFormer: relu(x)·[cos(πi/2M), sin(πi/2M)]; d_φ = 2·d_k
};

// Largest accepted dimension (heads, key, value or feature); keeps every
// size computation far inside 64-bit range.
inline constexpr uint32_t kMaxDim = 1u << 16;
// FAVOR+ draws its projection by orthogonalising d_k×d_k Gaussian blocks
// (about 2·m·d_k² flops in double), so its dimensions are bounded tighter:
// at the bounds the setup is about 4·10⁹ flops (a second or so of one core,
// outside any lock) and the projection 8 MiB.
inline constexpr uint32_t kMaxFavorKeyDim = 1024;
inline constexpr uint32_t kMaxFavorFeatureDim = 2048;
// A session never advances past this many tokens (2^62: at a million tokens
// a second, 146,000 years), so a position never wraps around.
inline constexpr uint64_t kMaxPosition = uint64_t{1} << 62;
// The most a snapshot may claim to have consumed (2^53, still centuries of
// decoding): anything beyond is not a position a session can have.
inline constexpr uint64_t kMaxSnapshotPosition = uint64_t{1} << 53;

// How a token changes a head's state S (d_k×d_v) and what it reads out
// (docs/design.md §1); every rule but kLinear is unnormalised and keeps no z:
//   kLinear      S_t = γ·S_{t−1} + φ(k_t)v_tᵀ, z_t = γ·z_{t−1} + φ(k_t)
//   kGated       S_t = diag(α_t)·S_{t−1} + k_t v_tᵀ
//   kDelta       S_t = S_{t−1} + β_t k_t (v_t − S_{t−1}ᵀk_t)ᵀ
//   kGatedDelta  S_t = α_t S_{t−1} + β_t k_t (v_t − α_t S_{t−1}ᵀk_t)ᵀ
//   kRwkv7       S_t = diag(α_t)·S_{t−1} + b_t (a_tᵀS_{t−1}) + k_t v_tᵀ
//   kRwkv6       S_t = diag(α_t)·S_{t−1} + k_t v_tᵀ, read out before the
//                update: o_t = (S_{t−1} + diag(u) k_t v_tᵀ)ᵀ q_t
// with α_t = exp(g_t), g_t ≤ 0 given per token, and (all but kRwkv6)
// o_t = S_tᵀ q_t.
// kRwkv7 is RWKV-7's time-mix state in fla's generalized (diagonal plus
// low-rank) form, S_t = (diag(α_t) + b_t a_tᵀ) S_{t−1} + k_t v_tᵀ: a gate
// per key channel and the vectors a_t, b_t (d_k each) per token and head.
// RWKV-7 itself passes a = −κ̂ and b = κ̂ ⊙ (its in-context learning rate),
// κ̂ its L2-normalised key; BlinkDL's code writes the transposed state,
// S_t = S_{t−1}(diag(w_t) + a_tᵀb_t) + v_t k_tᵀ.
// kRwkv6 is RWKV-6's ("Finch") time-mix state, fla's rwkv6 ops
// (fla/ops/rwkv6/recurrent_naive.py): GLA's state with a gate per key
// channel, read out from the state before the token plus the token's own
// k vᵀ weighted per key channel by the bonus u (`bonus` below, a constant
// of the layer, not a per-token input).
// (The numbering is the snapshots': new rules go at the end.)
enum class UpdateRule { kLinear, kGated, kDelta, kGatedDelta, kRwkv7, kRwkv6 };

// The shape of a gated rule's log-gate g_t: one scalar per head (Mamba-2's
// SSD, and Gated DeltaNet's only shape) or one per key channel (GLA).
enum class GateShape { kHead, kKey };

// fla's l2norm: x / sqrt(Σx² + kL2NormEpsilon).
inline constexpr float kL2NormEpsilon = 1e-6f;

struct AttentionSpec {
  UpdateRule rule = UpdateRule::kLinear;
  uint32_t num_heads = 1;
  uint32_t key_dim = 1;    // d_k: width of q and k per head
  uint32_t value_dim = 1;  // d_v: width of v and of the output per head
  FeatureMapKind feature_map = FeatureMapKind::kElu1;
  bool unnormalized = false;  // y = φ(q)ᵀS instead of φ(q)ᵀS / (φ(q)ᵀz + ε)
  float epsilon = 0.0f;  // added to the denominator; 0 = exact
  // γ per head in [0, 1]; empty means no decay (γ = 1 for every head).
  std::vector<float> decay;
  // FAVOR+ feature count m; 0 = 2·key_dim. Other maps accept 0 or their own
  // d_φ.
  uint32_t feature_dim = 0;
  uint64_t seed = 0;     // FAVOR+ random-feature seed (fixed for a session)
  uint32_t horizon = 0;  // cosFormer M; positions must stay below it
  // q and k arrive already feature-mapped (with identity only). A model
  // layer computes its learned φ itself and may then read out normalised,
  // exactly as its checkpoint was trained; client sessions keep identity's
  // unnormalised-only rule.
  bool premapped = false;
  // Gated and delta rules only: the log-gates' shape (kGatedDelta: kHead
  // only; kRwkv7 and kRwkv6: kKey only), q and k L2-normalised per head
  // before use, and q multiplied by `scale` after that (0 = 1; fla's layers
  // pass d_k^{-1/2}).
  GateShape gate = GateShape::kHead;
  bool qk_l2norm = false;
  float scale = 0.0f;
  // kRwkv6 only: u, num_heads × key_dim finite values (head-major), the
  // weight of each token's own k vᵀ in its read-out. Empty otherwise.
  std::vector<float> bonus;

  friend bool operator==(const AttentionSpec&, const AttentionSpec&) = default;
};

// "elu1", "relu", "identity", "favor", "cosine".
absl::string_view FeatureMapName(FeatureMapKind kind);
// Parses the public spelling; INVALID_ARGUMENT naming `feature_map` otherwise.
absl::StatusOr<FeatureMapKind> ParseFeatureMap(absl::string_view name);

// "linear", "gated", "delta", "gated_delta", "rwkv7", "rwkv6"; and "head",
// "key".
absl::string_view UpdateRuleName(UpdateRule rule);
absl::StatusOr<UpdateRule> ParseUpdateRule(absl::string_view name);
absl::string_view GateShapeName(GateShape gate);
absl::StatusOr<GateShape> ParseGateShape(absl::string_view name);

// Whether a rule takes log-gates g_t, β_t, and the low-rank vectors a_t, b_t.
inline bool HasGates(UpdateRule rule) {
  return rule == UpdateRule::kGated || rule == UpdateRule::kGatedDelta ||
         rule == UpdateRule::kRwkv7 || rule == UpdateRule::kRwkv6;
}
inline bool HasBeta(UpdateRule rule) {
  return rule == UpdateRule::kDelta || rule == UpdateRule::kGatedDelta;
}
inline bool HasLowRank(UpdateRule rule) { return rule == UpdateRule::kRwkv7; }
// Whether a rule reads out from the state before the token (plus its bonus
// term) rather than after it.
inline bool ReadsBeforeUpdate(UpdateRule rule) {
  return rule == UpdateRule::kRwkv6;
}
// Whether a state's magnitude bound is on each head's Frobenius norm (the
// rules whose step mixes the rows of S) rather than on every entry.
inline bool StateBoundIsNorm(UpdateRule rule) {
  return HasBeta(rule) || HasLowRank(rule);
}
// Log-gates per (token, head): 0 without gates, 1 per head, d_k per key.
inline uint32_t GatesPerHead(const AttentionSpec& spec) {
  if (!HasGates(spec.rule)) return 0;
  return spec.gate == GateShape::kKey ? spec.key_dim : 1;
}
// q's multiplier (1 when unset).
inline float QueryScale(const AttentionSpec& spec) {
  return spec.scale == 0.0f ? 1.0f : spec.scale;
}

// OK, or INVALID_ARGUMENT whose message starts with the offending field.
absl::Status ValidateSpec(const AttentionSpec& spec);

// d_φ, the width of φ(x) per head. Requires a valid spec.
uint32_t FeatureDim(const AttentionSpec& spec);

// γ of head h (1 when the spec has no decay).
inline float HeadDecay(const AttentionSpec& spec, uint32_t h) {
  return spec.decay.empty() ? 1.0f : spec.decay[h];
}

// Floats of recurrent state per head: S (d_φ×d_v) then z (d_φ); the gated
// and delta rules keep S alone.
uint64_t StateFloatsPerHead(const AttentionSpec& spec);

// Bytes a prepared feature map holds beyond the spec (FAVOR+'s m×d_k
// projection; 0 for the other maps), and the most its preparation holds at
// once on top of that (FAVOR+'s d_k×d_k block in double). Require a valid
// spec; computed without allocating.
uint64_t FeatureMapBytes(const AttentionSpec& spec);
uint64_t FeatureMapSetupBytes(const AttentionSpec& spec);
// Bytes an Attention of `spec` holds beyond its state: the feature map's,
// and rwkv6's bonus u (num_heads·key_dim floats).
inline uint64_t ParameterBytes(const AttentionSpec& spec) {
  return FeatureMapBytes(spec) + sizeof(float) * uint64_t{spec.bonus.size()};
}

}  // namespace linattn

#endif  // LINATTN_CORE_ATTENTION_SPEC_H_
