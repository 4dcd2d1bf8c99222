#include "core/attention/quadratic.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/util/status_macros.h"

namespace linattn {

absl::Status QuadraticAttention(const Attention& attention,
                                const SequenceInput& in,
                                const SequenceOutput& out,
                                uint64_t start_position) {
  if (attention.spec().rule != UpdateRule::kLinear) {
    return absl::InvalidArgumentError(
        "rule: the materialised causal kernel is the linear rule's; the gated "
        "and delta rules run recurrent or chunkwise");
  }
  AttentionState probe = attention.NewState();
  probe.set_position(start_position);
  LINATTN_RETURN_IF_ERROR(attention.ValidateInput(probe, in));
  const AttentionSpec& spec = attention.spec();
  const FeatureMap& fm = attention.feature_map();
  const uint64_t T = in.tokens;
  const uint32_t H = spec.num_heads, d_k = spec.key_dim, d_v = spec.value_dim;
  const uint32_t d_phi = fm.dim();

  std::vector<float> phi_q(T * d_phi), phi_k(T * d_phi), q_log(T);
  std::vector<float> weights(T);
  for (uint32_t h = 0; h < H; ++h) {
    // φ of every query and key of head h. FAVOR+ keys share one scale, the
    // largest exponent over the whole sequence (it cancels in the ratio).
    float key_shift = 0.0f;
    if (fm.is_favor()) key_shift = -INFINITY;
    for (uint64_t t = 0; t < T; ++t) {
      const uint64_t row = t * H + h;
      q_log[t] =
          fm.Apply(in.q + row * d_k, start_position + t, &phi_q[t * d_phi]);
      if (fm.is_favor()) {
        key_shift = std::max(key_shift,
                             fm.Exponents(in.k + row * d_k, &phi_k[t * d_phi]));
      } else {
        fm.Apply(in.k + row * d_k, start_position + t, &phi_k[t * d_phi]);
      }
    }
    if (fm.is_favor()) {
      for (uint64_t t = 0; t < T; ++t)
        fm.FavorExp(&phi_k[t * d_phi], key_shift);
    }
    const double gamma = HeadDecay(spec, h);
    for (uint64_t i = 0; i < T; ++i) {
      // Row i of the causal kernel matrix, W_ij = γ^{i−j}·φ(q_i)·φ(k_j).
      float den = 0.0f;
      for (uint64_t j = 0; j <= i; ++j) {
        float dot = 0.0f;
        for (uint32_t c = 0; c < d_phi; ++c) {
          dot += phi_q[i * d_phi + c] * phi_k[j * d_phi + c];
        }
        weights[j] = static_cast<float>(std::pow(gamma, double(i - j))) * dot;
        den += weights[j];
      }
      const uint64_t row = i * H + h;
      float* y = out.output + row * d_v;
      std::fill(y, y + d_v, 0.0f);
      for (uint64_t j = 0; j <= i; ++j) {
        const float* vj = in.v + (j * H + h) * d_v;
        for (uint32_t c = 0; c < d_v; ++c) y[c] += weights[j] * vj[c];
      }
      ReadOut(spec, q_log[i] + key_shift, den, d_v, y, out.denominator + row,
              out.available + row);
    }
  }
  return absl::OkStatus();
}

}  // namespace linattn
