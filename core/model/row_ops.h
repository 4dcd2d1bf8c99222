// Row-wise passes the forward blocks share (forward.cc, core/model/types/).
#ifndef LINATTN_CORE_MODEL_ROW_OPS_H_
#define LINATTN_CORE_MODEL_ROW_OPS_H_

#include <cstdint>

namespace linattn {

// Row passes go parallel from this many floats: below it a parallel
// region (wake-up and barrier, a few microseconds) costs more than the pass
// itself. At 2^13 a batch-32 decode step of the built-in model spreads its
// norms, activations and gates over the team while a batch-1 step's stay
// on one thread (measured: docs/benchmarks.md, "Measured figures behind
// constants in the code").
inline constexpr uint64_t kParallelFloats = 1 << 13;

// y = x / sqrt(mean(x²) + eps) · w (w may be null), n vectors of d; y may
// be x. RmsNorm spreads large passes over the OpenMP team; RmsNormRows is
// the same arithmetic on the calling thread (inside a parallel loop).
void RmsNorm(const float* x, uint64_t n, uint32_t d, const float* w, float eps,
             float* y);
void RmsNormRows(const float* x, uint64_t n, uint32_t d, const float* w,
                 float eps, float* y);
// y = (x − mean) / sqrt(var + eps) · w + b (b may be null; var the mean of
// the squared deviations, as torch's layer_norm), n vectors of d; y may be
// x. Spread over the team like RmsNorm.
void LayerNorm(const float* x, uint64_t n, uint32_t d, const float* w,
               const float* b, float eps, float* y);
// The same on the calling thread, for one vector.
void LayerNormRow(const float* x, uint32_t d, const float* w, const float* b,
                  float eps, float* y);
// Σ x[i] in double, in four independent partial sums (so that the adds do
// not wait on one another) added at the end; the error stays far below a
// float's rounding for any n a model or a vocabulary has.
double SumInDouble(const float* x, uint64_t n);
// GPT-NeoX rotary embedding of one head at `position`, as fla's
// RotaryEmbedding (fla/modules/rotary.py) computes it: the halves
// x[0, half) and x[half, 2·half) rotate by position·inv_freq[i], the
// position, the angle and its cosine and sine in fp32.
void RotateHalves(const float* inv_freq, uint32_t half, uint64_t position,
                  float* x);

}  // namespace linattn

#endif  // LINATTN_CORE_MODEL_ROW_OPS_H_
