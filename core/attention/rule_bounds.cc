#include "core/attention/rule_bounds.h"

#include <algorithm>
#include <cmath>

#include "core/attention/chunkwise.h"

namespace linattn {

std::vector<double> RuleStateErrors(const AttentionSpec& spec,
                                    const SequenceInput& in,
                                    const RuleReferenceResult& ref,
                                    uint32_t C) {
  if (!StateBoundIsNorm(spec.rule)) return {};
  const uint32_t H = spec.num_heads, G = GatesPerHead(spec);
  const uint64_t T = in.tokens;
  // The largest |g| of a row (its gate per head, or the most of its gates
  // per key channel).
  auto row_gate = [&](uint64_t row) {
    double most = 0;
    for (uint32_t c = 0; c < G; ++c) {
      most = std::max(most, std::abs(double(in.g[row * G + c])));
    }
    return most;
  };
  const double blocks =
      HasLowRank(spec.rule) ? 2.0 * kGateSubChunkSpan + 2 : 0.0;
  std::vector<double> out(T * H);
  for (uint32_t h = 0; h < H; ++h) {
    double delta = 0, window = 0, carried = 0;
    for (uint64_t t = 0; t < T; ++t) {
      const uint64_t row = t * H + h;
      if (in.g != nullptr && G != 0) {
        window += row_gate(row);
        if (t >= C) window -= row_gate((t - C) * H + h);
        window = std::max(window, 0.0);
      }
      const double kappa = 4.0 * (spec.key_dim + C) + 16 + 4 * window + blocks;
      if (ref.window_norm.empty()) {
        delta = ref.growth[row] * delta +
                kFloatUnitRoundoff * kappa * ref.step_scale[row];
        out[row] = delta;
        continue;
      }
      // rwkv7: within a window, its own errors through the per-token
      // norms; the error before it through the window's product.
      if (t % kRwkv7BoundWindow == 0) {
        carried = t == 0 ? 0.0 : out[row - H];
        delta = 0;
      }
      delta = ref.growth[row] * delta +
              kFloatUnitRoundoff * kappa * ref.step_scale[row];
      out[row] = ref.window_norm[row] * carried + delta;
    }
  }
  return out;
}

double GatedRuleBound(double n, uint32_t key_dim, uint32_t C, bool per_key,
                      bool own_term, double abs_sum, double gate_abs_sum) {
  const double blocks = per_key ? 2.0 * kGateSubChunkSpan + 3 : 0.0;
  const double own = own_term ? 4.0 : 0.0;
  return kFloatUnitRoundoff *
         ((4 * n + 2.0 * key_dim + 2.0 * C + 32 + blocks + own) * abs_sum +
          4 * gate_abs_sum);
}

std::vector<double> RuleOutputBounds(const AttentionSpec& spec,
                                     const SequenceInput& in,
                                     const RuleReferenceResult& ref,
                                     uint32_t C) {
  const uint32_t H = spec.num_heads, K = spec.key_dim, V = spec.value_dim;
  const uint64_t T = in.tokens;
  const std::vector<double> state_error = RuleStateErrors(spec, in, ref, C);
  const bool norm = StateBoundIsNorm(spec.rule);
  std::vector<double> bound(T * H * V);
  for (uint64_t t = 0; t < T; ++t) {
    for (uint32_t h = 0; h < H; ++h) {
      const uint64_t row = t * H + h;
      for (uint32_t c = 0; c < V; ++c) {
        const uint64_t e = row * V + c;
        double b = 2 * kFloatUnitRoundoff * std::abs(ref.output[e]);
        if (norm) {
          b += ref.query_norm[row] * state_error[row] +
               (2.0 * K + 8) * kFloatUnitRoundoff * ref.query_norm[row] *
                   ref.state_norm[row];
        } else {
          b += GatedRuleBound(double(t + 1), K, C, GatesPerHead(spec) > 1,
                              ReadsBeforeUpdate(spec.rule),
                              ref.numerator_abs[e], ref.numerator_gate_abs[e]);
        }
        bound[e] = b;
      }
    }
  }
  return bound;
}

}  // namespace linattn
