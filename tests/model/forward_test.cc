// The C++ forward against the PyTorch reference (tools/linattn_ref.py), and
// its evaluation orders against each other.
#include "core/model/forward.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/model/model.h"
#include "tests/model/fixtures.h"

namespace linattn {
namespace {

using testing::FixtureCase;
using testing::FixtureNames;
using testing::LoadFixture;
using testing::LogitTolerance;

double MaxAbs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

TEST(ModelFixtures, Present) {
  // Every feature map × normalised/unnormalised × MHA/GQA, the extras, and
  // the built-in model.
  const auto names = FixtureNames();
  EXPECT_GE(names.size(), 7u * 2 * 2 + 8)
      << "LINATTN_MODEL_FIXTURES=" << testing::FixtureRoot();
  EXPECT_NE(std::find(names.begin(), names.end(), "builtin"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "builtin_rwkv7"),
            names.end());
}

// Packed products per layer, each rounding its input once with bf16 or
// int8 weights: gated_deltanet's fused input projection, o, the fused
// gate/up and down (the built-in model); rwkv7's r, k, v, the two halves of
// its four LoRAs (layer 0 has no v LoRA: an upper count there), o, and the
// channel mix's key and value (the RWKV-7 model shipped beside it).
double PackedProductsPerLayer(const ModelConfig& c) {
  return c.model_type == "rwkv7" ? 14.0 : 4.0;
}

// What rounding each packed product's input to bf16 or int8 adds to the
// fp32 forward's bound on logits of magnitude `logits`.
double RoundingTolerance(const ModelConfig& c, WeightType weights,
                         double logits) {
  const double products = PackedProductsPerLayer(c) * c.num_hidden_layers + 1;
  if (weights == WeightType::kBf16) {
    // Each packed product (per layer and the lm_head) rounds its input to
    // bf16 (unit roundoff 2^-8; the built-in model's weights are bf16 in its
    // file, so they are not rounded again): one more 2^-8 relative error per
    // product in the chain, on the same magnitudes.
    return products * std::ldexp(1.0, -8) * std::max(1.0, logits);
  }
  if (weights == WeightType::kInt8) {
    // The same first-order argument with int8's steps: per product the
    // error is at most (t/2)Σ|w| + (s/2)Σ|x| + in·t·s/4 (linear.h), which
    // is at most 2/254 + 1/(4·127²) of in·max|x|·max|w|, the product's own
    // scale; one such relative error per product in the chain, on the
    // logits' scale. A tolerance for a well-conditioned forward, not a
    // proven bound (linear_test.cc proves the per-product one).
    return products * (2.0 / 254 + 1.0 / (4 * 127 * 127)) *
           std::max(1.0, logits);
  }
  return 0;
}

// The fixture directories exist only once the ctest fixture has run, so the
// cases are looped over inside one test rather than listed at discovery.
void CheckLogitsMatchPyTorch(const std::string& name,
                             WeightType weights = WeightType::kF32) {
  SCOPED_TRACE(name + " " + WeightTypeName(weights));
  const FixtureCase fx = LoadFixture(name);
  auto model = Model::Load(fx.dir, "", weights);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  const size_t V = c.vocab_size, T = fx.tokens.size();
  ASSERT_EQ(fx.logits.size(), T * V);

  // One call (chunkwise prefill in passes of 32 rows, so that the state
  // also crosses pass boundaries), logits after every token.
  ForwardRunner runner(*model, ForwardOptions{.max_rows = 32});
  ModelState state = (*model)->NewState();
  std::vector<float> all(T * V), last(V);
  ForwardItem item{.state = &state,
                   .tokens = fx.tokens,
                   .logits = last.data(),
                   .all_logits = all.data()};
  ASSERT_TRUE(runner.Run(std::span<const ForwardItem>(&item, 1)).ok());
  EXPECT_EQ(state.position(), T);

  const double tol = LogitTolerance(c, T, MaxAbs(fx.logits)) +
                     RoundingTolerance(c, weights, MaxAbs(fx.logits));
  double worst = 0;
  for (size_t i = 0; i < T * V; ++i) {
    worst = std::max(worst, std::fabs(all[i] - fx.logits[i]));
  }
  EXPECT_LE(worst, tol);
  for (size_t v = 0; v < V; ++v) EXPECT_EQ(last[v], all[(T - 1) * V + v]);
}

TEST(ForwardReferenceTest, LogitsAtEveryPositionMatchPyTorch) {
  const auto names = FixtureNames();
  ASSERT_FALSE(names.empty());
  for (const std::string& name : names) CheckLogitsMatchPyTorch(name);
}

// With bf16 weights (where the CPU has native bf16 products) the built-in
// model's logits stay within a tolerance: the fp32 bound plus one bf16
// rounding per product. It assumes a well-conditioned forward (perturbations of
// a product's inputs move the logits by their own relative size), which a
// trained model is; several random fixtures are not (features normalised
// by sums that nearly cancel amplify any 2^-8 perturbation to O(1) changes
// in the logits), so they are checked at fp32 only. PackedLinear's own
// bf16 bound is tested on every shape in tests/onednn/linear_test.cc.
TEST(ForwardReferenceTest, Bf16WeightsStayWithinTheirTolerance) {
  if (!Bf16Supported().ok()) GTEST_SKIP() << Bf16Supported().message();
  CheckLogitsMatchPyTorch("builtin", WeightType::kBf16);
  CheckLogitsMatchPyTorch("builtin_rwkv7", WeightType::kBf16);
}

// int8 weights, under the same assumption, with int8's quantisation steps in
// place of bf16's rounding. bench/compare measures the int8 model against
// f32 on the whole held-out text (logit differences and loss).
TEST(ForwardReferenceTest, Int8WeightsStayWithinTheirTolerance) {
  if (!Int8Supported().ok()) GTEST_SKIP() << Int8Supported().message();
  CheckLogitsMatchPyTorch("builtin", WeightType::kInt8);
  CheckLogitsMatchPyTorch("builtin_rwkv7", WeightType::kInt8);
}

// One call, several calls, and token by token (recurrent decode steps) give
// the same next-token logits.
void CheckPrefillOrders(const std::string& name) {
  SCOPED_TRACE(name);
  const FixtureCase fx = LoadFixture(name);
  auto model = Model::Load(fx.dir);
  ASSERT_TRUE(model.ok()) << model.status();
  const size_t V = (*model)->config().vocab_size, T = fx.tokens.size();
  ForwardRunner runner(*model);
  std::span<const int32_t> tokens(fx.tokens);

  ModelState one = (*model)->NewState();
  std::vector<float> l_one(V);
  ASSERT_TRUE(runner.Run(one, tokens, l_one.data()).ok());

  ModelState several = (*model)->NewState();
  std::vector<float> l_several(V);
  size_t at = 0;
  for (size_t n : {1, 5, 30, 2}) {
    ASSERT_TRUE(
        runner.Run(several, tokens.subspan(at, n), l_several.data()).ok());
    at += n;
  }
  ASSERT_TRUE(runner.Run(several, tokens.subspan(at), l_several.data()).ok());

  ModelState steps = (*model)->NewState();
  std::vector<float> l_steps(V);
  for (size_t i = 0; i < T; ++i) {
    ASSERT_TRUE(runner.Run(steps, tokens.subspan(i, 1), l_steps.data()).ok());
  }
  EXPECT_EQ(one.position(), T);
  EXPECT_EQ(several.position(), T);
  EXPECT_EQ(steps.position(), T);

  const std::vector<double> ref(fx.logits.end() - V, fx.logits.end());
  const double tol = LogitTolerance((*model)->config(), T, MaxAbs(ref));
  for (size_t v = 0; v < V; ++v) {
    EXPECT_NEAR(l_several[v], l_one[v], tol) << v;
    EXPECT_NEAR(l_steps[v], l_one[v], tol) << v;
  }
}

TEST(PrefillOrderTest, OneCallSeveralCallsAndTokenByTokenAgree) {
  const auto names = FixtureNames();
  ASSERT_FALSE(names.empty());
  for (const std::string& name : names) CheckPrefillOrders(name);
}

// A batch of sessions (mixed decode rows and prompt pieces) gives each the
// logits it gets alone; a hybrid's too (its attention layers over sessions
// of different lengths).
void CheckBatchedEqualsOneByOne(const std::string& name) {
  SCOPED_TRACE(name);
  const FixtureCase fx = LoadFixture(name);
  auto model = Model::Load(fx.dir);
  ASSERT_TRUE(model.ok()) << model.status();
  const size_t V = (*model)->config().vocab_size;
  ForwardRunner runner(*model);
  std::span<const int32_t> tokens(fx.tokens);
  // Sessions at different positions: 0, 1, 10 and 40 tokens of context.
  const size_t contexts[] = {0, 1, 10, 40};
  const size_t feeds[] = {1, 7, 1, 20};
  std::vector<ModelState> alone, batched;
  std::vector<std::vector<float>> l_alone(4, std::vector<float>(V)),
      l_batched(4, std::vector<float>(V));
  for (int i = 0; i < 4; ++i) {
    alone.push_back((*model)->NewState());
    if (contexts[i] > 0) {
      ASSERT_TRUE(
          runner.Run(alone[i], tokens.subspan(0, contexts[i]), nullptr).ok());
    }
    batched.push_back(alone[i].Copy());
  }
  std::vector<ForwardItem> items;
  for (int i = 0; i < 4; ++i) {
    auto feed = tokens.subspan(contexts[i], feeds[i]);
    ASSERT_TRUE(runner.Run(alone[i], feed, l_alone[i].data()).ok());
    items.push_back(ForwardItem{
        .state = &batched[i], .tokens = feed, .logits = l_batched[i].data()});
  }
  ASSERT_TRUE(runner.Run(items).ok());
  const double tol = LogitTolerance((*model)->config(), 60, 30);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(batched[i].position(), alone[i].position());
    for (size_t v = 0; v < V; ++v) {
      EXPECT_NEAR(l_batched[i][v], l_alone[i][v], tol) << i << " " << v;
    }
  }
}

TEST(ForwardBatchTest, BatchedEqualsOneByOne) {
  CheckBatchedEqualsOneByOne("elu_norm_gqa");
  CheckBatchedEqualsOneByOne("hybrid_gla_window_gqa_bias");
  CheckBatchedEqualsOneByOne("hybrid_gated_deltanet_specs");
  CheckBatchedEqualsOneByOne("hybrid_rwkv6_first_window");
}

// A decode step of many sessions runs as groups of sessions, one runner per
// thread (ForwardOptions::session_groups; forced here, so that the groups
// run whatever the machine's threads): each session, at its own context
// length, gets the logits and state it gets in a step alone, over two
// steps, with `into` items among them (their states left as they were); a
// hybrid's attention layers too. With bf16 or int8 weights a product of
// another row count may order a row's sums otherwise, and the next
// product's input may then round to a neighbouring step: the rounding term
// of every product in the chain (RoundingTolerance) is added.
void CheckSessionGroupsEqualOneByOne(const std::string& name,
                                     WeightType weights = WeightType::kF32) {
  SCOPED_TRACE(name + " " + WeightTypeName(weights));
  const FixtureCase fx = LoadFixture(name);
  auto model = Model::Load(fx.dir, "", weights);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  const size_t V = c.vocab_size, n = 3 * kMinGroupSessions + 2;
  std::span<const int32_t> tokens(fx.tokens);
  ASSERT_GT(tokens.size(), n + 2);
  ForwardRunner alone_runner(*model, ForwardOptions{.session_groups = 1});
  ForwardRunner grouped_runner(*model, ForwardOptions{.session_groups = 3});
  std::vector<ModelState> alone, grouped, into;
  for (size_t i = 0; i < n; ++i) {
    alone.push_back((*model)->NewState());
    if (i > 0) {
      ASSERT_TRUE(
          alone_runner.Run(alone[i], tokens.subspan(0, i), nullptr).ok());
    }
    grouped.push_back(alone[i].Copy());
    into.push_back((*model)->NewState());
  }
  std::vector<std::vector<float>> l_alone(n, std::vector<float>(V)),
      l_grouped(n, std::vector<float>(V));
  const double tol =
      LogitTolerance(c, n + 2, 30) + RoundingTolerance(c, weights, 30);
  for (size_t step = 0; step < 2; ++step) {
    std::vector<ForwardItem> items;
    std::vector<ModelState> before;
    for (size_t i = 0; i < n; ++i) {
      auto feed = tokens.subspan(i + step, 1);
      ASSERT_TRUE(alone_runner.Run(alone[i], feed, l_alone[i].data()).ok());
      // Every third session's first step goes into another state.
      const bool to_into = step == 0 && i % 3 == 0;
      if (to_into) before.push_back(grouped[i].Copy());
      items.push_back(ForwardItem{.state = &grouped[i],
                                  .tokens = feed,
                                  .logits = l_grouped[i].data(),
                                  .into = to_into ? &into[i] : nullptr});
    }
    ASSERT_TRUE(grouped_runner.Run(items).ok());
    EXPECT_EQ(grouped_runner.last_session_groups(), 3u);
    for (size_t i = 0; step == 0 && i < n; i += 3) {
      const ModelState& was = before[i / 3];
      EXPECT_EQ(grouped[i].position(), was.position());
      for (size_t l = 0; l < was.layers().size(); ++l) {
        EXPECT_EQ(0,
                  std::memcmp(grouped[i].layers()[l].data(),
                              was.layers()[l].data(), was.layers()[l].bytes()))
            << "session " << i << " layer " << l;
      }
      std::swap(grouped[i], into[i]);
    }
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(grouped[i].position(), alone[i].position()) << i;
      for (size_t v = 0; v < V; ++v) {
        ASSERT_NEAR(l_grouped[i][v], l_alone[i][v], tol)
            << "step " << step << " session " << i << " logit " << v;
      }
    }
  }
  // No split: a prompt piece among the items, or fewer than
  // kMinGroupSessions per group.
  std::vector<ForwardItem> mixed;
  for (size_t i = 0; i < n; ++i) {
    mixed.push_back(ForwardItem{.state = &grouped[i],
                                .tokens = tokens.subspan(i + 2, i == 0 ? 2 : 1),
                                .logits = l_grouped[i].data()});
  }
  ASSERT_TRUE(grouped_runner.Run(mixed).ok());
  EXPECT_EQ(grouped_runner.last_session_groups(), 1u);
  ASSERT_TRUE(grouped_runner
                  .Run(std::span<const ForwardItem>(mixed).subspan(
                      1, 2 * kMinGroupSessions - 1))
                  .ok());
  EXPECT_EQ(grouped_runner.last_session_groups(), 1u);
}

TEST(ForwardBatchTest, SessionGroupsEqualOneByOne) {
  for (const char* name :
       {"builtin", "builtin_rwkv7", "elu_norm_gqa", "mamba2_groups",
        "rwkv6_plain", "hybrid_gla_window_gqa_bias",
        "hybrid_gated_deltanet_specs"}) {
    CheckSessionGroupsEqualOneByOne(name);
  }
  // bf16 and int8 products (oneDNN's, one stream per thread) in groups too.
  for (WeightType weights : {WeightType::kBf16, WeightType::kInt8}) {
    if (WeightTypeSupported(weights).ok()) {
      CheckSessionGroupsEqualOneByOne("builtin_rwkv7", weights);
    }
  }
}

// bf16 chunkwise products (ForwardOptions::chunkwise.precision, the
// server's --prefill-precision) reach the linear-rule layers: a prompt's
// prefill gives other logits than the fp32 one, all finite, and its decode
// continues from the state it left. Their bound is the attention-level one
// (tests/attention/evaluation_orders_test.cc); a random fixture's forward
// is too ill-conditioned to carry it to the logits (see above).
TEST(ForwardBatchTest, Bf16PrefillReachesTheLinearLayers) {
  if (!PrefillPrecisionSupported(PrefillPrecision::kBf16).ok()) {
    GTEST_SKIP() << "no native bf16 products here";
  }
  const FixtureCase fx = LoadFixture("elu_norm_gqa");
  auto model = Model::Load(fx.dir);
  ASSERT_TRUE(model.ok()) << model.status();
  const size_t V = (*model)->config().vocab_size;
  std::span<const int32_t> tokens(fx.tokens);
  ASSERT_GT(tokens.size(), 8u);
  std::vector<float> logits[2];
  int p = 0;
  for (PrefillPrecision precision :
       {PrefillPrecision::kF32, PrefillPrecision::kBf16}) {
    ForwardOptions options;
    options.chunkwise.precision = precision;
    ForwardRunner runner(*model, options);
    ModelState state = (*model)->NewState();
    logits[p].resize(V);
    ASSERT_TRUE(
        runner.Run(state, tokens.first(tokens.size() - 1), nullptr).ok());
    ASSERT_TRUE(runner.Run(state, tokens.last(1), logits[p].data()).ok());
    EXPECT_EQ(state.position(), tokens.size());
    for (float x : logits[p]) ASSERT_TRUE(std::isfinite(x));
    ++p;
  }
  EXPECT_NE(logits[0], logits[1]);
}

// Bad input changes nothing.
TEST(ForwardBatchTest, BadTokenLeavesEveryStateAsItWas) {
  const FixtureCase fx = LoadFixture("hedgehog_norm_mha");
  auto model = Model::Load(fx.dir);
  ASSERT_TRUE(model.ok()) << model.status();
  ForwardRunner runner(*model);
  ModelState a = (*model)->NewState(), b = (*model)->NewState();
  ASSERT_TRUE(
      runner.Run(a, std::span<const int32_t>(fx.tokens).subspan(0, 9), nullptr)
          .ok());
  ModelState a0 = a.Copy();
  const std::vector<int32_t> good = {1, 2, 3}, bad = {4, 300, 5};
  ForwardItem items[] = {{.state = &a, .tokens = good},
                         {.state = &b, .tokens = bad}};
  absl::Status s = runner.Run(items);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("items[1].tokens[1]"), std::string::npos) << s;
  EXPECT_EQ(a.position(), 9u);
  EXPECT_EQ(b.position(), 0u);
  for (size_t l = 0; l < a.layers().size(); ++l) {
    EXPECT_EQ(0, std::memcmp(a.layers()[l].data(), a0.layers()[l].data(),
                             a.layers()[l].bytes()));
  }
  ForwardItem twice[] = {{.state = &a, .tokens = good},
                         {.state = &a, .tokens = good}};
  EXPECT_EQ(runner.Run(twice).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.position(), 9u);
}

// A hybrid's state: the recurrent layers' fixed part, and keys and values
// in whole blocks as the context grows (a windowed layer's up to its ring
// only).
TEST(ModelStateTest, AHybridsKeysAndValuesGrowInBlocks) {
  const FixtureCase fx = LoadFixture("hybrid_gated_deltanet_specs");
  auto model = Model::Load(fx.dir);
  ASSERT_TRUE(model.ok()) << model.status();
  const Model& m = **model;
  const ModelConfig& c = m.config();
  ASSERT_TRUE(c.is_hybrid());
  // Layer 0: 2 heads of 32, a window of 70 (a ring of 128 positions);
  // layer 2: full attention, 1 key/value head of 16.
  const uint64_t row0 = 2 * 32, row2 = 1 * 16;
  EXPECT_EQ(m.kv_bytes_per_token(), 2 * (row0 + row2) * 4);
  auto blocks = [&](uint64_t n0, uint64_t n2) {
    return 2 * kKvBlockTokens * 4 * (n0 * row0 + n2 * row2);
  };
  EXPECT_EQ(m.kv_bytes_at(0), 0u);
  EXPECT_EQ(m.kv_bytes_at(1), blocks(1, 1));
  EXPECT_EQ(m.kv_bytes_at(65), blocks(2, 2));
  EXPECT_EQ(m.kv_bytes_at(1000), blocks(2, 16));
  ModelState state = m.NewState();
  EXPECT_EQ(state.bytes(), m.state_bytes());
  ForwardRunner runner(*model);
  std::span<const int32_t> tokens(fx.tokens);
  ASSERT_TRUE(runner.Run(state, tokens.first(65), nullptr).ok());
  EXPECT_EQ(state.kv_bytes(), m.kv_bytes_at(65));
  EXPECT_EQ(state.bytes(), m.state_bytes() + m.kv_bytes_at(65));
}

// Copies of a hybrid's state share its key/value blocks: a copy costs no
// block, and a token written to one copies only the block it lands in.
// A step `into` another state leaves the state as it was (bits and blocks)
// and gives `into` what a step in place gives.
TEST(ModelStateTest, AHybridsCopiesShareBlocksUntilOneIsWritten) {
  const FixtureCase fx = LoadFixture("hybrid_gated_deltanet_specs");
  auto model = Model::Load(fx.dir);
  ASSERT_TRUE(model.ok()) << model.status();
  const Model& m = **model;
  const size_t V = m.config().vocab_size;
  ForwardRunner runner(*model);
  std::span<const int32_t> tokens(fx.tokens);
  ModelState state = m.NewState();
  ASSERT_TRUE(runner.Run(state, tokens.first(70), nullptr).ok());
  const KvCache& full = state.kv()[2];  // full attention: 2 blocks
  ASSERT_EQ(full.blocks(), 2u);
  EXPECT_EQ(full.shared_blocks(), 0u);

  ModelState fork = state.Copy();
  EXPECT_EQ(state.kv()[0].shared_blocks(), state.kv()[0].blocks());
  EXPECT_EQ(full.shared_blocks(), 2u);
  std::vector<float> l_fork(V), l_into(V), l_place(V);
  ASSERT_TRUE(runner.Run(fork, tokens.subspan(70, 1), l_fork.data()).ok());
  // The fork wrote position 70, in each layer's second block: the first
  // blocks are still shared.
  EXPECT_EQ(full.shared_blocks(), 1u);
  EXPECT_EQ(fork.kv()[2].shared_blocks(), 1u);
  EXPECT_EQ(state.position(), 70u);

  // CopyFrom into a state of the same shape: the same sharing.
  ModelState copied = m.NewState();
  copied.CopyFrom(state);
  EXPECT_EQ(copied.position(), 70u);
  EXPECT_EQ(copied.kv()[2].blocks(), 2u);
  EXPECT_EQ(full.shared_blocks(), 2u);

  ModelState into = m.NewState();
  const std::vector<float> before(full.key(69), full.key(69) + 16);
  ForwardItem item{.state = &state,
                   .tokens = tokens.subspan(70, 1),
                   .logits = l_into.data(),
                   .into = &into};
  ASSERT_TRUE(runner.Run(std::span<const ForwardItem>(&item, 1)).ok());
  EXPECT_EQ(state.position(), 70u);
  EXPECT_EQ(into.position(), 71u);
  EXPECT_EQ(std::vector<float>(full.key(69), full.key(69) + 16), before);
  ASSERT_TRUE(runner.Run(state, tokens.subspan(70, 1), l_place.data()).ok());
  EXPECT_EQ(l_into, l_place);
  EXPECT_EQ(l_fork, l_place);
  std::vector<float> l_copied(V);
  ASSERT_TRUE(runner.Run(copied, tokens.subspan(70, 1), l_copied.data()).ok());
  EXPECT_EQ(l_copied, l_place);
  for (size_t l : {size_t{0}, size_t{2}}) {
    for (uint64_t p = 0; p < 71; ++p) {
      ASSERT_EQ(0, std::memcmp(into.kv()[l].key(p), state.kv()[l].key(p),
                               state.kv()[l].row_floats() * sizeof(float)))
          << l << " " << p;
      ASSERT_EQ(0, std::memcmp(into.kv()[l].value(p), state.kv()[l].value(p),
                               state.kv()[l].row_floats() * sizeof(float)))
          << l << " " << p;
    }
  }
}

TEST(ModelStateTest, StateBytesAreLayersTimesHeadsTimesSAndZ) {
  const FixtureCase fx = LoadFixture("dpfp_norm_gqa");
  auto model = Model::Load(fx.dir);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  const uint64_t dphi = 8 * c.head_k_dim();  // DPFP, ν = 4
  const uint64_t expected = uint64_t{c.num_hidden_layers} * c.num_heads *
                            (dphi * c.head_v_dim() + dphi) * 4;
  EXPECT_EQ((*model)->state_bytes(), expected);
  EXPECT_EQ((*model)->NewState().bytes(), expected);
}

}  // namespace
}  // namespace linattn
