#include "core/attention/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

namespace linattn {

namespace {

// φ(x) in double, straight from docs/design.md §1. Returns the FAVOR+ exponent
// magnitude (0 for other maps).
double Features(const AttentionSpec& spec, const FeatureMap& fm, const float* x,
                uint64_t position, std::vector<double>& out) {
  const uint32_t d = spec.key_dim;
  const uint32_t m = fm.dim();
  out.assign(m, 0.0);
  switch (spec.feature_map) {
    case FeatureMapKind::kElu1:
      for (uint32_t c = 0; c < d; ++c)
        out[c] = x[c] >= 0 ? x[c] + 1.0 : std::exp(double(x[c]));
      return 0.0;
    case FeatureMapKind::kRelu:
      for (uint32_t c = 0; c < d; ++c) out[c] = std::max(double(x[c]), 0.0);
      return 0.0;
    case FeatureMapKind::kIdentity:
      for (uint32_t c = 0; c < d; ++c) out[c] = x[c];
      return 0.0;
    case FeatureMapKind::kCosine: {
      const double angle =
          std::numbers::pi * double(position) / (2.0 * spec.horizon);
      for (uint32_t c = 0; c < d; ++c) {
        const double r = std::max(double(x[c]), 0.0);
        out[c] = r * std::cos(angle);
        out[d + c] = r * std::sin(angle);
      }
      return 0.0;
    }
    case FeatureMapKind::kFavor: {
      const double scale = std::pow(double(d), -0.25);
      double norm2 = 0;
      for (uint32_t c = 0; c < d; ++c) norm2 += (x[c] * scale) * (x[c] * scale);
      double magnitude = 0;
      const std::vector<float>& omega = fm.projection();
      for (uint32_t i = 0; i < m; ++i) {
        double dot = 0, abs_dot = 0;
        for (uint32_t c = 0; c < d; ++c) {
          dot += double(omega[size_t(i) * d + c]) * x[c] * scale;
          abs_dot += std::abs(double(omega[size_t(i) * d + c]) * x[c] * scale);
        }
        out[i] = std::exp(dot - norm2 / 2) / std::sqrt(double(m));
        magnitude = std::max(magnitude, abs_dot + norm2 / 2);
      }
      return magnitude;
    }
  }
  return 0.0;
}

}  // namespace

ReferenceResult ReferenceAttention(const Attention& attention,
                                   const SequenceInput& in,
                                   uint64_t start_position) {
  const AttentionSpec& spec = attention.spec();
  const FeatureMap& fm = attention.feature_map();
  const uint64_t T = in.tokens;
  const uint32_t H = spec.num_heads, d_k = spec.key_dim, d_v = spec.value_dim;
  const uint32_t d_phi = fm.dim();
  ReferenceResult r;
  r.output.assign(T * H * d_v, 0.0);
  r.numerator_abs.assign(T * H * d_v, 0.0);
  r.denominator.assign(T * H, 0.0);
  r.denominator_abs.assign(T * H, 0.0);
  r.available.assign(T * H, 1);

  std::vector<std::vector<double>> phi_q(T), phi_k(T);
  for (uint32_t h = 0; h < H; ++h) {
    for (uint64_t t = 0; t < T; ++t) {
      const uint64_t row = t * H + h;
      r.favor_exponent_scale = std::max(
          {r.favor_exponent_scale,
           Features(spec, fm, in.q + row * d_k, start_position + t, phi_q[t]),
           Features(spec, fm, in.k + row * d_k, start_position + t, phi_k[t])});
    }
    const double gamma = HeadDecay(spec, h);
    for (uint64_t i = 0; i < T; ++i) {
      const uint64_t row = i * H + h;
      double den = 0, den_abs = 0;
      std::vector<double> num(d_v, 0.0);
      for (uint64_t j = 0; j <= i; ++j) {
        // w and, for error bounds, Σ_c |φ(q)_c·φ(k)_c| (≥ |w|; equal for
        // non-negative features, larger where signed features cancel).
        double w = 0, w_abs = 0;
        for (uint32_t c = 0; c < d_phi; ++c) {
          w += phi_q[i][c] * phi_k[j][c];
          w_abs += std::abs(phi_q[i][c] * phi_k[j][c]);
        }
        const double decay = std::pow(gamma, double(i - j));
        w *= decay;
        w_abs *= decay;
        den += w;
        den_abs += w_abs;
        const float* vj = in.v + (j * H + h) * d_v;
        for (uint32_t c = 0; c < d_v; ++c) {
          num[c] += w * vj[c];
          r.numerator_abs[row * d_v + c] += w_abs * std::abs(vj[c]);
        }
      }
      r.denominator[row] = den;
      r.denominator_abs[row] = den_abs;
      const double divisor = den + spec.epsilon;
      const bool ok = spec.unnormalized || divisor != 0.0;
      r.available[row] = ok;
      for (uint32_t c = 0; c < d_v; ++c) {
        r.output[row * d_v + c] = !ok ? std::numeric_limits<double>::quiet_NaN()
                                  : spec.unnormalized ? num[c]
                                                      : num[c] / divisor;
      }
    }
  }
  return r;
}

}  // namespace linattn
