// Recurrent = batched = chunkwise = quadratic = scalar reference, on random
// shapes, for every feature map, normalised and not, with and without decay.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "core/attention/chunkwise.h"
#include "core/attention/kernels.h"
#include "core/attention/quadratic.h"
#include "core/attention/recurrent.h"
#include "core/attention/reference.h"
#include "core/onednn/matmul.h"
#include "tests/attention/test_util.h"

namespace linattn {
namespace {

using testing::Bf16Rounding;
using testing::ExpectMatchesReference;
using testing::kUnitRoundoff;
using testing::OperandRounding;
using testing::Outputs;
using testing::RandomTokens;
using testing::Tokens;

struct Case {
  AttentionSpec spec;
  uint64_t tokens = 0;
  uint32_t chunk = 0;
  uint64_t seed = 0;
};

std::string Describe(const Case& c) {
  const AttentionSpec& s = c.spec;
  return absl::StrCat(
      FeatureMapName(s.feature_map), s.unnormalized ? "_unnorm" : "_norm",
      s.decay.empty() ? "" : "_decay", "_T", c.tokens, "_H", s.num_heads, "_dk",
      s.key_dim, "_dv", s.value_dim, "_C", c.chunk);
}

// Deterministic random cases: shapes drawn from the ranges (heads
// 1–8, dims 1–128, T 1–2000 not a multiple of the chunk, chunks 1, 16, 64,
// 100), shrunk until the O(T²) double reference stays cheap.
std::vector<Case> MakeCases() {
  std::mt19937_64 rng(20201229);
  const uint64_t kTokens[] = {1,   2,   17,   63,   65,  101,
                              250, 513, 1000, 1999, 2000};
  const uint32_t kChunks[] = {1, 16, 64, 100};
  const FeatureMapKind kMaps[] = {
      FeatureMapKind::kElu1, FeatureMapKind::kRelu, FeatureMapKind::kIdentity,
      FeatureMapKind::kFavor, FeatureMapKind::kCosine};
  std::vector<Case> cases;
  int n = 0;
  for (FeatureMapKind map : kMaps) {
    for (bool unnormalized : {false, true}) {
      if (map == FeatureMapKind::kIdentity && !unnormalized) continue;
      for (bool decay : {false, true}) {
        for (int rep = 0; rep < 3; ++rep, ++n) {
          Case c;
          c.seed = rng();
          c.chunk = kChunks[n % 4];
          c.tokens = kTokens[rng() % std::size(kTokens)];
          AttentionSpec& s = c.spec;
          s.feature_map = map;
          s.unnormalized = unnormalized;
          s.num_heads = 1 + rng() % 8;
          s.key_dim = 1 + rng() % 128;
          s.value_dim = 1 + rng() % 128;
          if (rep == 0) s.key_dim = s.value_dim = 128;  // the widest shape
          if (map == FeatureMapKind::kFavor)
            s.feature_dim = 1 + rng() % 256, s.seed = rng();
          auto cost = [&] {
            return double(c.tokens) * c.tokens * s.num_heads *
                   (FeatureDim(s) + s.value_dim);
          };
          while (cost() > 3e7) {
            if (s.num_heads > 1)
              s.num_heads = (s.num_heads + 1) / 2;
            else if (FeatureDim(s) > 8 &&
                     (s.feature_map != FeatureMapKind::kFavor ||
                      s.key_dim > 4)) {
              s.key_dim = std::max(1u, s.key_dim / 2);
              if (s.feature_dim > 8) s.feature_dim /= 2;
            } else if (s.value_dim > 4)
              s.value_dim /= 2;
            else
              c.tokens = c.tokens * 3 / 4;
          }
          if (c.chunk > 1 && c.tokens % c.chunk == 0)
            --c.tokens;  // never a multiple (and T ≤ 2000)
          if (map == FeatureMapKind::kCosine) s.horizon = c.tokens + 7;
          if (decay) {
            for (uint32_t h = 0; h < s.num_heads; ++h) {
              s.decay.push_back(
                  h == 0 ? 1.0f : 0.9f + 0.1f * (rng() % 1000) / 1000.0f);
            }
            if (s.num_heads > 1) s.decay[1] = 0.0f;  // no memory at all
          }
          s.epsilon = (n % 3 == 0) ? 1e-6f : 0.0f;
          cases.push_back(c);
        }
      }
    }
  }
  return cases;
}

// Test names and failure messages show the shape, not the struct's bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << Describe(c); }

class EvaluationOrders : public ::testing::TestWithParam<Case> {};

TEST_P(EvaluationOrders, AgreeWithReference) {
  const Case& c = GetParam();
  const AttentionSpec& spec = c.spec;
  auto attention = Attention::Create(spec);
  ASSERT_TRUE(attention.ok()) << attention.status();
  const uint32_t H = spec.num_heads, d_v = spec.value_dim;
  const uint64_t T = c.tokens;
  Tokens data = RandomTokens(spec, T, c.seed);
  const ReferenceResult ref = ReferenceAttention(*attention, data.input());

  // Quadratic order.
  Outputs quad(spec, T);
  ASSERT_TRUE(QuadraticAttention(*attention, data.input(), quad.view()).ok());
  ExpectMatchesReference(*attention, ref, quad, "quadratic");

  // Recurrent order, with every kernel set this CPU has.
  for (const VectorKernels* kernels : SupportedKernels()) {
    ScopedKernelsOverride use(kernels);
    Outputs out(spec, T);
    AttentionState state = attention->NewState();
    ASSERT_TRUE(StepSequence(*attention, state, data.input(), out.view()).ok());
    EXPECT_EQ(state.position(), T);
    ExpectMatchesReference(*attention, ref, out,
                           absl::StrCat("recurrent/", kernels->name));
  }

  // Chunkwise order in two calls (the state carries over), then the rest of
  // a second copy through recurrent (fp32) steps after a chunkwise prefix;
  // with fp32 products and, where the CPU has them natively, bf16 ones
  // within their bound (test_util.h, Bf16Rounding).
  std::vector<PrefillPrecision> precisions = {PrefillPrecision::kF32};
  if (NativeBf16Products()) precisions.push_back(PrefillPrecision::kBf16);
  for (const PrefillPrecision precision : precisions) {
    const bool bf16 = precision == PrefillPrecision::kBf16;
    const OperandRounding rounding =
        bf16 ? Bf16Rounding(*attention, data, c.chunk) : OperandRounding{};
    ChunkwiseRunner runner({.chunk_size = c.chunk, .precision = precision});
    for (const bool recurrent_tail : {false, true}) {
      Outputs out(spec, T);
      AttentionState state = attention->NewState();
      const uint64_t split = recurrent_tail ? T - T / 4 : T / 3;
      ASSERT_TRUE(runner
                      .Run(*attention, state,
                           {data.q.data(), data.k.data(), data.v.data(), split},
                           out.view())
                      .ok());
      const uint64_t qk = split * H * spec.key_dim, vv = split * H * d_v;
      const SequenceInput rest{data.q.data() + qk, data.k.data() + qk,
                               data.v.data() + vv, T - split};
      if (recurrent_tail) {
        ASSERT_TRUE(
            StepSequence(*attention, state, rest, out.view(split, H, d_v))
                .ok());
      } else {
        ASSERT_TRUE(
            runner.Run(*attention, state, rest, out.view(split, H, d_v)).ok());
      }
      EXPECT_EQ(state.position(), T);
      ExpectMatchesReference(
          *attention, ref, out,
          absl::StrCat(
              PrefillPrecisionName(precision),
              recurrent_tail ? " chunkwise then recurrent" : " chunkwise"),
          rounding);
    }
  }
}

// Several sessions at once: the batched step equals stepping each session
// alone bit for bit, and a multi-session chunkwise batch matches each
// session's reference.
TEST_P(EvaluationOrders, BatchedSessionsMatchOneByOne) {
  const Case& c = GetParam();
  auto attention = Attention::Create(c.spec);
  ASSERT_TRUE(attention.ok());
  const AttentionSpec& spec = c.spec;
  const uint32_t H = spec.num_heads;
  const uint64_t T = std::min<uint64_t>(c.tokens, 300);
  constexpr int kSessions = 3;
  // A second spec in the same batch: same shapes, other map, so items differ.
  AttentionSpec other = spec;
  other.feature_map = FeatureMapKind::kElu1;
  other.unnormalized = false;
  other.feature_dim = 0;
  other.horizon = 0;
  auto other_attention = Attention::Create(other);
  ASSERT_TRUE(other_attention.ok());

  std::vector<const Attention*> attentions;
  std::vector<Tokens> data;
  for (int s = 0; s < kSessions; ++s) {
    attentions.push_back(s == 1 ? &*other_attention : &*attention);
    data.push_back(RandomTokens(attentions.back()->spec(), T, c.seed + 17 * s));
  }
  // One by one.
  std::vector<Outputs> alone;
  for (int s = 0; s < kSessions; ++s) {
    alone.emplace_back(attentions[s]->spec(), T);
    AttentionState state = attentions[s]->NewState();
    ASSERT_TRUE(
        StepSequence(*attentions[s], state, data[s].input(), alone[s].view())
            .ok());
  }
  // Batched: one token of every session per call.
  std::vector<AttentionState> states;
  std::vector<Outputs> batched;
  for (int s = 0; s < kSessions; ++s) {
    states.push_back(attentions[s]->NewState());
    batched.emplace_back(attentions[s]->spec(), T);
  }
  for (uint64_t t = 0; t < T; ++t) {
    std::vector<StepItem> items;
    for (int s = 0; s < kSessions; ++s) {
      const AttentionSpec& sp = attentions[s]->spec();
      const uint64_t qk = t * H * sp.key_dim, vv = t * H * sp.value_dim;
      items.push_back({attentions[s],
                       &states[s],
                       {data[s].q.data() + qk, data[s].k.data() + qk,
                        data[s].v.data() + vv, 1},
                       batched[s].view(t, H, sp.value_dim)});
    }
    ASSERT_TRUE(StepBatch(items).ok());
  }
  for (int s = 0; s < kSessions; ++s) {
    EXPECT_EQ(0, std::memcmp(alone[s].output.data(), batched[s].output.data(),
                             alone[s].output.size() * sizeof(float)))
        << "session " << s << ": batched step differs from one-by-one";
    EXPECT_EQ(alone[s].available, batched[s].available);
  }
  // Chunkwise with all sessions in one Run.
  std::vector<AttentionState> cstates;
  std::vector<Outputs> chunked;
  std::vector<PrefillItem> items;
  for (int s = 0; s < kSessions; ++s) {
    cstates.push_back(attentions[s]->NewState());
    chunked.emplace_back(attentions[s]->spec(), T);
  }
  for (int s = 0; s < kSessions; ++s) {
    items.push_back(
        {attentions[s], &cstates[s], data[s].input(), chunked[s].view()});
  }
  ChunkwiseRunner runner({.chunk_size = c.chunk, .round_chunks = 3});
  ASSERT_TRUE(runner.Run(items).ok());
  for (int s = 0; s < kSessions; ++s) {
    ExpectMatchesReference(
        *attentions[s], ReferenceAttention(*attentions[s], data[s].input()),
        chunked[s], absl::StrCat("chunkwise batch, session ", s));
    EXPECT_EQ(cstates[s].position(), T);
  }
}

// Causality under overflow: a later token whose feature product with an
// earlier query overflows to inf must not touch that earlier output. Token
// 0 has a huge query, token 9 a huge key: φ(q₀)·φ(k₉) = inf sits in the
// masked-out part of the chunk's Q·Kᵀ. Outputs 0..8 are those of the
// recurrent step within twice (3n + 2d_φ + 16)·u·max|v| (each order's
// bound against the truth for non-negative weights; |v| ≤ 1).
TEST(EvaluationOrdersOverflow, LaterTokensCannotReachEarlierOutputs) {
  const AttentionSpec spec{
      .num_heads = 1, .key_dim = 4, .value_dim = 3, .epsilon = 0.0f};
  const Attention attention = *Attention::Create(spec);
  Tokens data = RandomTokens(spec, 10, 3);
  for (int c = 0; c < 4; ++c) {
    data.q[c] = 1e20f;          // token 0's query
    data.k[9 * 4 + c] = 1e20f;  // token 9's key
  }
  Outputs stepped(spec, 10), chunked(spec, 10);
  AttentionState s1 = attention.NewState(), s2 = attention.NewState();
  ASSERT_TRUE(StepSequence(attention, s1, data.input(), stepped.view()).ok());
  ChunkwiseRunner runner({.chunk_size = 16});
  ASSERT_TRUE(runner.Run(attention, s2, data.input(), chunked.view()).ok());
  const double bound = 2.0 * (3 * 10 + 2 * 4 + 16) * 0x1.0p-24;
  for (int i = 0; i < 9 * 3; ++i) {
    ASSERT_TRUE(std::isfinite(chunked.output[i])) << i;
    EXPECT_NEAR(chunked.output[i], stepped.output[i], bound) << i;
  }
  for (int t = 0; t < 9; ++t) EXPECT_EQ(chunked.available[t], 1) << t;
}

// The state T tokens of an elu + 1 spec leave, S and z per head, against
// the sums in double: each term γ^{T−1−t}·φ(k_t)·v_t passes through at most
// C products and sums in its chunk, T/C rescalings by γ^L and additions in
// the scan, and φ's 2 ulp, so every entry is within (3T + 16)·u of the sum
// of its terms' magnitudes (plus the final rounding).
// With bf16 products each term of S also meets two roundings to bf16 (the
// decayed key and v in ΔS): (1 + u_b)² on its magnitude; z stays fp32. A
// term whose operand is subnormal, or whose sum is, may be flushed: less
// than 2^-126·(max(φ, |v|) + 1) ≤ 2^-126·3 each (φ = elu + 1 ≤ 2 and
// |v| ≤ 1 for these inputs, in [-1, 1]), T terms per entry.
void ExpectStateMatches(const Attention& attention, const Tokens& data,
                        const AttentionState& state, const std::string& what,
                        bool bf16 = false) {
  const AttentionSpec& spec = attention.spec();
  const uint32_t H = spec.num_heads, d_k = spec.key_dim, d_v = spec.value_dim;
  const uint64_t T = data.q.size() / (uint64_t{H} * d_k);
  int failures = 0;
  for (uint32_t h = 0; h < H && failures < 5; ++h) {
    const double g = spec.decay.empty() ? 1.0 : spec.decay[h];
    std::vector<double> sum(uint64_t{d_k} * (d_v + 1)), mag(sum.size());
    for (uint64_t t = 0; t < T; ++t) {
      const double w = std::pow(g, static_cast<double>(T - 1 - t));
      for (uint32_t i = 0; i < d_k; ++i) {
        const double x = data.k[(t * H + h) * d_k + i];
        const double phi = x > 0 ? x + 1 : std::exp(x);
        for (uint32_t j = 0; j <= d_v; ++j) {
          const double v = j < d_v ? data.v[(t * H + h) * d_v + j] : 1.0;
          const uint64_t e = j < d_v ? uint64_t{i} * d_v + j
                                     : uint64_t{d_k} * d_v + i;  // z after S
          sum[e] += w * phi * v;
          mag[e] += std::abs(w * phi * v);
        }
      }
    }
    const float* got = state.s(h);  // S (d_k × d_v), then z (d_k)
    for (uint64_t e = 0; e < sum.size() && failures < 5; ++e) {
      const double e_fp32 = (3.0 * T + 16) * kUnitRoundoff;
      const double rel = bf16 && e < uint64_t{d_k} * d_v
                             ? (1 + e_fp32) * std::pow(1 + 0x1.0p-8, 2) - 1
                             : e_fp32;
      const double flushed =
          bf16 && e < uint64_t{d_k} * d_v ? 0x1.0p-126 * 3.0 * T : 0.0;
      const double bound =
          rel * mag[e] + flushed + kUnitRoundoff * std::abs(sum[e]);
      if (std::abs(got[e] - sum[e]) > bound) {
        ADD_FAILURE() << what << ": head " << h << " state entry " << e << " "
                      << got[e] << " vs " << sum[e] << " (bound " << bound
                      << ")";
        ++failures;
      }
    }
  }
}

// Both forms of a chunkwise round: with two threads and at least two gather
// units per thread, a round is one parallel region in which each thread
// takes its units through every pass (keys, values and scores in its own
// scratch); with one thread, or FAVOR+ keys, the passes run in turn. Items
// of different head counts, with and without decay, share rounds; a group
// without decay has its own; one item with an infinite key is refused
// alone in place with `refused` in either form, and fails a whole Run all
// or nothing before any state moves. Outputs match the reference and
// states the sums in double; with bf16 products, within their bound.
TEST(ChunkwiseRounds, FusedAndPassByPassMatchTheReference) {
  const AttentionSpec decayed{.num_heads = 3,
                              .key_dim = 32,
                              .value_dim = 16,
                              .decay = {1.0f, 0.95f, 0.5f}};
  const AttentionSpec plain{.num_heads = 2, .key_dim = 32, .value_dim = 16};
  const AttentionSpec narrow{.num_heads = 4, .key_dim = 32, .value_dim = 8};
  const AttentionSpec favor{.num_heads = 2,
                            .key_dim = 20,
                            .value_dim = 16,
                            .feature_map = FeatureMapKind::kFavor,
                            .feature_dim = 24,
                            .seed = 5};
  const Attention a = *Attention::Create(decayed);
  const Attention p = *Attention::Create(plain);
  const Attention n = *Attention::Create(narrow);
  const Attention f = *Attention::Create(favor);
  constexpr uint64_t T = 700;
  const Tokens ta = RandomTokens(decayed, T, 11);
  const Tokens tp = RandomTokens(plain, T, 12);
  const Tokens tn = RandomTokens(narrow, T, 15);
  const Tokens tf = RandomTokens(favor, T, 14);
  Tokens bad = RandomTokens(decayed, T, 13);
  bad.k[(650 * 3 + 1) * 32 + 7] = -INFINITY;  // token 650: the sixth round
  const std::string bad_name = absl::StrCat("k[", (650 * 3 + 1) * 32 + 7);
  struct RestoreThreads {
    int threads = omp_get_max_threads();
    ~RestoreThreads() { omp_set_num_threads(threads); }
  } restore;
  std::vector<float> f32_outputs[3];  // by thread count
  for (const auto& [threads, precision] : {std::pair{1, PrefillPrecision::kF32},
                                           {2, PrefillPrecision::kF32},
                                           {1, PrefillPrecision::kBf16},
                                           {2, PrefillPrecision::kBf16}}) {
    const bool bf16 = precision == PrefillPrecision::kBf16;
    if (bf16 && !NativeBf16Products()) continue;
    SCOPED_TRACE(
        absl::StrCat(threads, " thread(s), ", PrefillPrecisionName(precision)));
    omp_set_num_threads(threads);
    AttentionState sa = a.NewState(), sp = p.NewState(), sn = n.NewState(),
                   sf = f.NewState(), sbad = a.NewState();
    Outputs oa(decayed, T), op(plain, T), on(narrow, T), of(favor, T),
        obad(decayed, T);
    const PrefillItem items[] = {{&a, &sa, ta.input(), oa.view()},
                                 {&p, &sp, tp.input(), op.view()},
                                 {&a, &sbad, bad.input(), obad.view()},
                                 {&f, &sf, tf.input(), of.view()},
                                 {&n, &sn, tn.input(), on.view()}};
    ChunkwiseRunner runner(
        {.chunk_size = 16, .round_chunks = 8, .precision = precision});
    std::vector<absl::Status> refused(5);
    ASSERT_TRUE(runner.Run(items, PrefillCommit::kInPlace, refused).ok());
    // 44 chunks per item in rounds of 8: 6 rounds per group (d_φ 32 with
    // d_v 16, d_v 8, and FAVOR+'s d_φ 24); all but FAVOR+'s fuse on two.
    EXPECT_EQ(runner.last_rounds(), 18u);
    EXPECT_EQ(runner.last_fused_rounds(), threads == 2 ? 12u : 0u);
    for (int i : {0, 1, 3, 4}) EXPECT_TRUE(refused[i].ok()) << refused[i];
    EXPECT_EQ(refused[2].code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(refused[2].message()),
                ::testing::StartsWith(absl::StrCat("items[2].", bad_name)));
    for (const AttentionState* st : {&sa, &sp, &sn, &sf}) {
      EXPECT_EQ(st->position(), T);
    }
    auto rounding = [&](const Attention& at, const Tokens& t) {
      return bf16 ? Bf16Rounding(at, t, 16) : OperandRounding{};
    };
    ExpectMatchesReference(a, ReferenceAttention(a, ta.input()), oa, "decayed",
                           rounding(a, ta));
    ExpectMatchesReference(p, ReferenceAttention(p, tp.input()), op, "plain",
                           rounding(p, tp));
    ExpectMatchesReference(n, ReferenceAttention(n, tn.input()), on, "narrow",
                           rounding(n, tn));
    ExpectMatchesReference(f, ReferenceAttention(f, tf.input()), of, "FAVOR+",
                           rounding(f, tf));
    // The bf16 operands were used: their rounding shows in the outputs.
    if (!bf16) f32_outputs[threads] = oa.output;
    if (bf16 && !f32_outputs[threads].empty()) {
      EXPECT_NE(f32_outputs[threads], oa.output);
    }
    ExpectStateMatches(a, ta, sa, "decayed", bf16);
    ExpectStateMatches(p, tp, sp, "plain", bf16);
    ExpectStateMatches(n, tn, sn, "narrow", bf16);

    // All or nothing, the same batch fails whole, naming the item, and no
    // state has moved.
    AttentionState fresh[] = {a.NewState(), p.NewState(), a.NewState(),
                              f.NewState(), n.NewState()};
    const PrefillItem again[] = {{&a, &fresh[0], ta.input(), oa.view()},
                                 {&p, &fresh[1], tp.input(), op.view()},
                                 {&a, &fresh[2], bad.input(), obad.view()},
                                 {&f, &fresh[3], tf.input(), of.view()},
                                 {&n, &fresh[4], tn.input(), on.view()}};
    const absl::Status all = runner.Run(again);
    EXPECT_EQ(all.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(all.message()),
                ::testing::StartsWith(absl::StrCat("items[2].", bad_name)));
    for (const AttentionState& st : fresh) {
      EXPECT_EQ(st.position(), 0u);
      EXPECT_EQ(0.0f, *std::max_element(st.data(), st.data() + st.size()));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(RandomShapes, EvaluationOrders,
                         ::testing::ValuesIn(MakeCases()),
                         [](const ::testing::TestParamInfo<Case>& param) {
                           return absl::StrCat(param.index, "_",
                                               Describe(param.param));
                         });

}  // namespace
}  // namespace linattn
