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

namespace {

// fla's l2norm in double: x / sqrt(Σx² + eps).
std::vector<double> L2Normalised(const float* x, uint32_t d, bool normalise) {
  std::vector<double> out(x, x + d);
  if (!normalise) return out;
  double sum = 0;
  for (double e : out) sum += e * e;
  const double rstd = 1.0 / std::sqrt(sum + double(kL2NormEpsilon));
  for (double& e : out) e *= rstd;
  return out;
}

double Norm(const std::vector<double>& x) {
  double sum = 0;
  for (double e : x) sum += e * e;
  return std::sqrt(sum);
}

}  // namespace

RuleReferenceResult ReferenceRule(const AttentionSpec& spec,
                                  const SequenceInput& in) {
  const uint64_t T = in.tokens;
  const uint32_t H = spec.num_heads, K = spec.key_dim, V = spec.value_dim;
  const uint32_t G = GatesPerHead(spec);
  const double scale = spec.scale == 0.0f ? 1.0 : double(spec.scale);
  // The delta and rwkv7 rules report their errors through norms.
  const bool delta = StateBoundIsNorm(spec.rule);
  const bool low_rank = HasLowRank(spec.rule);
  // rwkv6 reads out from the state before the token.
  const bool before = ReadsBeforeUpdate(spec.rule);
  RuleReferenceResult r;
  r.output.assign(T * H * V, 0.0);
  if (delta) {
    r.step_scale.assign(T * H, 0.0);
    r.growth.assign(T * H, 0.0);
    r.query_norm.assign(T * H, 0.0);
    if (low_rank) r.window_norm.assign(T * H, 0.0);
    r.state_norm.assign(T * H, 0.0);
  } else {
    r.numerator_abs.assign(T * H * V, 0.0);
    r.numerator_gate_abs.assign(T * H * V, 0.0);
  }
  r.final_state.assign(uint64_t{H} * K * V, 0.0);
  if (!delta) {
    r.final_abs.assign(r.final_state.size(), 0.0);
    r.final_gate_abs.assign(r.final_state.size(), 0.0);
  }
  for (uint32_t h = 0; h < H; ++h) {
    std::vector<double> S(uint64_t{K} * V, 0.0);
    // rwkv7: the product of the transitions since the window's start.
    std::vector<double> M(low_rank ? uint64_t{K} * K : 0, 0.0);
    // Gated rule's error magnitudes: Y = Σ_j a(j,t)|k_j||v_j|ᵀ and
    // X = Σ_j a(j,t)·L(j,t)·|k_j||v_j|ᵀ, per (key channel, value).
    std::vector<double> Y(S.size(), 0.0), X(S.size(), 0.0);
    for (uint64_t t = 0; t < T; ++t) {
      const uint64_t row = t * H + h;
      std::vector<double> q = L2Normalised(in.q + row * K, K, spec.qk_l2norm);
      const std::vector<double> k =
          L2Normalised(in.k + row * K, K, spec.qk_l2norm);
      for (double& e : q) e *= scale;
      const float* v = in.v + row * V;
      // h = h * exp(g): one gate per head or per key channel.
      std::vector<double> gate(K, 1.0), log_gate(K, 0.0);
      if (G != 0) {
        for (uint32_t c = 0; c < K; ++c) {
          log_gate[c] = double(in.g[row * G + (G == 1 ? 0 : c)]);
          gate[c] = std::exp(log_gate[c]);
        }
      }
      if (low_rank) {
        // fla's dplr_recurrence (generalized_delta_rule/dplr/naive.py),
        // with alpha = a, beta = b, gk = g:
        //   _kv = k vᵀ + (S * a[..., None]).sum(-2) * b[..., None]
        //   S = S * exp(gk)[..., None] + _kv;   o = einsum(q, S)
        const float* a = in.a + row * K;
        const float* b = in.b + row * K;
        std::vector<double> aS(V, 0.0);
        for (uint32_t c = 0; c < V; ++c) {
          for (uint32_t i = 0; i < K; ++i)
            aS[c] += S[uint64_t{i} * V + c] * a[i];
        }
        // The error magnitudes of rule_bounds.h: ‖S_{t−1}‖_F·(max α +
        // ‖a‖‖b‖) + ‖k‖‖v‖, and ρ_t ≥ ‖diag(α) + b aᵀ‖₂ by Weyl's
        // inequality on its Gram matrix diag(α²) + W, W = c aᵀ + a cᵀ +
        // ‖b‖² a aᵀ with c = diag(α)·b: W's non-zero eigenvalues are those
        // of the 2×2 matrix [[‖b‖², 1], [1, 0]]·[a c]ᵀ[a c].
        double a2 = 0, b2 = 0, k2 = 0, v2 = 0, ac = 0, cc = 0, most = 0;
        for (uint32_t i = 0; i < K; ++i) {
          const double c = gate[i] * double(b[i]);
          a2 += double(a[i]) * a[i];
          b2 += double(b[i]) * b[i];
          k2 += k[i] * k[i];
          ac += double(a[i]) * c;
          cc += c * c;
          most = std::max(most, gate[i]);
        }
        for (uint32_t c = 0; c < V; ++c) v2 += double(v[c]) * v[c];
        r.step_scale[row] = Norm(S) * (most + std::sqrt(a2 * b2)) +
                            std::sqrt(k2) * std::sqrt(v2);
        const double trace = b2 * a2 + 2 * ac;
        const double det = ac * ac - a2 * cc;  // det M · det G
        const double w_max =
            trace / 2 + std::sqrt(std::max(0.0, trace * trace / 4 - det));
        const double margin =
            1e-12 * (std::abs(trace) + std::sqrt(std::abs(det)));
        r.growth[row] = std::sqrt(most * most + std::max(0.0, w_max) + margin);
        for (uint32_t i = 0; i < K; ++i) {
          for (uint32_t c = 0; c < V; ++c) {
            const uint64_t e = uint64_t{i} * V + c;
            const double kv = k[i] * double(v[c]) + aS[c] * double(b[i]);
            S[e] = S[e] * gate[i] + kv;
          }
        }
        // M ← (diag(α) + b aᵀ)·M, from the identity at a window's start.
        if (t % kRwkv7BoundWindow == 0) {
          std::fill(M.begin(), M.end(), 0.0);
          for (uint32_t i = 0; i < K; ++i) M[uint64_t{i} * K + i] = 1.0;
        }
        std::vector<double> aM(K, 0.0);
        for (uint32_t m = 0; m < K; ++m) {
          for (uint32_t j = 0; j < K; ++j)
            aM[j] += double(a[m]) * M[uint64_t{m} * K + j];
        }
        for (uint32_t i = 0; i < K; ++i) {
          for (uint32_t j = 0; j < K; ++j) {
            double& e = M[uint64_t{i} * K + j];
            e = gate[i] * e + double(b[i]) * aM[j];
          }
        }
        r.window_norm[row] = Norm(M);
        r.query_norm[row] = Norm(q);
        r.state_norm[row] = Norm(S);
      } else if (delta) {
        const double beta = double(in.beta[row]);
        double k2 = 0;
        for (double e : k) k2 += e * e;
        r.step_scale[row] =
            Norm(S) * (1.0 + beta * k2) +
            beta * std::sqrt(k2) * Norm(std::vector<double>(v, v + V));
        r.growth[row] = gate[0] * std::max(1.0, std::abs(1.0 - beta * k2));
        for (uint64_t e = 0; e < S.size(); ++e) S[e] *= gate[0];
        // v' = β(v − Σ_c h_c k_c);  h += k v'ᵀ
        std::vector<double> vp(V);
        for (uint32_t c = 0; c < V; ++c) {
          double hk = 0;
          for (uint32_t i = 0; i < K; ++i) hk += S[uint64_t{i} * V + c] * k[i];
          vp[c] = (double(v[c]) - hk) * beta;
        }
        for (uint32_t i = 0; i < K; ++i) {
          for (uint32_t c = 0; c < V; ++c)
            S[uint64_t{i} * V + c] += k[i] * vp[c];
        }
        r.query_norm[row] = Norm(q);
        r.state_norm[row] = Norm(S);
      } else {
        if (before) {
          // fla's naive_recurrent_rwkv6 (fla/ops/rwkv6/recurrent_naive.py):
          //   kv = k vᵀ;  o = Σ_K (h + u·kv)·q;  h = h·exp(w) + kv
          // read out before the update; the magnitudes likewise (the
          // token's own term spans no gate).
          const float* u = spec.bonus.data() + uint64_t{h} * K;
          for (uint32_t c = 0; c < V; ++c) {
            double o = 0, n_abs = 0, n_gate = 0;
            for (uint32_t i = 0; i < K; ++i) {
              const uint64_t e = uint64_t{i} * V + c;
              const double own = double(u[i]) * k[i] * double(v[c]);
              o += (S[e] + own) * q[i];
              n_abs += std::abs(q[i]) * (Y[e] + std::abs(own));
              n_gate += std::abs(q[i]) * X[e];
            }
            r.output[row * V + c] = o;
            r.numerator_abs[row * V + c] = n_abs;
            r.numerator_gate_abs[row * V + c] = n_gate;
          }
        }
        for (uint32_t i = 0; i < K; ++i) {
          for (uint32_t c = 0; c < V; ++c) {
            const uint64_t e = uint64_t{i} * V + c;
            const double kv = k[i] * double(v[c]);
            S[e] = S[e] * gate[i] + kv;
            X[e] = gate[i] * (X[e] + std::abs(log_gate[i]) * Y[e]);
            Y[e] = gate[i] * Y[e] + std::abs(kv);
          }
        }
        for (uint32_t c = 0; !before && c < V; ++c) {
          double n_abs = 0, n_gate = 0;
          for (uint32_t i = 0; i < K; ++i) {
            n_abs += std::abs(q[i]) * Y[uint64_t{i} * V + c];
            n_gate += std::abs(q[i]) * X[uint64_t{i} * V + c];
          }
          r.numerator_abs[row * V + c] = n_abs;
          r.numerator_gate_abs[row * V + c] = n_gate;
        }
      }
      // o = Σ_c q_c h_c
      for (uint32_t c = 0; !before && c < V; ++c) {
        double o = 0;
        for (uint32_t i = 0; i < K; ++i) o += q[i] * S[uint64_t{i} * V + c];
        r.output[row * V + c] = o;
      }
    }
    std::copy(S.begin(), S.end(), r.final_state.begin() + uint64_t{h} * K * V);
    if (!delta) {
      std::copy(Y.begin(), Y.end(), r.final_abs.begin() + uint64_t{h} * K * V);
      std::copy(X.begin(), X.end(),
                r.final_gate_abs.begin() + uint64_t{h} * K * V);
    }
  }
  return r;
}

}  // namespace linattn
