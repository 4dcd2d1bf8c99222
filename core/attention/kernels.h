// VectorKernels: the table of vector operations every hot loop uses — the
// fused recurrent steps (linear, gated, delta, rwkv7, rwkv6), the chunkwise
// scan and mask, feature-map exponentials, the models' SwiGLU, dot products,
// finiteness and magnitude checks — compiled once per instruction set and
// chosen at run time.
//
// kernels_impl.inc holds the one source; kernels_{generic,avx2,avx512}.cc
// compile it with different target flags into separate namespaces, and
// ActiveKernels() picks the widest set the CPU supports (the environment
// variable LINATTN_ISA=generic|avx2|avx512 narrows the choice). Nothing is
// built with -march=native, so one binary runs on any x86-64.
#ifndef LINATTN_CORE_ATTENTION_KERNELS_H_
#define LINATTN_CORE_ATTENTION_KERNELS_H_

#include <cstdint>
#include <string_view>
#include <vector>

namespace linattn {

enum class Isa { kGeneric, kAvx2, kAvx512 };

struct VectorKernels {
  Isa isa;
  const char* name;
  // Fused recurrent update and read-out of one head; S is read and written
  // once:
  //   S ← g·S + φk vᵀ,   z ← g·z + φk,   num = Sᵀφq,   den = φqᵀz
  // s: (d_phi, d_v) row-major, z: (d_phi), num: (d_v) written.
  void (*step_head)(float g, const float* phi_q, const float* phi_k,
                    const float* v, uint32_t d_phi, uint32_t d_v, float* s,
                    float* z, float* num, float* den);
  // Chunkwise scan step: (carry, delta) ← (g·carry + delta, carry), i.e.
  // delta receives the state before the chunk and carry the state after.
  void (*scan_step)(uint64_t n, float g, float* carry, float* delta);
  // The bf16 chunkwise scan step: before ← bf16(carry), then carry ←
  // g·carry + delta (delta is only read).
  void (*scan_step_bf16)(uint64_t n, float g, float* carry, const float* delta,
                         uint16_t* before);
  // out = bf16(x): bfloat16 bits, rounded to nearest (ties to even), with no
  // flushing of subnormals; NaN stays NaN (quiet) and ±inf stays ±inf.
  void (*to_bf16)(uint64_t n, const float* x, uint16_t* out);
  // x ← a·x.
  void (*scale)(uint64_t n, float a, float* x);
  // ELU(x)+1: out = x ≥ 0 ? x + 1 : exp(x), with a vectorised exp accurate
  // to 2 ulp (subnormal results included); a NaN element gives 1, not NaN.
  // Returns whether every element of x is finite (checked in the pass that
  // reads x anyway): callers that take NaN for an error look at it.
  bool (*elu1)(uint32_t n, const float* x, float* out);
  // a ← scale·exp(a − shift) for a − shift ≤ 88 (FAVOR+ features, the
  // gates' factors); same exp.
  void (*exp_shifted)(uint32_t n, float shift, float scale, float* a);
  // out = SiLU(gate)·up = gate / (1 + exp(−gate)) · up (the SwiGLU MLP of
  // the model layers, output gates); same exp; SiLU(x) = −0 below x = −88
  // (−inf included). out may be up.
  void (*silu_mul)(uint32_t n, const float* gate, const float* up, float* out);
  // out = SiLU(x) = x / (1 + exp(−x)), as silu_mul's. out may be x.
  void (*silu)(uint32_t n, const float* x, float* out);
  // out = σ(x) = 1 / (1 + exp(−x)); same exp. out may be x. A NaN element
  // gives NaN, so that a check downstream still sees it (and so for silu
  // and silu_mul).
  void (*sigmoid)(uint32_t n, const float* x, float* out);
  // out = torch.lerp(start, end, weight) as ATen computes it in fp32:
  // start + w·(end − start) where |w| < 0.5, else end − (end − start)·(1 − w).
  // out may be start or end.
  void (*lerp)(uint32_t n, const float* start, const float* end,
               const float* weight, float* out);
  // True when no element of x is NaN or ±inf.
  bool (*all_finite)(uint64_t n, const float* x);
  // out = x, and all_finite(n, x), in one pass.
  bool (*copy_finite)(uint64_t n, const float* x, float* out);
  // The bits of max_i |x[i]| (0 for n = 0); at least 0x7f800000 exactly when
  // some element is NaN or ±inf.
  uint32_t (*max_abs_bits)(uint64_t n, const float* x);
  // Causal mask with decay over a C×C block: in row i, a_ic ← a_ic·w[C−1−i+c]
  // for c ≤ i and a_ic ← 0 for c > i (set, so that an inf there cannot
  // become NaN); sums[i] receives the row's sum. With w[k] = γ^{C−1−k}
  // (k < C) that is a_ic·γ^{i−c}.
  void (*mask_rows)(uint32_t C, const float* w, float* a, float* sums);
  // Σ a[i]·b[i].
  float (*dot)(uint32_t n, const float* a, const float* b);
  // out[r] = dot(n, a[r], b) for r < rows, each with dot's operations in
  // dot's order (the same bits), b read once for every four rows.
  void (*dot_rows)(uint32_t n, uint32_t rows, const float* const* a,
                   const float* b, float* out);
  // y[r][i] ← y[r][i] + a[r]·x[i] for r < rows, each element by the same
  // operations whatever n and rows; x read once for all rows.
  void (*axpy_rows)(uint32_t n, uint32_t rows, const float* a, const float* x,
                    float* const* y);
  // The gated rule's fused step of one head (S read and written once):
  //   S_i ← a_i·S_i + k_i·v  (row i, a_i = alpha[i·alpha_stride]),
  //   num = Sᵀq
  // alpha_stride 0 gives one gate for the head, 1 one per key channel.
  // S is read from `from` and the new S written to `s`: the same block
  // (in place) or another of the same shape, which `from` does not overlap
  // otherwise (`from` is then left as it was).
  void (*gated_step_head)(const float* alpha, uint32_t alpha_stride,
                          const float* q, const float* k, const float* v,
                          uint32_t d_k, uint32_t d_v, const float* from,
                          float* s, float* num);
  // The (gated) delta rule's step of one head:
  //   e = β(v − α·Sᵀk),  S ← α·S + k·eᵀ,  num = S_newᵀq = α·Sᵀq + (kᵀq)·e
  // S is read twice (from `from`) and written once (to `s`; as above);
  // scratch holds 2·d_v floats.
  void (*delta_step_head)(float alpha, float beta, const float* q,
                          const float* k, const float* v, uint32_t d_k,
                          uint32_t d_v, const float* from, float* s, float* num,
                          float* scratch);
  // The rwkv7 rule's step of one head (alpha, a, b, q, k: d_k floats):
  //   u = Sᵀa,  S_i ← α_i·S_i + b_i·u + k_i·v  (row i),  num = S_newᵀq
  // S is read twice (from `from`) and written once (to `s`; as above);
  // scratch holds d_v floats.
  void (*rwkv7_step_head)(const float* alpha, const float* a, const float* b,
                          const float* q, const float* k, const float* v,
                          uint32_t d_k, uint32_t d_v, const float* from,
                          float* s, float* num, float* scratch);
  // The rwkv6 rule's step of one head (alpha, bonus, q, k: d_k floats),
  // read out from S before the update:
  //   num = Σ_i q_i·S_i + (Σ_i q_i·u_i·k_i)·v,  S_i ← α_i·S_i + k_i·v
  // S is read once (from `from`) and written once (to `s`; as above).
  void (*rwkv6_step_head)(const float* alpha, const float* bonus,
                          const float* q, const float* k, const float* v,
                          uint32_t d_k, uint32_t d_v, const float* from,
                          float* s, float* num);
  // The delta rules' UT transform of one chunk: t (n×n, row-major) holds M
  // strictly below its diagonal on entry and T = (I + M)⁻¹ on return, by
  // forward substitution row by row (row i of T − I is −M_i − Σ_m M_im·
  // (T − I)_m over m < i). Above the diagonal is ignored on entry and 0 on
  // return. scratch holds n floats.
  void (*unit_lower_inverse)(uint32_t n, float* t, float* scratch);
  // The f32 projections' product over weights packed in panels of
  // kPanelColumns columns (PackedLinear): for the panels [p0, p1),
  //   y[r][j] (+)= Σ_i x[r][i]·w[i][j]   (r < m, 16·p0 ≤ j < min(16·p1, n))
  // with x (m × k) and y (m × n) row-major and panel p holding w[i][16p + c]
  // at panels[(p·k + i)·16 + c] (zero for columns past n). Every element's
  // sum runs over i = 0, 1, …, k − 1 in that order, from y with
  // `accumulate` and from 0 without. Rows go through register tiles and k
  // through blocks that stay in the L1 cache.
  void (*panel_gemm)(const float* x, uint64_t m, uint64_t k,
                     const float* panels, uint64_t n, uint64_t p0, uint64_t p1,
                     float* y, bool accumulate);
};

// Columns per panel of VectorKernels::panel_gemm's packed weights (the same
// on every ISA, so that one packing serves all of them).
inline constexpr uint32_t kPanelColumns = 16;

// The kernels for `isa`, or nullptr when this CPU cannot run them.
const VectorKernels* KernelsFor(Isa isa);
// The widest supported set (honouring LINATTN_ISA). Thread-safe.
const VectorKernels& ActiveKernels();
// Every set this CPU can run, narrowest first (for tests and benchmarks).
std::vector<const VectorKernels*> SupportedKernels();

// Overrides ActiveKernels() while alive; for tests and benchmarks only.
class ScopedKernelsOverride {
 public:
  explicit ScopedKernelsOverride(const VectorKernels* kernels);
  ~ScopedKernelsOverride();
  ScopedKernelsOverride(const ScopedKernelsOverride&) = delete;
  ScopedKernelsOverride& operator=(const ScopedKernelsOverride&) = delete;

 private:
  const VectorKernels* previous_;
};

}  // namespace linattn

#endif  // LINATTN_CORE_ATTENTION_KERNELS_H_
