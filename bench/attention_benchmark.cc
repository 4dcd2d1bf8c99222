// Engine benchmarks (numbers, not pass/fail): decode step vs the machine's
// read-modify-write bandwidth, chunkwise prefill vs oneDNN's large-GEMM
// peak, and chunkwise vs token-by-token prefill; the same for the gated and
// delta rules.
//
//   build/bin/attention_benchmark --benchmark_out=bench.json
//   --benchmark_out_format=json /usr/bin/python3 bench/report.py bench.json #
//   the tables of docs/benchmarks.md
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "bench/machine_limits.h"
#include "core/attention/chunkwise.h"
#include "core/attention/kernels.h"
#include "core/attention/recurrent.h"
#include "core/onednn/linear.h"
#include "core/onednn/matmul.h"

namespace linattn {
namespace {

constexpr uint32_t kHeads = 8;

AttentionSpec Spec(uint32_t d) {
  return {.num_heads = kHeads, .key_dim = d, .value_dim = d};
}

std::vector<float> Random(uint64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// B sessions (H = 8, d_k = d_v = d), one token's inputs and outputs each.
struct DecodeData {
  DecodeData(uint32_t d, uint32_t sessions)
      : attention(*Attention::Create(Spec(d))),
        B(sessions),
        qkv(Random(uint64_t(B) * 3 * kHeads * d, 1)),
        y(uint64_t(B) * kHeads * d),
        den(B * kHeads),
        avail(B * kHeads) {
    for (uint32_t b = 0; b < B; ++b) states.push_back(attention.NewState());
    for (uint32_t b = 0; b < B; ++b) {
      const float* base = qkv.data() + uint64_t(b) * 3 * kHeads * d;
      items.push_back({&attention,
                       &states[b],
                       {base, base + kHeads * d, base + 2 * kHeads * d, 1},
                       {y.data() + uint64_t(b) * kHeads * d,
                        den.data() + b * kHeads, avail.data() + b * kHeads}});
    }
  }
  void SetPerSessionCounter(benchmark::State& st) const {
    st.counters["us_per_session_step"] = benchmark::Counter(
        double(st.iterations()) * B * 1e-6,
        benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  }

  const Attention attention;
  const uint32_t B;
  const std::vector<float> qkv;
  std::vector<float> y, den;
  std::vector<uint8_t> avail;
  std::vector<AttentionState> states;
  std::vector<StepItem> items;
};

// (a) One decode step for each of B sessions: B·H heads, each reading and
// writing its S (d×d) and z (d) once.
void BM_DecodeStep(benchmark::State& st) {
  DecodeData data(st.range(0), st.range(1));
  const uint64_t state_bytes = uint64_t(data.B) * data.states[0].bytes();
  for (auto _ : st) {
    if (!StepBatch(data.items).ok()) st.SkipWithError("step failed");
    benchmark::DoNotOptimize(data.y.data());
  }
  const double rmw = bench::RmwBandwidth(state_bytes);  // right after
  st.SetBytesProcessed(int64_t(st.iterations()) * 2 * state_bytes);
  st.counters["state_bytes_rw"] = 2.0 * state_bytes;
  data.SetPerSessionCounter(st);
  st.counters["rmw_GBps"] = rmw / 1e9;
  st.counters["frac_of_rmw"] = benchmark::Counter(
      2.0 * state_bytes * st.iterations() / rmw, benchmark::Counter::kIsRate);
  st.SetLabel(ActiveKernels().name);
}
BENCHMARK(BM_DecodeStep)
    ->ArgsProduct({{64, 128}, {1, 64}})
    ->Args({64, 16})
    ->Args({64, 256})
    ->UseRealTime();

// The same B sessions stepped one call each: what one StepBatch call over
// all of them saves (fork/join and dispatch per call; with B·H heads per call
// both cores stay busy).
void BM_DecodeOneByOne(benchmark::State& st) {
  DecodeData data(st.range(0), st.range(1));
  for (auto _ : st) {
    for (const StepItem& item : data.items) {
      if (!Step(*item.attention, *item.state, item.token, item.out).ok()) {
        st.SkipWithError("step failed");
      }
    }
    benchmark::DoNotOptimize(data.y.data());
  }
  data.SetPerSessionCounter(st);
}
BENCHMARK(BM_DecodeOneByOne)->Args({64, 64})->UseRealTime();

// The bound itself, at the decode working sets and at the reference sizes
// bench/compare reports (1 MiB: within L2; 8 MiB: past L2; 1 GiB: memory).
void BM_ReadModifyWrite(benchmark::State& st) {
  const uint64_t bytes = st.range(0);
  double best = 0;
  for (auto _ : st) best = std::max(best, bench::RmwBandwidth(bytes));
  st.counters["GBps"] = best / 1e9;
}
BENCHMARK(BM_ReadModifyWrite)
    ->Arg(kHeads*(64 * 64 + 64) * 4)
    ->Arg(64 * kHeads * (64 * 64 + 64) * 4)
    ->Arg(kHeads*(128 * 128 + 128) * 4)
    ->Arg(64 * kHeads * (128 * 128 + 128) * 4)
    ->Arg(1 << 20)
    ->Arg(8 << 20)
    ->Arg(1 << 30)
    ->Iterations(1);

// The chunkwise path's products alone, operands in cache: 128 batched
// 64×k by k×64 products (k = 64: each of the four per chunk at d = C = 64;
// k = 128: the two output products fused into one, [Q | A]·[S_prev; V]),
// with and without the sum post-op that accumulates into C.
void BM_BatchedMatmul(benchmark::State& st) {
  const int64_t batch = 128, k = st.range(0);
  const MatmulShape shape{
      .batch = batch, .m = 64, .k = k, .n = 64, .accumulate = st.range(1) != 0};
  const std::vector<float> a = Random(batch * 64 * k, 1);
  const std::vector<float> b = Random(batch * k * 64, 2);
  std::vector<float> c(batch * 64 * 64);
  for (auto _ : st) {
    if (!BatchedMatmul(shape, a.data(), b.data(), c.data()).ok()) {
      st.SkipWithError("matmul failed");
    }
  }
  st.counters["GFLOPs"] = benchmark::Counter(
      shape.Flops() * st.iterations() / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_BatchedMatmul)
    ->Args({64, 0})
    ->Args({64, 1})
    ->Args({128, 0})
    ->UseRealTime();

// A model projection y = x·Wᵀ of `rows` rows, (in → out), f32 weights, on
// oneDNN's matmul (kernel 0) or the panel kernels (1): the decode step's
// products at batch 1 and 32 and a 512-row prompt piece of the built-in
// model's shapes.
void BM_PackedLinear(benchmark::State& st) {
  const int64_t rows = st.range(0), in = st.range(1), out = st.range(2);
  const LinearKernel kernel =
      st.range(3) == 0 ? LinearKernel::kOneDnn : LinearKernel::kPanels;
  const std::vector<float> w = Random(out * in, 1);
  const std::vector<float> x = Random(PackedLinear::Bucket(rows) * in, 2);
  std::vector<float> y(PackedLinear::Bucket(rows) * out);
  auto linear =
      PackedLinear::Create(w.data(), out, in, false, WeightType::kF32, kernel);
  if (!linear.ok()) {
    st.SkipWithError(linear.status().ToString().c_str());
    return;
  }
  for (auto _ : st) {
    if (!(*linear)->Apply(x.data(), rows, y.data()).ok()) {
      st.SkipWithError("product failed");
    }
  }
  st.counters["GFLOPs"] =
      benchmark::Counter(2.0 * rows * in * out * st.iterations() / 1e9,
                         benchmark::Counter::kIsRate);
}
BENCHMARK(BM_PackedLinear)
    ->ArgsProduct({{1, 32}, {256}, {256, 1032, 1536, 4096}, {0, 1}})
    ->ArgsProduct({{1, 32}, {768}, {256}, {0, 1}})
    ->ArgsProduct({{512}, {256}, {1536}, {0, 1}})
    ->ArgsProduct({{1, 32}, {1024}, {5632}, {0, 1}})
    ->UseRealTime();

// oneDNN's fp32 GEMM at n = 2048: the compute bound.
void BM_GemmPeak(benchmark::State& st) {
  double best = 0;
  for (auto _ : st) best = std::max(best, bench::LargeGemmGflops());
  st.counters["GFLOPs"] = best;
}
BENCHMARK(BM_GemmPeak)->Iterations(3);

// T random tokens of an H = 8, d_k = d_v = d session and their outputs.
struct PrefillData {
  PrefillData(uint32_t d, uint64_t tokens)
      : attention(*Attention::Create(Spec(d))),
        T(tokens),
        q(Random(T * kHeads * d, 1)),
        k(Random(T * kHeads * d, 2)),
        v(Random(T * kHeads * d, 3)),
        y(T * kHeads * d),
        den(T * kHeads),
        avail(T * kHeads) {}
  SequenceInput in() const { return {q.data(), k.data(), v.data(), T}; }
  SequenceOutput out() { return {y.data(), den.data(), avail.data()}; }

  const Attention attention;
  const uint64_t T;
  const std::vector<float> q, k, v;
  std::vector<float> y, den;
  std::vector<uint8_t> avail;
};

// (b) Chunkwise prefill of T tokens into one fresh session; arguments are
// d, T, chunk size C and chunks per head per round. GFLOPs counts the
// matmuls executed: per head and chunk 2C(C·d + 2d² + C·d).
void ChunkwisePrefill(benchmark::State& st, PrefillPrecision precision) {
  if (!PrefillPrecisionSupported(precision).ok()) {
    st.SkipWithError("bf16 products are not native on this CPU");
    return;
  }
  PrefillData data(st.range(0), st.range(1));
  ChunkwiseRunner runner({.chunk_size = static_cast<uint32_t>(st.range(2)),
                          .round_chunks = static_cast<uint32_t>(st.range(3)),
                          .precision = precision});
  AttentionState state = data.attention.NewState();
  double flops = 0;
  for (auto _ : st) {
    state.Reset();
    if (!runner.Run(data.attention, state, data.in(), data.out()).ok()) {
      st.SkipWithError("prefill failed");
    }
    flops += runner.last_matmul_flops();
  }
  const double peak = bench::LargeGemmGflops();  // right after, same conditions
  st.SetItemsProcessed(int64_t(st.iterations()) * data.T);
  st.counters["GFLOPs"] =
      benchmark::Counter(flops / 1e9, benchmark::Counter::kIsRate);
  st.counters["gemm_peak_GFLOPs"] = peak;
  st.counters["frac_of_peak"] =
      benchmark::Counter(flops / 1e9 / peak, benchmark::Counter::kIsRate);
}
void BM_ChunkwisePrefill(benchmark::State& st) {
  ChunkwisePrefill(st, PrefillPrecision::kF32);
}
BENCHMARK(BM_ChunkwisePrefill)
    ->ArgsProduct({{64, 128}, {1024, 4096, 16384, 65536}, {64}, {16}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// (b bf16) The same with bf16 operands (--prefill-precision bf16); its
// gemm_peak_GFLOPs is still the fp32 peak, and bench/compare sets its
// tokens/s beside BM_ChunkwisePrefill's.
void BM_ChunkwisePrefillBf16(benchmark::State& st) {
  ChunkwisePrefill(st, PrefillPrecision::kBf16);
}
BENCHMARK(BM_ChunkwisePrefillBf16)
    ->ArgsProduct({{64, 128}, {1024, 4096, 16384, 65536}, {64}, {16}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// (b′) The pass over a prefill's input the server no longer makes: until the
// chunkwise gather became the one finiteness check, the scheduler read every
// slice's q, k and v for finiteness before the gather read them again.
// Arguments d, T, as BM_ChunkwisePrefill's; bench/compare sets the two side
// by side.
void BM_SeparateFinitenessPass(benchmark::State& st) {
  PrefillData data(st.range(0), st.range(1));
  const uint64_t n = data.T * kHeads * st.range(0);
  for (auto _ : st) {
    bool finite = AllFinite(data.q.data(), n) && AllFinite(data.k.data(), n) &&
                  AllFinite(data.v.data(), n);
    benchmark::DoNotOptimize(finite);
  }
  st.SetItemsProcessed(int64_t(st.iterations()) * data.T);
}
BENCHMARK(BM_SeparateFinitenessPass)
    ->ArgsProduct({{64, 128}, {1024, 4096, 16384, 65536}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// (c) The same prefill token by token through the recurrent step.
void BM_RecurrentPrefill(benchmark::State& st) {
  PrefillData data(st.range(0), st.range(1));
  AttentionState state = data.attention.NewState();
  for (auto _ : st) {
    state.Reset();
    if (!StepSequence(data.attention, state, data.in(), data.out()).ok()) {
      st.SkipWithError("prefill failed");
    }
  }
  st.SetItemsProcessed(int64_t(st.iterations()) * data.T);
}
BENCHMARK(BM_RecurrentPrefill)
    ->ArgsProduct({{64, 128}, {1024, 4096, 16384, 65536}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// --- The gated and delta rules ------------------------------------------
// Rule cases: 1 gated (a gate per head), 2 gated (a gate per key channel),
// 3 delta, 4 gated delta, 5 rwkv7, 6 rwkv6 (both a gate per key channel,
// scale 1; rwkv6 with a bonus of 0.5); the delta rules with L2-normalised
// q and k.
AttentionSpec RuleSpec(int64_t rule, uint32_t d) {
  AttentionSpec spec{.rule = rule <= 2   ? UpdateRule::kGated
                             : rule == 3 ? UpdateRule::kDelta
                             : rule == 4 ? UpdateRule::kGatedDelta
                             : rule == 5 ? UpdateRule::kRwkv7
                                         : UpdateRule::kRwkv6,
                     .num_heads = kHeads,
                     .key_dim = d,
                     .value_dim = d,
                     .feature_map = FeatureMapKind::kIdentity,
                     .unnormalized = true};
  if (rule == 2 || rule >= 5) spec.gate = GateShape::kKey;
  spec.qk_l2norm = rule == 3 || rule == 4;
  if (rule < 5) spec.scale = 1.0f / std::sqrt(static_cast<float>(d));
  if (rule == 6) spec.bonus.assign(uint64_t{kHeads} * d, 0.5f);
  return spec;
}

const char* RuleName(int64_t rule) {
  switch (rule) {
    case 1:
      return "gated_head";
    case 2:
      return "gated_key";
    case 3:
      return "delta";
    case 4:
      return "gated_delta";
    case 5:
      return "rwkv7";
    default:
      return "rwkv6";
  }
}

// Per-token inputs of T tokens: q, k, v, log-gates in [−0.1, 0], β in
// [0, 1], and rwkv7's a = −κ̂, b = κ̂ ⊙ a' as RWKV-7 makes them (κ̂ a unit
// vector per head, a' in [0, 1]) (each only where the rule takes it).
struct RuleInputs {
  RuleInputs(const AttentionSpec& spec, uint64_t tokens)
      : T(tokens),
        q(Random(T * kHeads * spec.key_dim, 1)),
        k(Random(T * kHeads * spec.key_dim, 2)),
        v(Random(T * kHeads * spec.value_dim, 3)) {
    if (HasGates(spec.rule)) {
      g = Random(T * kHeads * GatesPerHead(spec), 4);
      for (float& x : g) x = -0.05f * (x + 1.0f);
    }
    if (HasBeta(spec.rule)) {
      beta = Random(T * kHeads, 5);
      for (float& x : beta) x = 0.5f * (x + 1.0f);
    }
    if (HasLowRank(spec.rule)) {
      const uint32_t d = spec.key_dim;
      a = Random(T * kHeads * d, 6);
      b = Random(T * kHeads * d, 7);
      for (uint64_t row = 0; row < T * kHeads; ++row) {
        float* ar = a.data() + row * d;
        float* br = b.data() + row * d;
        float ss = 0;
        for (uint32_t i = 0; i < d; ++i) ss += ar[i] * ar[i];
        const float inv = 1.0f / std::sqrt(ss);
        for (uint32_t i = 0; i < d; ++i) {
          const float kappa = ar[i] * inv;
          ar[i] = -kappa;
          br[i] = kappa * 0.5f * (br[i] + 1.0f);
        }
      }
    }
  }
  SequenceInput token(const AttentionSpec& spec, uint64_t t) const {
    SequenceInput all{q.data(), k.data(), v.data(), T};
    if (!g.empty()) all.g = g.data();
    if (!beta.empty()) all.beta = beta.data();
    if (!a.empty()) {
      all.a = a.data();
      all.b = b.data();
    }
    return TokenOf(spec, all, t);
  }
  SequenceInput all(const AttentionSpec& spec) const {
    SequenceInput in = token(spec, 0);
    in.tokens = T;
    return in;
  }
  uint64_t T;
  std::vector<float> q, k, v, g, beta, a, b;
};

// (d) One decode step of B sessions under a rule; arguments rule, d, B.
// frac_of_rmw counts one read and one write of S per step (what the
// gated step moves; the delta step reads S once more, so its bound is
// lower).
void BM_RuleDecodeStep(benchmark::State& st) {
  const AttentionSpec spec = RuleSpec(st.range(0), st.range(1));
  const uint32_t B = st.range(2);
  const Attention attention = *Attention::Create(spec);
  const RuleInputs inputs(spec, B);  // token b is session b's
  std::vector<AttentionState> states;
  for (uint32_t b = 0; b < B; ++b) states.push_back(attention.NewState());
  std::vector<float> y(uint64_t(B) * kHeads * spec.value_dim), den(B * kHeads);
  std::vector<uint8_t> avail(B * kHeads);
  std::vector<StepItem> items;
  for (uint32_t b = 0; b < B; ++b) {
    items.push_back({&attention,
                     &states[b],
                     inputs.token(spec, b),
                     {y.data() + uint64_t(b) * kHeads * spec.value_dim,
                      den.data() + b * kHeads, avail.data() + b * kHeads}});
  }
  const uint64_t state_bytes = uint64_t(B) * states[0].bytes();
  for (auto _ : st) {
    if (!StepBatch(items).ok()) st.SkipWithError("step failed");
    benchmark::DoNotOptimize(y.data());
  }
  const double rmw = bench::RmwBandwidth(state_bytes);  // right after
  st.counters["us_per_session_step"] = benchmark::Counter(
      double(st.iterations()) * B * 1e-6,
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  st.counters["rmw_GBps"] = rmw / 1e9;
  st.counters["frac_of_rmw"] = benchmark::Counter(
      2.0 * state_bytes * st.iterations() / rmw, benchmark::Counter::kIsRate);
  st.SetLabel(std::string(RuleName(st.range(0))) + " " + ActiveKernels().name);
}
BENCHMARK(BM_RuleDecodeStep)
    ->ArgsProduct({{1, 2, 3, 4, 5, 6}, {64, 128}, {1, 64}})
    ->UseRealTime();

// (e) Chunkwise prefill of T tokens into one fresh session under a rule;
// arguments rule, d, T and, for rwkv7, the order (0 its chunkwise WY form,
// 1 its recurrent step token by token). GFLOPs counts the matmuls
// executed.
void BM_RuleChunkwisePrefill(benchmark::State& st) {
  const AttentionSpec spec = RuleSpec(st.range(0), st.range(1));
  const uint64_t T = st.range(2);
  const bool recurrent = st.range(3) == 1;
  const Attention attention = *Attention::Create(spec);
  const RuleInputs inputs(spec, T);
  std::vector<float> y(T * kHeads * spec.value_dim), den(T * kHeads);
  std::vector<uint8_t> avail(T * kHeads);
  ChunkwiseRunner runner({.chunk_size = 64,
                          .round_chunks = 16,
                          .rwkv7_order = recurrent ? Rwkv7Order::kRecurrent
                                                   : Rwkv7Order::kChunkwise});
  AttentionState state = attention.NewState();
  double flops = 0;
  for (auto _ : st) {
    state.Reset();
    if (!runner
             .Run(attention, state, inputs.all(spec),
                  {y.data(), den.data(), avail.data()})
             .ok()) {
      st.SkipWithError("prefill failed");
    }
    flops += runner.last_matmul_flops();
  }
  const double peak = bench::LargeGemmGflops();  // right after
  st.SetItemsProcessed(int64_t(st.iterations()) * T);
  st.counters["GFLOPs"] =
      benchmark::Counter(flops / 1e9, benchmark::Counter::kIsRate);
  st.counters["gemm_peak_GFLOPs"] = peak;
  st.counters["frac_of_peak"] =
      benchmark::Counter(flops / 1e9 / peak, benchmark::Counter::kIsRate);
  st.SetLabel(std::string(RuleName(st.range(0))) +
              (recurrent ? " recurrent" : ""));
}
BENCHMARK(BM_RuleChunkwisePrefill)
    ->ArgsProduct({{1, 2, 3, 4, 5, 6}, {64, 128}, {4096, 16384}, {0}})
    ->ArgsProduct({{5}, {64, 128}, {4096, 16384}, {1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace linattn

BENCHMARK_MAIN();
