// Every kernel set this CPU runs against the plain loops of its contract.
#include "core/attention/kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace linattn {
namespace {

constexpr double kU = 0x1.0p-24;

TEST(Kernels, GenericIsAlwaysAvailableAndActiveIsSupported) {
  ASSERT_NE(KernelsFor(Isa::kGeneric), nullptr);
  bool found = false;
  for (const VectorKernels* k : SupportedKernels())
    found |= k == &ActiveKernels();
  EXPECT_TRUE(found);
  ScopedKernelsOverride use(KernelsFor(Isa::kGeneric));
  EXPECT_EQ(&ActiveKernels(), KernelsFor(Isa::kGeneric));
}

TEST(Kernels, StepHeadMatchesPlainLoops) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const std::pair<uint32_t, uint32_t> shapes[] = {
      {1, 1},   {3, 5},     {4, 16},  {17, 33}, {9, 32},
      {64, 64}, {128, 128}, {130, 7}, {5, 257}};
  for (const VectorKernels* kernels : SupportedKernels()) {
    for (auto [d_phi, d_v] : shapes) {
      for (float g : {1.0f, 0.75f, 0.0f}) {
        std::vector<float> s(d_phi * d_v), z(d_phi), q(d_phi), k(d_phi), v(d_v),
            num(d_v);
        for (float& x : s) x = dist(rng);
        for (float& x : z) x = std::abs(dist(rng));
        for (float& x : q) x = dist(rng);
        for (float& x : k) x = dist(rng);
        for (float& x : v) x = dist(rng);
        // Plain loops in double: S' = g·S + k vᵀ, z' = g·z + k, num = S'ᵀq, den
        // = q·z'.
        std::vector<double> s2(s.size()), num2(d_v, 0.0), num_abs(d_v, 0.0);
        double den2 = 0, den_abs = 0;
        for (uint32_t i = 0; i < d_phi; ++i) {
          for (uint32_t c = 0; c < d_v; ++c) {
            s2[i * d_v + c] = double(g) * s[i * d_v + c] + double(k[i]) * v[c];
            num2[c] += double(q[i]) * s2[i * d_v + c];
            num_abs[c] +=
                std::abs(double(q[i])) * (std::abs(double(g) * s[i * d_v + c]) +
                                          std::abs(double(k[i]) * v[c]));
          }
          const double zi = double(g) * z[i] + k[i];
          den2 += q[i] * zi;
          den_abs += std::abs(double(q[i])) *
                     (std::abs(double(g) * z[i]) + std::abs(k[i]));
        }
        std::vector<float> s_in = s, z_in = z;
        float den = 0;
        kernels->step_head(g, q.data(), k.data(), v.data(), d_phi, d_v,
                           s.data(), z.data(), num.data(), &den);
        for (uint32_t i = 0; i < d_phi * d_v; ++i) {
          const double bound = 2 * kU *
                               (std::abs(double(g) * s_in[i]) +
                                std::abs(double(k[i / d_v]) * v[i % d_v]));
          ASSERT_LE(std::abs(s[i] - s2[i]), bound)
              << kernels->name << " S[" << i << "]";
        }
        // The update (2 roundings) then a d_φ-term dot product.
        for (uint32_t c = 0; c < d_v; ++c) {
          ASSERT_LE(std::abs(num[c] - num2[c]), (d_phi + 4) * kU * num_abs[c])
              << kernels->name << " num[" << c << "] d_phi=" << d_phi
              << " d_v=" << d_v;
        }
        ASSERT_LE(std::abs(den - den2), (d_phi + 4) * kU * den_abs)
            << kernels->name;
      }
    }
  }
}

// The vectorised exp behind elu1 and FAVOR+: within 2 ulp (4u relative) of
// the true value for normal results, within one subnormal step below.
TEST(Kernels, ExpIsAccurateEverywhere) {
  std::vector<float> x;
  for (float v = -104.0f; v <= 88.0f; v += 0.0137f) x.push_back(v);
  for (float v : {-103.9f, -87.4f, -87.3f, -1e-6f, 0.0f, 1e-30f, 0.5f, 88.7f})
    x.push_back(v);
  for (const VectorKernels* kernels : SupportedKernels()) {
    std::vector<float> a = x;
    kernels->exp_shifted(static_cast<uint32_t>(a.size()), 0.0f, 1.0f, a.data());
    std::vector<float> elu(x.size());
    kernels->elu1(static_cast<uint32_t>(x.size()), x.data(), elu.data());
    for (size_t i = 0; i < x.size(); ++i) {
      const double truth = std::exp(double(x[i]));
      const double err = std::abs(a[i] - truth);
      if (truth >= 0x1.0p-126) {
        ASSERT_LE(err, 4 * kU * truth)
            << kernels->name << " exp(" << x[i] << ")";
      } else {
        ASSERT_LE(err, 0x1.0p-149)
            << kernels->name << " exp(" << x[i] << ") subnormal";
      }
      const double elu_truth = x[i] >= 0 ? double(x[i]) + 1 : truth;
      ASSERT_LE(std::abs(elu[i] - elu_truth),
                std::max(4 * kU * elu_truth, 0x1.0p-149))
          << kernels->name << " elu1(" << x[i] << ")";
    }
  }
}

// elu1 takes a shorter exp for a row with nothing below −86; it gives the
// bits of the full one, which a row holding −104 takes: over [−86, 4]
// densely, every 997th float of [−86, 0] by its bits, and the edges.
TEST(Kernels, Elu1GivesTheSameBitsOnEitherExp) {
  std::vector<float> x;
  for (float v = -86.0f; v <= 4.0f; v += 0.00731f) x.push_back(v);
  for (uint32_t bits = 0x80000000u; bits <= 0xC2AC0000u; bits += 997) {
    x.push_back(std::bit_cast<float>(bits));
  }
  for (float v : {-86.0f, std::nextafter(-86.0f, 0.0f), -85.99999f, -0.0f, 0.0f,
                  -1e-30f, -1e-40f, 1e-40f, -FLT_TRUE_MIN}) {
    x.push_back(v);
  }
  for (const VectorKernels* kernels : SupportedKernels()) {
    std::vector<float> slow(x.size() + 1), fast(x.size());
    std::vector<float> with_low = x;
    with_low.push_back(-104.0f);
    kernels->elu1(static_cast<uint32_t>(with_low.size()), with_low.data(),
                  slow.data());
    for (size_t i = 0; i < x.size(); i += 64) {
      const uint32_t n =
          static_cast<uint32_t>(std::min<size_t>(64, x.size() - i));
      kernels->elu1(n, x.data() + i, fast.data() + i);
    }
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(fast[i]),
                std::bit_cast<uint32_t>(slow[i]))
          << kernels->name << " elu1(" << x[i] << "): " << fast[i] << " vs "
          << slow[i];
    }
  }
}

// SiLU(g)·u for the model's MLP, against double precision. exp(−g) carries
// ≤ 4u, 1 + e adds u, the division u and the product u: relative error
// ≤ 7u plus one rounding of the result, so 8u.
TEST(Kernels, SiluMulMatchesDoublePrecision) {
  std::vector<float> g, u;
  for (float v = -120.0f; v <= 120.0f; v += 0.0731f) {
    g.push_back(v);
    u.push_back(0.5f + 0.001f * v);
  }
  for (float v : {-89.0f, -88.0f, -1e-6f, 0.0f, 1e-6f, 88.0f}) {
    g.push_back(v);
    u.push_back(-1.25f);
  }
  for (const VectorKernels* kernels : SupportedKernels()) {
    std::vector<float> out(g.size());
    kernels->silu_mul(static_cast<uint32_t>(g.size()), g.data(), u.data(),
                      out.data());
    for (size_t i = 0; i < g.size(); ++i) {
      const double truth =
          double(g[i]) / (1.0 + std::exp(-double(g[i]))) * double(u[i]);
      ASSERT_LE(std::abs(out[i] - truth),
                std::max(8 * kU * std::abs(truth), 1e-35))
          << kernels->name << " silu(" << g[i] << ")·" << u[i];
    }
  }
}

// SiLU(x) and σ(x) (the mixers' activations and β), against double
// precision: e^−x carries ≤ 4u relative, 1 + e^−x then ≤ 5u, the division
// one more u: 6u to first order, 7u with the higher-order terms and the
// result's rounding. Where e^−x is capped (x < −88) both are below 1e−36
// (σ below 7e−39, SiLU below 1e−36 in magnitude).
TEST(Kernels, SiluAndSigmoidMatchDoublePrecision) {
  std::vector<float> x;
  for (float v = -120.0f; v <= 120.0f; v += 0.0731f) x.push_back(v);
  for (float v : {-89.0f, -88.0f, -87.5f, -1e-6f, 0.0f, 1e-6f, 88.0f, 100.0f})
    x.push_back(v);
  for (const VectorKernels* kernels : SupportedKernels()) {
    const uint32_t n = static_cast<uint32_t>(x.size());
    std::vector<float> silu(n), sigmoid(n), in_place = x;
    kernels->silu(n, x.data(), silu.data());
    kernels->sigmoid(n, x.data(), sigmoid.data());
    kernels->silu(n, in_place.data(), in_place.data());
    for (size_t i = 0; i < n; ++i) {
      const double s = 1.0 / (1.0 + std::exp(-double(x[i])));
      ASSERT_LE(std::abs(silu[i] - double(x[i]) * s),
                std::max(7 * kU * std::abs(double(x[i]) * s), 1e-36))
          << kernels->name << " silu(" << x[i] << ")";
      ASSERT_LE(std::abs(sigmoid[i] - s), std::max(7 * kU * s, 7e-39))
          << kernels->name << " sigmoid(" << x[i] << ")";
      ASSERT_EQ(in_place[i], silu[i]) << kernels->name << " in place";
    }
  }
}

// Non-finite and huge inputs: NaN stays NaN through σ, SiLU and SiLU·up
// (so that a check downstream still sees it), SiLU tends to −0 below −88
// (−inf and −FLT_MAX included, where the plain quotient would be NaN or
// far from 0), and ±inf give σ's and SiLU's limits. At every position of a
// row (vector body and tail).
TEST(Kernels, SiluAndSigmoidKeepNaNAndTheirLimits) {
  const float big = std::numeric_limits<float>::max();
  const float cases[] = {NAN, -INFINITY, INFINITY, -big, big, -1e30f, -89.0f};
  for (const VectorKernels* kernels : SupportedKernels()) {
    for (float c : cases) {
      for (uint32_t at = 0; at < 35; at += 17) {
        std::vector<float> x(35, 0.5f), silu(35), sigmoid(35), up(35, 2.0f);
        std::vector<float> silu_mul(35);
        x[at] = c;
        kernels->silu(35, x.data(), silu.data());
        kernels->sigmoid(35, x.data(), sigmoid.data());
        kernels->silu_mul(35, x.data(), up.data(), silu_mul.data());
        const std::string where =
            std::string(kernels->name) + " x=" + std::to_string(c);
        if (std::isnan(c)) {
          EXPECT_TRUE(std::isnan(silu[at])) << where;
          EXPECT_TRUE(std::isnan(sigmoid[at])) << where;
          EXPECT_TRUE(std::isnan(silu_mul[at])) << where;
        } else if (c < -88.0f) {
          EXPECT_EQ(silu[at], 0.0f) << where;
          EXPECT_TRUE(std::signbit(silu[at])) << where;
          EXPECT_EQ(silu_mul[at], 0.0f) << where;
          EXPECT_LE(sigmoid[at], 7e-39f) << where;
          EXPECT_GE(sigmoid[at], 0.0f) << where;
        } else {  // +inf, FLT_MAX
          EXPECT_EQ(silu[at], c) << where;
          EXPECT_EQ(sigmoid[at], 1.0f) << where;
        }
        for (uint32_t j = 0; j < 35; ++j) {
          if (j != at) {
            ASSERT_EQ(silu[j], silu[at == 0 ? 1 : 0]) << where;
          }
        }
      }
    }
  }
}

// torch.lerp's two-sided form: within a few roundings of the exact value,
// and exactly start at weight 0 and exactly end at weight 1 (the reason
// ATen evaluates the side nearer its weight); out may be start.
TEST(Kernels, LerpMatchesDoublePrecisionAndKeepsItsEnds) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> value(-50.0f, 50.0f);
  std::uniform_real_distribution<float> weight(-0.5f, 1.5f);
  const uint32_t n = 1003;  // vector body and tail
  std::vector<float> start(n), end(n), w(n);
  for (uint32_t i = 0; i < n; ++i) {
    start[i] = value(rng);
    end[i] = value(rng);
    const float ends[] = {0.0f, 1.0f, 0.5f, -0.5f, 0.49999997f};
    w[i] = i % 7 < 5 ? ends[i % 7] : weight(rng);
  }
  for (const VectorKernels* kernels : SupportedKernels()) {
    std::vector<float> out(n), in_place = start;
    kernels->lerp(n, start.data(), end.data(), w.data(), out.data());
    kernels->lerp(n, in_place.data(), end.data(), w.data(), in_place.data());
    for (uint32_t i = 0; i < n; ++i) {
      const double s = start[i], e = end[i], wi = w[i];
      if (w[i] == 0.0f) {
        ASSERT_EQ(out[i], start[i]) << kernels->name;
      }
      if (w[i] == 1.0f) {
        ASSERT_EQ(out[i], end[i]) << kernels->name;
      }
      const double exact = s + wi * (e - s);
      const double tol = 4 * kU *
                         (std::abs(s) + std::abs(e) +
                          2 * std::abs(e - s) * std::max(1.0, std::abs(wi)));
      ASSERT_LE(std::abs(out[i] - exact), tol)
          << kernels->name << " lerp(" << s << ", " << e << ", " << wi << ")";
      ASSERT_EQ(in_place[i], out[i]) << kernels->name << " in place";
    }
  }
}

// Every non-finite value is found at every position (vector body and tail);
// the largest finite values and subnormals are not flagged.
// all_finite, and the same answer from copy_finite (which copies) and elu1
// (whose exp takes the full path once −FLT_MAX is in the row).
TEST(Kernels, AllFiniteFindsEveryNonFiniteValue) {
  const float specials[] = {NAN, -NAN, INFINITY, -INFINITY};
  for (const VectorKernels* kernels : SupportedKernels()) {
    for (uint64_t n : {1u, 7u, 16u, 37u, 100u}) {
      for (float first : {FLT_MAX, -FLT_MAX, -86.0f}) {
        std::vector<float> x(n, 1.5f), out(n);
        x[0] = first;
        x[n - 1] = -FLT_TRUE_MIN;
        const uint32_t n32 = static_cast<uint32_t>(n);
        EXPECT_TRUE(kernels->all_finite(n, x.data())) << kernels->name;
        EXPECT_TRUE(kernels->elu1(n32, x.data(), out.data())) << kernels->name;
        EXPECT_TRUE(kernels->copy_finite(n, x.data(), out.data()))
            << kernels->name;
        EXPECT_EQ(out, x) << kernels->name;
        for (uint64_t i = 0; i < n; ++i) {
          for (float bad : specials) {
            const float keep = x[i];
            x[i] = bad;
            EXPECT_FALSE(kernels->all_finite(n, x.data()))
                << kernels->name << " n=" << n << " at " << i;
            EXPECT_FALSE(kernels->elu1(n32, x.data(), out.data()))
                << kernels->name << " n=" << n << " at " << i;
            EXPECT_FALSE(kernels->copy_finite(n, x.data(), out.data()))
                << kernels->name << " n=" << n << " at " << i;
            EXPECT_EQ(std::bit_cast<uint32_t>(out[i]),
                      std::bit_cast<uint32_t>(bad));
            x[i] = keep;
          }
        }
      }
    }
    EXPECT_TRUE(kernels->all_finite(0, nullptr)) << kernels->name;
    EXPECT_TRUE(kernels->copy_finite(0, nullptr, nullptr)) << kernels->name;
  }
}

// mask_rows against plain double loops: rows scaled by γ^{i−c} for c ≤ i,
// zero after, sums within the summation bound (C·u relative to Σ|terms|);
// an inf in the masked-out part leaves no trace (no 0·inf = NaN).
TEST(Kernels, MaskRowsAndDotMatchPlainLoops) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (const VectorKernels* kernels : SupportedKernels()) {
    for (uint32_t C : {1u, 7u, 16u, 33u, 64u}) {
      for (double g : {1.0, 0.9, 0.0}) {
        std::vector<float> w(C), a(C * C), sums(C);
        for (uint32_t k = 0; k < C; ++k) {
          w[k] = static_cast<float>(std::pow(g, double(C - 1 - k)));
        }
        for (float& x : a) x = dist(rng);
        if (C > 1) a[C - 1] = INFINITY;  // row 0, a future position
        const std::vector<float> a0 = a;
        kernels->mask_rows(C, w.data(), a.data(), sums.data());
        for (uint32_t i = 0; i < C; ++i) {
          double sum = 0, abs_sum = 0;
          for (uint32_t c = 0; c < C; ++c) {
            const float want = c <= i ? a0[i * C + c] * w[C - 1 - i + c] : 0.0f;
            ASSERT_FALSE(std::isnan(a[i * C + c])) << kernels->name;
            ASSERT_EQ(a[i * C + c], want) << kernels->name << " C=" << C;
            sum += want;
            abs_sum += std::abs(want);
          }
          ASSERT_LE(std::abs(sums[i] - sum), C * kU * abs_sum)
              << kernels->name << " C=" << C << " row " << i;
        }
      }
      std::vector<float> x(C), y(C);
      for (float& v : x) v = dist(rng);
      for (float& v : y) v = dist(rng);
      double dot = 0, abs_dot = 0;
      for (uint32_t i = 0; i < C; ++i) {
        dot += double(x[i]) * y[i];
        abs_dot += std::abs(double(x[i]) * y[i]);
      }
      EXPECT_LE(std::abs(kernels->dot(C, x.data(), y.data()) - dot),
                (C + 1) * kU * abs_dot)
          << kernels->name;
    }
  }
}

// dot_rows gives each row dot's own bits (the softmax attention's scores
// of a row decoded alone and inside a tile of a prompt agree), for every
// count of rows and lengths with and without a tail; axpy_rows adds a_r·x
// to y_r element by element, the same operations for every element and
// row.
TEST(Kernels, DotRowsIsDotPerRowAndAxpyRowsAddsElementwise) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  for (const VectorKernels* kernels : SupportedKernels()) {
    for (uint32_t n : {1u, 15u, 16u, 17u, 64u, 200u, 256u}) {
      std::vector<float> b(n);
      for (float& v : b) v = dist(rng);
      std::vector<std::vector<float>> a(11, std::vector<float>(n));
      std::vector<const float*> rows;
      for (auto& r : a) {
        for (float& v : r) v = dist(rng);
        rows.push_back(r.data());
      }
      for (uint32_t count = 1; count <= a.size(); ++count) {
        std::vector<float> out(count);
        kernels->dot_rows(n, count, rows.data(), b.data(), out.data());
        for (uint32_t r = 0; r < count; ++r) {
          const float want = kernels->dot(n, a[r].data(), b.data());
          ASSERT_EQ(std::memcmp(&out[r], &want, sizeof(float)), 0)
              << kernels->name << " n=" << n << " rows=" << count << " r=" << r;
        }
      }
      std::vector<float> y(n), want(n);
      for (float& v : y) v = dist(rng);
      for (uint32_t i = 0; i < n; ++i) {
        // Within one rounding of the exact y + a·x (a fused multiply-add
        // rounds once, a product then a sum twice).
        const double exact = double(y[i]) + 0.75 * double(a[0][i]);
        want[i] = static_cast<float>(exact);
      }
      std::vector<float> y1 = y;
      const float three_quarters = 0.75f;
      float* one[] = {y1.data()};
      kernels->axpy_rows(n, 1, &three_quarters, a[0].data(), one);
      for (uint32_t i = 0; i < n; ++i) {
        ASSERT_NEAR(y1[i], want[i], 2 * kU * (std::abs(y[i]) + 1.5))
            << kernels->name << " n=" << n << " i=" << i;
      }
      // An element's result depends on neither n (vector body or tail) nor
      // the rows beside it.
      if (n > 1) {
        std::vector<float> y2 = y, y3 = y;
        const float weights[] = {-1.25f, 0.75f};
        float* two[] = {y3.data() + 1, y2.data() + 1};
        kernels->axpy_rows(n - 1, 2, weights, a[0].data() + 1, two);
        for (uint32_t i = 1; i < n; ++i) {
          ASSERT_EQ(y2[i], y1[i]) << kernels->name << " n=" << n << " i=" << i;
        }
      }
    }
  }
}

TEST(Kernels, ScanStepAndScale) {
  for (const VectorKernels* kernels : SupportedKernels()) {
    std::vector<float> carry = {1,  2,  3,  4,  5,  6,  7,  8, 9,
                                10, 11, 12, 13, 14, 15, 16, 17};
    std::vector<float> delta(carry.size());
    for (size_t i = 0; i < delta.size(); ++i) delta[i] = 0.5f * i;
    const std::vector<float> before = carry, d = delta;
    kernels->scan_step(carry.size(), 0.5f, carry.data(), delta.data());
    for (size_t i = 0; i < carry.size(); ++i) {
      EXPECT_EQ(delta[i], before[i])
          << kernels->name;  // state before the chunk
      EXPECT_EQ(carry[i], 0.5f * before[i] + d[i])
          << kernels->name;  // exact: dyadic values
    }
    kernels->scale(carry.size(), 0.25f, carry.data());
    EXPECT_EQ(carry[3], (0.5f * 4 + 1.5f) * 0.25f) << kernels->name;
  }
}

// bf16 rounding from its definition: the two bf16 values around x (its
// bits truncated, and the next value away from zero), in double, and the
// nearer of them, the one with an even last bit on a tie. Overflow past
// the largest bf16 goes to inf, as round-to-nearest does.
uint16_t Bf16FromDefinition(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  if (std::isnan(x)) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  if (std::isinf(x)) return static_cast<uint16_t>(bits >> 16);
  const uint16_t down = static_cast<uint16_t>(bits >> 16);
  const uint16_t up = static_cast<uint16_t>(down + 1);
  auto value = [](uint16_t b) {
    return static_cast<double>(std::bit_cast<float>(uint32_t{b} << 16));
  };
  const double dist_down = std::abs(static_cast<double>(x) - value(down));
  // `up` past the largest finite bf16 is inf: take the distance to 2^128.
  const double up_value =
      (up & 0x7fffu) == 0x7f80u ? std::copysign(0x1.0p128, x) : value(up);
  const double dist_up = std::abs(static_cast<double>(x) - up_value);
  if (dist_down < dist_up) return down;
  if (dist_up < dist_down) return up;
  return (down & 1u) == 0 ? down : up;
}

TEST(Kernels, ToBf16RoundsToNearestEven) {
  std::vector<float> x = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.0f,
                          std::bit_cast<float>(0x3f808000u),  // tie, even below
                          std::bit_cast<float>(0x3f818000u),  // tie, odd below
                          std::bit_cast<float>(0x3f808001u),  // just above half
                          std::bit_cast<float>(0x3f807fffu),  // just below half
                          std::bit_cast<float>(0xbf818000u),  // negative tie
                          std::bit_cast<float>(0x3fffffffu),  // carries to 2
                          FLT_MAX,                            // rounds to inf
                          -FLT_MAX,
                          std::bit_cast<float>(0x7f7f7fffu),  // stays finite
                          FLT_MIN,
                          std::bit_cast<float>(0x00008000u),  // subnormal tie
                          std::bit_cast<float>(0x00018000u),
                          std::bit_cast<float>(0x007fffffu),  // to FLT_MIN
                          std::numeric_limits<float>::denorm_min(),
                          INFINITY,
                          -INFINITY,
                          NAN,
                          std::bit_cast<float>(0xffffffffu),   // NaN, all ones
                          std::bit_cast<float>(0x7f800001u)};  // signalling
  std::mt19937 rng(7);
  for (int i = 0; i < 4000; ++i)
    x.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  for (const VectorKernels* kernels : SupportedKernels()) {
    std::vector<uint16_t> out(x.size());
    kernels->to_bf16(x.size(), x.data(), out.data());
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(out[i], Bf16FromDefinition(x[i]))
          << kernels->name << " x=" << x[i] << " bits " << std::hex
          << std::bit_cast<uint32_t>(x[i]);
      if (std::isnan(x[i])) {
        const float back = std::bit_cast<float>(uint32_t{out[i]} << 16);
        EXPECT_TRUE(std::isnan(back)) << kernels->name;
      }
    }
  }
}

TEST(Kernels, ScanStepBf16KeepsTheStateInFp32) {
  for (const VectorKernels* kernels : SupportedKernels()) {
    std::vector<float> carry(37), delta(37);
    for (size_t i = 0; i < carry.size(); ++i) {
      carry[i] = 1.0f + 0x1.0p-12f * i;  // not all bf16 values
      delta[i] = 0.25f * i;
    }
    const std::vector<float> before = carry, d = delta;
    std::vector<uint16_t> rounded(carry.size());
    kernels->scan_step_bf16(carry.size(), 0.5f, carry.data(), delta.data(),
                            rounded.data());
    for (size_t i = 0; i < carry.size(); ++i) {
      EXPECT_EQ(rounded[i], Bf16FromDefinition(before[i])) << kernels->name;
      EXPECT_EQ(carry[i], 0.5f * before[i] + d[i]) << kernels->name;
      EXPECT_EQ(delta[i], d[i]) << kernels->name;  // only read
    }
  }
}

// T = (I + M)⁻¹ for a strictly lower M: (I + M)·T = I to within the
// rounding of the substitution, whose row i sums i terms of |M||T|
// (γ_n·Σ|M||T| per entry, n = 64), and the upper triangle comes back 0
// whatever it held.
TEST(Kernels, UnitLowerInverseInvertsIPlusM) {
  for (const VectorKernels* kernels : SupportedKernels()) {
    for (uint32_t n : {1u, 5u, 16u, 32u, 33u, 64u, 128u}) {
      std::mt19937 rng(n);
      std::uniform_real_distribution<float> unit(-0.3f, 0.3f);
      std::vector<float> m(n * n), t(n * n), scratch(n);
      for (float& x : m) x = unit(rng);
      t = m;  // the upper triangle holds garbage on entry
      kernels->unit_lower_inverse(n, t.data(), scratch.data());
      for (uint32_t i = 0; i < n; ++i) {
        for (uint32_t j = 0; j < n; ++j) {
          if (j > i) {
            ASSERT_EQ(t[i * n + j], 0.0f) << kernels->name;
            continue;
          }
          // ((I + M)·T)_ij in double, and Σ|(I + M)_ir||T_rj| for the bound.
          double sum = 0, abs_sum = 0;
          for (uint32_t r = j; r <= i; ++r) {
            const double a = r == i ? 1.0 : m[i * n + r];
            sum += a * t[r * n + j];
            abs_sum += std::abs(a * t[r * n + j]);
          }
          const double want = i == j ? 1.0 : 0.0;
          EXPECT_NEAR(sum, want, 2.0 * n * kU * abs_sum + 4 * kU)
              << kernels->name << " n=" << n << " (" << i << "," << j << ")";
        }
      }
    }
  }
}

}  // namespace
}  // namespace linattn
