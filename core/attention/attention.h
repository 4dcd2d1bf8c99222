// Attention: one prepared linear-attention layer (spec + feature map), and
// the token buffers every evaluation order reads and writes.
//
// The evaluation orders live beside this file; all compute the math of
// docs/design.md §1:
//   recurrent.h   one token at a time (Step, StepBatch, StepSequence)
//   chunkwise.h   many tokens of many sessions at once (oneDNN matmuls)
//   quadratic.h   the materialised causal kernel matrix (tests, explorer)
//
// An Attention is immutable after Create() and may be shared by any number
// of sessions and threads; per-session memory is only AttentionState.
//
//   auto attention = Attention::Create(spec).value();
//   AttentionState state = attention.NewState();
//   LINATTN_RETURN_IF_ERROR(Step(attention, state, token, out));
#ifndef LINATTN_CORE_ATTENTION_ATTENTION_H_
#define LINATTN_CORE_ATTENTION_ATTENTION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/attention/feature_map.h"
#include "core/attention/spec.h"
#include "core/attention/state.h"

namespace linattn {

struct VectorKernels;

// Tokens in, row-major float32 (docs/design.md §3 layouts).
struct SequenceInput {
  const float* q = nullptr;  // (tokens, heads, d_k)
  const float* k = nullptr;  // (tokens, heads, d_k)
  const float* v = nullptr;  // (tokens, heads, d_v)
  uint64_t tokens = 0;
  // Gated rules: log-gates g ≤ 0, (tokens, heads) or, with per-key gates,
  // (tokens, heads, d_k); α = exp(g).
  const float* g = nullptr;
  // Delta rules: β ∈ [0, 2], (tokens, heads).
  const float* beta = nullptr;
  // The rwkv7 rule: the low-rank vectors a and b, (tokens, heads, d_k) each.
  const float* a = nullptr;
  const float* b = nullptr;
};

// Results out. An unavailable (token, head) has available = 0 and NaN in
// its output row; its denominator is reported as computed.
struct SequenceOutput {
  float* output = nullptr;       // (tokens, heads, d_v)
  float* denominator = nullptr;  // (tokens, heads): φ(q)ᵀz, without ε
  uint8_t* available = nullptr;  // (tokens, heads): 1 = output defined
};

// The largest |k| and |v| of an input, as ValidateInput measures them while
// it checks that every value is finite.
struct InputMagnitude {
  float k = 0.0f;
  float v = 0.0f;
  float beta = 0.0f;  // the largest β (delta rules)
  // The largest ‖a‖₂·‖b‖₂ of a (token, head) (the rwkv7 rule).
  double low_rank = 0.0;
};

// Overflow (docs/design.md, "Overflow"): a step is refused when it would
// take an entry of S or z past fp32's range, and changes nothing. Each state
// carries an upper bound on its entries; while the bound after a step stays
// below kStateMagnitudeLimit (2^120, a factor 256 inside fp32's 2^128) the
// step cannot overflow and runs at once. Beyond it the state is measured,
// and if the exact magnitude still leaves no room, the step is tried on a
// copy first.
inline constexpr double kStateMagnitudeLimit = 0x1p120;
// FAVOR+ inputs are at most this in magnitude: its exponent ‖x̂‖²/2 is
// computed in fp32 and stays finite (√d_k·2^100 ≤ 2^105 at d_k ≤ 1024).
inline constexpr float kMaxFavorInput = 0x1p50f;

// The bound after `tokens` tokens of magnitude `m` on a state of `spec`
// bounded by `bound` (AttentionState::magnitude_bound()).
//  * Linear and gated rules, a bound on every entry: every feature is at
//    most max|k| + 1 (FAVOR+'s at most 1; an L2-normalised key's at most 1),
//    so a token adds at most (max|k| + 1)·max(max|v|, 1) to any entry of S
//    or z; decay and gates only shrink the state.
//  * Delta rules, a bound on each head's Frobenius norm: S_t = α(I − βkkᵀ)S
//    + βkvᵀ with α ≤ 1 and ‖I − βkkᵀ‖₂ = max(1, |1 − β‖k‖²|) ≤ ρ =
//    max(1, β_max·‖k‖²_max − 1), so ‖S_t‖_F ≤ ρ‖S_{t−1}‖_F + β‖k‖‖v‖ with
//    ‖k‖² ≤ d_k·max|k|² (1 when L2-normalised) and ‖v‖ ≤ √d_v·max|v|.
//  * The rwkv7 rule, the same norm: S_t = (diag(α) + baᵀ)S_{t−1} + kvᵀ with
//    ‖diag(α) + baᵀ‖₂ ≤ 1 + ‖a‖‖b‖, so ‖S_t‖_F ≤ (1 + ‖a‖‖b‖)‖S_{t−1}‖_F +
//    ‖k‖‖v‖. The bound is loose (RWKV-7's transitions contract over a few
//    tokens while this grows at up to 2 per token), so a long run measures
//    the state now and then (kStateMagnitudeLimit).
// Each token's rounding is covered by a factor (1 + 2^-20) (2^-16 for the
// delta rules, whose step is a d_k-term dot product and a rank-1 update).
double GrownMagnitudeBound(const AttentionSpec& spec, double bound,
                           uint64_t tokens, const InputMagnitude& m);

class Attention {
 public:
  // INVALID_ARGUMENT naming the field when the spec is not valid.
  static absl::StatusOr<Attention> Create(const AttentionSpec& spec);

  const AttentionSpec& spec() const { return spec_; }
  const FeatureMap& feature_map() const { return feature_map_; }
  uint32_t num_heads() const { return spec_.num_heads; }
  uint32_t key_dim() const { return spec_.key_dim; }
  uint32_t value_dim() const { return spec_.value_dim; }
  uint32_t feature_dim() const { return feature_map_.dim(); }

  // A zero state at position 0.
  AttentionState NewState() const { return AttentionState(spec_); }

  // Everything that must hold before `in` may touch `state`: the state has
  // this layer's shape, pointers are set, every value is finite
  // (INVALID_ARGUMENT naming e.g. "k[17]"), log-gates are ≤ 0 and β in
  // [0, 2] (naming "g[i]", "beta[i]"), the rwkv7 rule's a and b finite
  // (naming "a[i]", "b[i]"), and cosFormer positions stay below
  // the horizon (OUT_OF_RANGE). Reads q, k and v once, unless
  // `check_values` is false: then the caller checks finiteness itself
  // (AllFinite) before it commits any state, as the chunkwise pass does
  // while it reads the rows anyway.
  // With `magnitude` set (and check_values), also reports max|k| and max|v|
  // (measured in the same read).
  absl::Status ValidateInput(const AttentionState& state,
                             const SequenceInput& in, bool check_values = true,
                             InputMagnitude* magnitude = nullptr) const;

 private:
  Attention(const AttentionSpec& spec, FeatureMap feature_map)
      : spec_(spec), feature_map_(std::move(feature_map)) {}

  AttentionSpec spec_;
  FeatureMap feature_map_;
};

// Token `t` of `in` as a one-token input (its gates, β, a and b included).
SequenceInput TokenOf(const AttentionSpec& spec, const SequenceInput& in,
                      uint64_t t);

// The gated and delta rules' q and k of one head as the update uses them:
// L2-normalised when the spec says so (fla's l2norm, x/√(Σx² + 1e-6)), and
// q times the spec's scale. q_out and k_out hold d_k floats each.
void PrepareQueryKey(const AttentionSpec& spec, const float* q, const float* k,
                     float* q_out, float* k_out);
// The same with the kernel table the caller holds.
void PrepareQueryKey(const AttentionSpec& spec, const VectorKernels& kernels,
                     const float* q, const float* k, float* q_out,
                     float* k_out);

// True when none of x[0..n) is NaN or ±inf. Vectorised; no threads.
bool AllFinite(const float* x, uint64_t n);

// Turns one head's read-out into its output, the same way for every
// evaluation order. `num` (d_v) and `den` are φ(q)ᵀS and φ(q)ᵀz scaled by
// e^{-log_scale}; on return num holds y (or NaN when unavailable).
// Normalised: y = num / (den + ε·e^{-log_scale}); unavailable when that
// divisor is exactly 0. Unnormalised: y = num·e^{log_scale}. Any non-finite
// y is reported unavailable rather than returned.
void ReadOut(const AttentionSpec& spec, float log_scale, float den,
             uint32_t d_v, float* num, float* denominator, uint8_t* available);

}  // namespace linattn

#endif  // LINATTN_CORE_ATTENTION_ATTENTION_H_
