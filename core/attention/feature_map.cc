#include "core/attention/feature_map.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/attention/kernels.h"
#include "core/util/status_macros.h"

namespace linattn {

namespace {

// splitmix64: a small, well-mixed generator whose output is fixed by its
// definition, unlike std::normal_distribution, whose algorithm is up to the
// standard library. Same seed ⇒ same ω everywhere.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in (0, 1): 53 random bits, never 0.
  double Uniform() { return ((Next() >> 11) + 0.5) * 0x1.0p-53; }
  // Standard normal by Box–Muller (one value per call, simple and exact
  // enough for random features).
  double Normal() {
    double u1 = Uniform(), u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) *
           std::cos(2.0 * std::numbers::pi * u2);
  }

 private:
  uint64_t state_;
};

}  // namespace

std::vector<float> OrthogonalGaussianRows(uint32_t m, uint32_t d_k,
                                          uint64_t seed) {
  SplitMix64 rng(seed);
  std::vector<float> omega(static_cast<size_t>(m) * d_k);
  std::vector<double> block(static_cast<size_t>(d_k) * d_k);
  for (uint32_t row0 = 0; row0 < m; row0 += d_k) {
    // A d_k×d_k Gaussian block, rows orthonormalised by modified
    // Gram–Schmidt (in double; Gaussian rows are independent a.s.). Row i
    // depends only on rows before it, so a last, partial block stops at the
    // rows it keeps.
    const uint32_t rows = std::min(d_k, m - row0);
    for (double& x : block) x = rng.Normal();
    for (uint32_t i = 0; i < rows; ++i) {
      double* ri = &block[static_cast<size_t>(i) * d_k];
      for (uint32_t j = 0; j < i; ++j) {
        const double* rj = &block[static_cast<size_t>(j) * d_k];
        double dot = 0;
        for (uint32_t c = 0; c < d_k; ++c) dot += ri[c] * rj[c];
        for (uint32_t c = 0; c < d_k; ++c) ri[c] -= dot * rj[c];
      }
      double norm = 0;
      for (uint32_t c = 0; c < d_k; ++c) norm += ri[c] * ri[c];
      norm = std::sqrt(norm);
      for (uint32_t c = 0; c < d_k; ++c) ri[c] /= norm;
    }
    for (uint32_t i = 0; i < rows; ++i) {
      // Row length ~ χ_{d_k}: the norm of a fresh Gaussian vector.
      double len = 0;
      for (uint32_t c = 0; c < d_k; ++c) {
        double g = rng.Normal();
        len += g * g;
      }
      len = std::sqrt(len);
      for (uint32_t c = 0; c < d_k; ++c) {
        omega[static_cast<size_t>(row0 + i) * d_k + c] =
            static_cast<float>(block[static_cast<size_t>(i) * d_k + c] * len);
      }
    }
  }
  return omega;
}

absl::StatusOr<FeatureMap> FeatureMap::Create(const AttentionSpec& spec) {
  LINATTN_RETURN_IF_ERROR(ValidateSpec(spec));
  FeatureMap fm;
  fm.kind_ = spec.feature_map;
  fm.key_dim_ = spec.key_dim;
  fm.dim_ = FeatureDim(spec);
  fm.horizon_ = spec.horizon;
  if (fm.is_favor()) {
    fm.input_scale_ =
        static_cast<float>(std::pow(static_cast<double>(spec.key_dim), -0.25));
    fm.output_scale_ =
        static_cast<float>(1.0 / std::sqrt(static_cast<double>(fm.dim_)));
    fm.omega_ = OrthogonalGaussianRows(fm.dim_, spec.key_dim, spec.seed);
  }
  return fm;
}

double FeatureMap::CosineAngle(uint64_t position) const {
  return std::numbers::pi * static_cast<double>(position) /
         (2.0 * static_cast<double>(horizon_));
}

float FeatureMap::Exponents(const float* x, float* a) const {
  const uint32_t d = key_dim_;
  // x̂ = x·d_k^{-¼}; a_i = ωᵢᵀx̂ − ‖x̂‖²/2.
  float half_norm2 = 0.0f;
  for (uint32_t c = 0; c < d; ++c) {
    float xh = x[c] * input_scale_;
    half_norm2 += xh * xh;
  }
  half_norm2 *= 0.5f;
  float max_a = -INFINITY;
  for (uint32_t i = 0; i < dim_; ++i) {
    const float* w = &omega_[static_cast<size_t>(i) * d];
    float dot = 0.0f;
    for (uint32_t c = 0; c < d; ++c) dot += w[c] * x[c];
    a[i] = dot * input_scale_ - half_norm2;
    max_a = std::max(max_a, a[i]);
  }
  return max_a;
}

void FeatureMap::FavorExp(float* a, uint32_t count, float shift) const {
  ActiveKernels().exp_shifted(count, shift, output_scale_, a);
}

float FeatureMap::Apply(const float* x, uint64_t position, float* out,
                        bool* finite) const {
  const uint32_t d = key_dim_;
  if (kind_ == FeatureMapKind::kElu1) {
    const bool all_finite = ActiveKernels().elu1(d, x, out);
    if (finite != nullptr) *finite = all_finite;
    return 0.0f;
  }
  if (finite != nullptr) *finite = ActiveKernels().all_finite(d, x);
  switch (kind_) {
    case FeatureMapKind::kElu1:
      break;  // above
    case FeatureMapKind::kRelu:
      for (uint32_t c = 0; c < d; ++c) out[c] = std::max(x[c], 0.0f);
      return 0.0f;
    case FeatureMapKind::kIdentity:
      std::copy(x, x + d, out);
      return 0.0f;
    case FeatureMapKind::kCosine: {
      const double angle = CosineAngle(position);
      const float cs = static_cast<float>(std::cos(angle));
      const float sn = static_cast<float>(std::sin(angle));
      for (uint32_t c = 0; c < d; ++c) {
        float r = std::max(x[c], 0.0f);
        out[c] = r * cs;
        out[d + c] = r * sn;
      }
      return 0.0f;
    }
    case FeatureMapKind::kFavor: {
      float shift = Exponents(x, out);
      FavorExp(out, shift);
      return shift;
    }
  }
  return 0.0f;
}

}  // namespace linattn
