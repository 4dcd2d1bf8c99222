#include "core/attention/attention.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/attention/kernels.h"
#include "core/util/status_macros.h"

namespace linattn {

bool AllFinite(const float* x, uint64_t n) {
  return ActiveKernels().all_finite(n, x);
}

namespace {

// max|x| over long prefill inputs is split over the OpenMP threads. (Not
// for per-row use: even a disabled parallel region costs a runtime call.)
uint32_t MaxAbsBitsParallel(const float* x, uint64_t n) {
  const VectorKernels& kernels = ActiveKernels();
  constexpr uint64_t kBlock = uint64_t{1} << 16;
  if (n < 16 * kBlock) return kernels.max_abs_bits(n, x);
  const int64_t blocks = static_cast<int64_t>((n + kBlock - 1) / kBlock);
  uint32_t most = 0;
#pragma omp parallel for schedule(static) reduction(max : most)
  for (int64_t b = 0; b < blocks; ++b) {
    const uint64_t start = uint64_t(b) * kBlock;
    most = std::max(
        most, kernels.max_abs_bits(std::min(kBlock, n - start), x + start));
  }
  return most;
}

// Checks that x[0..count) is finite; its max |x| goes to *most when set.
absl::Status CheckFinite(absl::string_view field, const float* data,
                         uint64_t count, bool check_values, float* most) {
  if (count != 0 && data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": missing"));
  }
  if (!check_values) return absl::OkStatus();
  const uint32_t bits = MaxAbsBitsParallel(data, count);
  if (bits < 0x7f800000u) {
    if (most != nullptr) *most = std::bit_cast<float>(bits);
    return absl::OkStatus();
  }
  for (uint64_t i = 0; i < count; ++i) {
    if (!std::isfinite(data[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "]: must be finite, got ", data[i]));
    }
  }
  return absl::InternalError(absl::StrCat(field, ": finiteness check failed"));
}

// The gated, delta and rwkv7 rules' per-token inputs: log-gates finite and
// ≤ 0, β in [0, 2], a and b finite; *beta_max receives the largest β and
// *low_rank_max the largest ‖a‖‖b‖ of a row. Read whatever
// check_values says (a few floats per token and head), so that a chunkwise
// prefill run in slices names them by their index in the whole request.
absl::Status CheckRuleInputs(const AttentionSpec& spec, const SequenceInput& in,
                             uint64_t rows, float* beta_max,
                             double* low_rank_max) {
  if (const uint64_t gates = rows * GatesPerHead(spec); gates != 0) {
    if (in.g == nullptr) return absl::InvalidArgumentError("g: missing");
    // Branch-free first (vectorises); the index only when one is out.
    uint32_t out = 0;
    for (uint64_t i = 0; i < gates; ++i) {
      out |=
          static_cast<uint32_t>(!((in.g[i] <= 0.0f) & (in.g[i] >= -FLT_MAX)));
    }
    for (uint64_t i = 0; out != 0 && i < gates; ++i) {
      if (!(in.g[i] <= 0.0f) || !std::isfinite(in.g[i])) {
        return absl::InvalidArgumentError(
            absl::StrCat("g[", i,
                         "]: a log-gate must be finite and <= 0 (α = exp(g) in "
                         "(0, 1]), got ",
                         in.g[i]));
      }
    }
  }
  if (HasBeta(spec.rule) && rows != 0) {
    if (in.beta == nullptr) return absl::InvalidArgumentError("beta: missing");
    float most = 0.0f;
    for (uint64_t i = 0; i < rows; ++i) {
      const float b = in.beta[i];
      if (!(b >= 0.0f && b <= 2.0f)) {
        return absl::InvalidArgumentError(
            absl::StrCat("beta[", i, "]: must be in [0, 2], got ", b));
      }
      most = std::max(most, b);
    }
    *beta_max = most;
  }
  if (HasLowRank(spec.rule) && rows != 0) {
    const uint32_t d = spec.key_dim;
    for (auto [field, data] :
         {std::pair<const char*, const float*>{"a", in.a}, {"b", in.b}}) {
      float unused = 0.0f;
      LINATTN_RETURN_IF_ERROR(
          CheckFinite(field, data, rows * d, true, &unused));
    }
    const VectorKernels& kernels = ActiveKernels();
    double most = 0.0;
    for (uint64_t r = 0; r < rows; ++r) {
      const float* a = in.a + r * d;
      const float* b = in.b + r * d;
      // fp32 dot products while every element is below 2^50 (the sum of
      // d ≤ 2^16 squares stays below 2^116), raised by their rounding
      // (relative d·2^-24 at most); in double otherwise.
      double a2 = 0.0, b2 = 0.0;
      if (kernels.max_abs_bits(d, a) < 0x58800000u &&
          kernels.max_abs_bits(d, b) < 0x58800000u) {
        const double rounding = 1.0 + d * 0x1p-24;
        a2 = kernels.dot(d, a, a) * rounding;
        b2 = kernels.dot(d, b, b) * rounding;
      } else {
        for (uint32_t c = 0; c < d; ++c) {
          a2 += double(a[c]) * a[c];
          b2 += double(b[c]) * b[c];
        }
      }
      most = std::max(most, std::sqrt(a2) * std::sqrt(b2));
    }
    *low_rank_max = most;
  }
  return absl::OkStatus();
}

}  // namespace

double GrownMagnitudeBound(const AttentionSpec& spec, double bound,
                           uint64_t tokens, const InputMagnitude& m) {
  const double t = static_cast<double>(tokens);
  const double k = spec.qk_l2norm ? 1.0 : static_cast<double>(m.k);
  const double v = static_cast<double>(m.v);
  if (HasLowRank(spec.rule)) {
    constexpr double kRounding = 1.0 + 0x1p-16;
    const double k_norm =
        spec.qk_l2norm ? 1.0 : std::sqrt(static_cast<double>(spec.key_dim)) * k;
    const double rho = (1.0 + m.low_rank) * kRounding;
    const double per_token =
        k_norm * std::sqrt(static_cast<double>(spec.value_dim)) * v * kRounding;
    return (bound + t * per_token) * (tokens == 1 ? rho : std::pow(rho, t));
  }
  if (!HasBeta(spec.rule)) {
    constexpr double kRounding = 1.0 + 0x1p-20;
    const double feature = (k + 1.0) * kRounding;
    const double per_token = feature * std::max(1.0, v) * kRounding;
    return (bound + t * per_token) *
           (tokens == 1 ? kRounding : std::pow(kRounding, t));
  }
  constexpr double kRounding = 1.0 + 0x1p-16;
  const double k_norm2 =
      spec.qk_l2norm ? 1.0 : static_cast<double>(spec.key_dim) * k * k;
  const double beta = static_cast<double>(m.beta);
  const double rho = std::max(1.0, beta * k_norm2 - 1.0) * kRounding;
  const double per_token = beta * std::sqrt(k_norm2) *
                           std::sqrt(static_cast<double>(spec.value_dim)) * v *
                           kRounding;
  // ‖S_T‖ ≤ ρ^T‖S_0‖ + per_token·Σ_{i<T} ρ^i ≤ ρ^T(‖S_0‖ + T·per_token).
  return (bound + t * per_token) * (tokens == 1 ? rho : std::pow(rho, t));
}

absl::StatusOr<Attention> Attention::Create(const AttentionSpec& spec) {
  LINATTN_ASSIGN_OR_RETURN(FeatureMap fm, FeatureMap::Create(spec));
  return Attention(spec, std::move(fm));
}

absl::Status Attention::ValidateInput(const AttentionState& state,
                                      const SequenceInput& in,
                                      bool check_values,
                                      InputMagnitude* magnitude) const {
  if (!state.Matches(spec_)) {
    return absl::InvalidArgumentError(
        "state: its shape does not match this attention spec");
  }
  const uint64_t rows = in.tokens * spec_.num_heads;
  float q_max = 0.0f, k_max = 0.0f, v_max = 0.0f;
  LINATTN_RETURN_IF_ERROR(
      CheckFinite("q", in.q, rows * spec_.key_dim, check_values, &q_max));
  LINATTN_RETURN_IF_ERROR(
      CheckFinite("k", in.k, rows * spec_.key_dim, check_values, &k_max));
  LINATTN_RETURN_IF_ERROR(
      CheckFinite("v", in.v, rows * spec_.value_dim, check_values, &v_max));
  float beta_max = 0.0f;
  double low_rank_max = 0.0;
  LINATTN_RETURN_IF_ERROR(
      CheckRuleInputs(spec_, in, rows, &beta_max, &low_rank_max));
  if (magnitude != nullptr) {
    *magnitude = {k_max, v_max, beta_max, low_rank_max};
  }
  if (spec_.feature_map == FeatureMapKind::kFavor) {
    // FAVOR+'s exponents ωᵀx̂ − ‖x̂‖²/2 are computed in fp32: past 2^50 the
    // square would leave its range and the features turn NaN.
    for (auto [field, most] :
         {std::pair<const char*, float>{"q", q_max}, {"k", k_max}}) {
      if (most > kMaxFavorInput) {
        return absl::OutOfRangeError(absl::StrCat(
            field, ": favor takes values up to 2^50 (", kMaxFavorInput,
            ") in magnitude, whose exponents stay inside fp32; got ", most));
      }
    }
  }
  if (in.tokens > kMaxPosition - std::min(state.position(), kMaxPosition)) {
    return absl::OutOfRangeError(
        absl::StrCat("tokens: the session is at position ", state.position(),
                     "; it cannot advance past ", kMaxPosition));
  }
  if (spec_.feature_map == FeatureMapKind::kCosine &&
      state.position() + in.tokens > spec_.horizon) {
    return absl::OutOfRangeError(absl::StrCat(
        "tokens: positions up to ", state.position() + in.tokens - 1,
        " reach the cosine horizon ", spec_.horizon,
        " (cosFormer weights turn negative past it)"));
  }
  return absl::OkStatus();
}

SequenceInput TokenOf(const AttentionSpec& spec, const SequenceInput& in,
                      uint64_t t) {
  const uint64_t rows = t * spec.num_heads;
  SequenceInput token{in.q + rows * spec.key_dim, in.k + rows * spec.key_dim,
                      in.v + rows * spec.value_dim, 1};
  if (in.g != nullptr) token.g = in.g + rows * GatesPerHead(spec);
  if (in.beta != nullptr) token.beta = in.beta + rows;
  if (in.a != nullptr) token.a = in.a + rows * spec.key_dim;
  if (in.b != nullptr) token.b = in.b + rows * spec.key_dim;
  return token;
}

void PrepareQueryKey(const AttentionSpec& spec, const VectorKernels& kernels,
                     const float* q, const float* k, float* q_out,
                     float* k_out) {
  const uint32_t d = spec.key_dim;
  float q_mul = QueryScale(spec), k_mul = 1.0f;
  if (spec.qk_l2norm) {
    q_mul /= std::sqrt(kernels.dot(d, q, q) + kL2NormEpsilon);
    k_mul /= std::sqrt(kernels.dot(d, k, k) + kL2NormEpsilon);
  }
  for (uint32_t i = 0; i < d; ++i) {
    q_out[i] = q[i] * q_mul;
    k_out[i] = k[i] * k_mul;
  }
}

void PrepareQueryKey(const AttentionSpec& spec, const float* q, const float* k,
                     float* q_out, float* k_out) {
  PrepareQueryKey(spec, ActiveKernels(), q, k, q_out, k_out);
}

void ReadOut(const AttentionSpec& spec, float log_scale, float den,
             uint32_t d_v, float* num, float* denominator, uint8_t* available) {
  bool ok = true;
  if (log_scale == 0.0f) {
    *denominator = den;
    if (spec.unnormalized) {
      ok = AllFinite(num, d_v);
    } else {
      const float divisor = den + spec.epsilon;
      ok = divisor != 0.0f;
      if (ok) {
        // Division, not a reciprocal product: a single key then returns v₀
        // exactly wherever fp32 can (num = den·v₀ exactly).
        for (uint32_t c = 0; c < d_v; ++c) num[c] /= divisor;
        ok = AllFinite(num, d_v);
      }
    }
  } else {
    // FAVOR+: the true numerator and denominator are e^{log_scale} times the
    // ones computed; apply it in double, where it cancels or saturates
    // cleanly.
    const double scale = std::exp(static_cast<double>(log_scale));
    const double true_den = static_cast<double>(den) * scale;
    *denominator = static_cast<float>(true_den);
    if (spec.unnormalized) {
      for (uint32_t c = 0; c < d_v; ++c) {
        num[c] = static_cast<float>(num[c] * scale);
        ok &= std::isfinite(num[c]);
      }
    } else {
      // y = num / (den + ε·e^{-log_scale}): the scale cancels, so a log scale
      // beyond double's range still gives the exact ratio.
      const double eps_scaled =
          spec.epsilon == 0.0f
              ? 0.0
              : spec.epsilon * std::exp(-static_cast<double>(log_scale));
      const double divisor = static_cast<double>(den) + eps_scaled;
      ok = divisor != 0.0;
      if (ok) {
        for (uint32_t c = 0; c < d_v; ++c) {
          num[c] = static_cast<float>(num[c] / divisor);
          ok &= std::isfinite(num[c]);
        }
      }
    }
  }
  *available = ok ? 1 : 0;
  if (!ok) {
    for (uint32_t c = 0; c < d_v; ++c) {
      num[c] = std::numeric_limits<float>::quiet_NaN();
    }
  }
}

}  // namespace linattn
