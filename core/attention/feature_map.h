// FeatureMap: φ of docs/design.md §1, prepared once per spec.
//
// Holds what a feature map needs beyond the spec: the FAVOR+ projection ω
// (m×d_k orthogonal Gaussian rows drawn from spec.seed; never redrawn) and
// the cosFormer horizon. Immutable after Create(); safe to share between
// threads and sessions.
//
// FAVOR+ features are exp(·) of an exponent that can exceed fp32's range,
// so they are produced in two steps: Exponents() writes the exponents
// a_i = ωᵢᵀx̂ − ‖x̂‖²/2 and returns their maximum; FavorExp() turns them into
// m^{-½}·exp(a_i − shift). The true features are e^{shift} times that. The
// kernels keep `shift` (the log scale) next to the numbers it scales.
//
//   auto fm = FeatureMap::Create(spec).value();
//   float log_scale = fm.Apply(q_head, position, phi);  // any map
#ifndef LINATTN_CORE_ATTENTION_FEATURE_MAP_H_
#define LINATTN_CORE_ATTENTION_FEATURE_MAP_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/attention/spec.h"

namespace linattn {

class FeatureMap {
 public:
  // Validates `spec` and prepares the map (draws ω for FAVOR+).
  static absl::StatusOr<FeatureMap> Create(const AttentionSpec& spec);

  FeatureMapKind kind() const { return kind_; }
  uint32_t key_dim() const { return key_dim_; }
  uint32_t dim() const { return dim_; }  // d_φ
  bool is_favor() const { return kind_ == FeatureMapKind::kFavor; }

  // φ(x) of one head's vector x[d_k] at sequence position `position`, into
  // out[d_φ], scaled by e^{-log_scale}; returns log_scale. For every map but
  // FAVOR+ the scale is 0 (out is φ(x) itself); for FAVOR+ it is the largest
  // exponent, so the largest feature written is m^{-½}. With `finite`,
  // *finite becomes whether every element of x is finite (for ELU+1 from
  // the same pass over x).
  float Apply(const float* x, uint64_t position, float* out,
              bool* finite = nullptr) const;

  // FAVOR+ only: exponents a[m] of x[d_k]; returns max_i a_i.
  float Exponents(const float* x, float* a) const;
  // FAVOR+ only: a[i] ← m^{-½}·exp(a[i] − shift), in place, for the m
  // exponents of one vector, or for `count` exponents in any arrangement.
  void FavorExp(float* a, float shift) const { FavorExp(a, dim_, shift); }
  void FavorExp(float* a, uint32_t count, float shift) const;

  // FAVOR+ projection, m×d_k row-major (empty for other maps).
  const std::vector<float>& projection() const { return omega_; }
  // cosFormer angle π·position/(2M) of a position.
  double CosineAngle(uint64_t position) const;

 private:
  FeatureMap() = default;

  FeatureMapKind kind_ = FeatureMapKind::kElu1;
  uint32_t key_dim_ = 0;
  uint32_t dim_ = 0;
  uint32_t horizon_ = 0;
  float input_scale_ = 1.0f;   // d_k^{-¼} (FAVOR+)
  float output_scale_ = 1.0f;  // m^{-½} (FAVOR+)
  std::vector<float> omega_;   // (m, d_k)
};

// FAVOR+ projection: m rows of length d_k, in blocks of d_k mutually
// orthogonal Gaussian directions, each row scaled by the norm of an
// independent standard Gaussian d_k-vector (so rows are marginally
// N(0, I)). Deterministic in `seed` on every platform.
std::vector<float> OrthogonalGaussianRows(uint32_t m, uint32_t d_k,
                                          uint64_t seed);

}  // namespace linattn

#endif  // LINATTN_CORE_ATTENTION_FEATURE_MAP_H_
