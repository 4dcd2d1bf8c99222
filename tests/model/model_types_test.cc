// The gated and delta-rule model types (retnet, gla, delta_net,
// gated_deltanet, mamba2, rwkv7) beyond their reference logits (forward_test.cc
// holds every fixture to PyTorch): the state's size, snapshots and forks
// with the convolution windows (rwkv7: token-shift rows), failed batches, the
// older tensor names fla wrote, and sessions of every type in one generation
// engine.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "core/attention/state.h"
#include "core/model/forward.h"
#include "core/model/model.h"
#include "core/model/safetensors.h"
#include "core/model/types/rwkv_block.h"
#include "core/scheduler/generation.h"
#include "core/session/snapshot.h"
#include "nlohmann/json.hpp"
#include "tests/model/fixtures.h"
#include "tests/util/temp_dir.h"

namespace linattn {
namespace {

using testing::FixtureCase;
using testing::FixtureNames;
using testing::LoadFixture;

// One fixture of each type, each with its type's less common paths:
// GQA without an output gate, a convolution with GQA, the delta rule's
// convolutions, GVA, B/C groups, rwkv7 without biases over three layers
// (v_first mixed into two), rwkv6 with wider keys and values and no
// pre_norm, granitemoehybrid with experts beside its shared MLP and
// softmax attention in two of its three layers, and qwen3_next with one
// sparse layer among dense ones and gated attention in two of four.
const char* const kOnePerType[] = {
    "retnet_gqa_nogate",
    "gla_conv_gqa",
    "delta_net_silu_l2",
    "gated_deltanet_gva",
    "mamba2_groups",
    "rwkv7_unfused_nobias",
    "rwkv6_expand_no_prenorm",
    "granitemoehybrid_moe_shared_top2_gqa_nope",
    "qwen3_next_sparse_step_mlp_only_top1_unnormed"};

std::shared_ptr<const Model> LoadOrDie(const std::string& dir,
                                       const std::string& name = "") {
  auto model = Model::Load(dir, name);
  EXPECT_TRUE(model.ok()) << dir << ": " << model.status();
  return model.ok() ? *model : nullptr;
}

// A fixture and its model.
struct Opened {
  FixtureCase fx;
  std::shared_ptr<const Model> model;
};
Opened Open(const std::string& name) {
  FixtureCase fx = LoadFixture(name);
  auto model = LoadOrDie(fx.dir);
  return {std::move(fx), std::move(model)};
}

std::vector<float> Feed(ForwardRunner& runner, ModelState& state,
                        std::span<const int32_t> tokens) {
  std::vector<float> logits(runner.model().config().vocab_size);
  EXPECT_TRUE(runner.Run(state, tokens, logits.data()).ok());
  return logits;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool SameState(const ModelState& a, const ModelState& b) {
  if (a.layers().size() != b.layers().size() || a.conv() != b.conv()) {
    return false;
  }
  for (size_t l = 0; l < a.layers().size(); ++l) {
    if (a.layers()[l].position() != b.layers()[l].position() ||
        std::memcmp(a.layers()[l].data(), b.layers()[l].data(),
                    a.layers()[l].bytes()) != 0) {
      return false;
    }
  }
  return true;
}

TEST(ModelTypesTest, EveryTypeHasReferenceFixtures) {
  const auto names = FixtureNames();
  for (const char* type :
       {"retnet_", "gla_", "delta_net_", "gated_deltanet_", "mamba2_", "rwkv7_",
        "rwkv6_", "granitemoehybrid_", "qwen3_next_"}) {
    const auto n = std::count_if(names.begin(), names.end(), [&](auto& s) {
      return s.rfind(type, 0) == 0;
    });
    EXPECT_GE(n, 4) << type;
  }
}

// S of every head (d_k × d_v, no z) and each layer's window of W − 1
// inputs (rwkv7, rwkv6: their two token-shift rows), whatever the context
// length.
TEST(ModelTypesTest, StateIsHeadsTimesKeyTimesValuePlusWindows) {
  for (const char* name : kOnePerType) {
    SCOPED_TRACE(name);
    const auto [fx, model] = Open(name);
    ASSERT_NE(model, nullptr);
    const ModelConfig& c = model->config();
    const uint64_t window =
        c.is_rwkv() ? 2 * uint64_t{c.hidden_size}
                    : uint64_t{c.conv_channels()} * (c.conv_size - 1);
    // A hybrid's softmax-attention layers keep a position-only state (one
    // 1 × 1 head) and their keys and values beside it.
    const AttentionSpec position_only{.num_heads = 1,
                                      .key_dim = 1,
                                      .value_dim = 1,
                                      .feature_map = FeatureMapKind::kIdentity,
                                      .unnormalized = true};
    uint64_t expected = uint64_t{c.num_hidden_layers} * window * 4;
    for (uint32_t l = 0; l < c.num_hidden_layers; ++l) {
      expected += c.attention_layer(l) != nullptr
                      ? StateBytes(position_only)
                      : uint64_t{c.state_heads} * c.head_k * c.head_v * 4;
    }
    EXPECT_EQ(model->state_bytes(), expected);
    ModelState state = model->NewState();
    EXPECT_EQ(state.bytes(), expected);
    ForwardRunner runner(model);
    Feed(runner, state, fx.tokens);
    EXPECT_EQ(state.bytes() - state.kv_bytes(), expected);
    EXPECT_EQ(state.kv_bytes(), model->kv_bytes_at(fx.tokens.size()));
    EXPECT_EQ(state.conv().size(), window == 0 ? 0 : c.num_hidden_layers);
  }
}

// A snapshot carries the windows; a restored session continues bit for bit
// as the original does, and so does a fork.
TEST(ModelTypesTest, SnapshotsAndForksContinueExactly) {
  for (const char* name : kOnePerType) {
    SCOPED_TRACE(name);
    const auto [fx, model] = Open(name);
    ASSERT_NE(model, nullptr);
    ForwardRunner runner(model);
    std::span<const int32_t> tokens(fx.tokens);
    ModelState state = model->NewState();
    Feed(runner, state, tokens.subspan(0, 23));
    const std::string blob =
        SerializeModelSnapshot(*model, state, tokens[23], SamplerPosition{});
    EXPECT_EQ(blob.size(), model->config().is_hybrid()
                               ? ModelSnapshotBytesAt(*model, 23)
                               : ModelSnapshotBytes(*model));
    const std::shared_ptr<const Model> models[] = {model};
    auto parsed = ParseModelSnapshot(blob, models);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_TRUE(SameState(parsed->state, state));
    ModelState fork = state.Copy();
    ModelState into = model->NewState();
    into.CopyFrom(state);

    const auto rest = tokens.subspan(23, 30);
    const std::vector<float> original = Feed(runner, state, rest);
    EXPECT_TRUE(SameBits(Feed(runner, parsed->state, rest), original));
    EXPECT_TRUE(SameBits(Feed(runner, fork, rest), original));
    EXPECT_TRUE(SameBits(Feed(runner, into, rest), original));

    // A window that is not finite is not a state a session can have.
    if (!state.conv().empty()) {
      ModelState bad = model->NewState();
      bad.conv()[0][0] = std::numeric_limits<float>::infinity();
      auto refused = ParseModelSnapshot(
          SerializeModelSnapshot(*model, bad, std::nullopt), models);
      EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(refused.status().message(),
                  ::testing::HasSubstr("layer window"));
    }
  }
}

// A hybrid's snapshot carries the keys and values its caches hold (a
// window's ring: the last of them), of ModelSnapshotBytesAt's size; restored,
// the session continues bit for bit, at a position where the ring has
// wrapped and where it has not. Keys that are not finite are refused.
TEST(ModelTypesTest, HybridSnapshotsCarryTheKeysAndValues) {
  for (const char* name :
       {"hybrid_gla_window_gqa_bias", "hybrid_gated_deltanet_specs",
        "hybrid_rwkv6_first_window", "granitemoehybrid_groups_biases",
        "qwen3_next_moe_gva"}) {
    for (const size_t at : {size_t{9}, size_t{70}}) {
      SCOPED_TRACE(std::string(name) + " at " + std::to_string(at));
      const auto [fx, model] = Open(name);
      ASSERT_NE(model, nullptr);
      ForwardRunner runner(model);
      std::span<const int32_t> tokens(fx.tokens);
      ModelState state = model->NewState();
      Feed(runner, state, tokens.subspan(0, at));
      const std::string blob =
          SerializeModelSnapshot(*model, state, tokens[at], SamplerPosition{});
      EXPECT_EQ(blob.size(), ModelSnapshotBytesAt(*model, at));
      EXPECT_GT(blob.size(), ModelSnapshotBytes(*model));
      const std::shared_ptr<const Model> models[] = {model};
      auto parsed = ParseModelSnapshot(blob, models);
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      EXPECT_TRUE(SameState(parsed->state, state));
      EXPECT_EQ(parsed->state.kv_bytes(), state.kv_bytes());
      const auto rest = tokens.subspan(at, 7);
      const std::vector<float> original = Feed(runner, state, rest);
      EXPECT_TRUE(SameBits(Feed(runner, parsed->state, rest), original));

      // The last key's last float made infinite.
      ModelState bad = model->NewState();
      Feed(runner, bad, tokens.subspan(0, at));
      std::string broken = SerializeModelSnapshot(*model, bad, tokens[at]);
      auto refused = ParseModelSnapshot(broken, models);
      ASSERT_TRUE(refused.ok());
      for (size_t l = 0; l < bad.kv().size(); ++l) {
        KvCache& cache = bad.kv()[l];
        if (cache.row_floats() == 0) continue;
        std::vector<float> key(cache.key(at - 1),
                               cache.key(at - 1) + cache.row_floats());
        std::vector<float> value(cache.value(at - 1),
                                 cache.value(at - 1) + cache.row_floats());
        key.back() = std::numeric_limits<float>::infinity();
        cache.Write(at - 1, key.data(), value.data());
        break;
      }
      refused = ParseModelSnapshot(
          SerializeModelSnapshot(*model, bad, tokens[at]), models);
      EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(refused.status().message(),
                  ::testing::HasSubstr("not finite"));
    }
  }
}

// Sessions at different positions in one batch (decode rows and prompt
// pieces together) get the logits each gets alone.
TEST(ModelTypesTest, BatchedEqualsOneByOne) {
  for (const char* name : kOnePerType) {
    SCOPED_TRACE(name);
    const auto [fx, model] = Open(name);
    ASSERT_NE(model, nullptr);
    const size_t V = model->config().vocab_size;
    ForwardRunner runner(model);
    std::span<const int32_t> tokens(fx.tokens);
    const size_t contexts[] = {0, 1, 2, 10, 40};
    const size_t feeds[] = {1, 7, 1, 1, 20};
    std::vector<ModelState> alone, batched;
    std::vector<std::vector<float>> l_alone(5, std::vector<float>(V)),
        l_batched(5, std::vector<float>(V));
    for (int i = 0; i < 5; ++i) {
      alone.push_back(model->NewState());
      if (contexts[i] > 0)
        Feed(runner, alone[i], tokens.subspan(0, contexts[i]));
      batched.push_back(alone[i].Copy());
    }
    std::vector<ForwardItem> items;
    for (int i = 0; i < 5; ++i) {
      auto feed = tokens.subspan(contexts[i], feeds[i]);
      l_alone[i] = Feed(runner, alone[i], feed);
      items.push_back(ForwardItem{
          .state = &batched[i], .tokens = feed, .logits = l_batched[i].data()});
    }
    ASSERT_TRUE(runner.Run(items).ok());
    const double tol = testing::LogitTolerance(model->config(), 60, 30);
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(batched[i].position(), alone[i].position());
      // The windows hold projections, which the GEMM rounds with the rows
      // around them: equal within one product's rounding.
      ASSERT_EQ(batched[i].conv().size(), alone[i].conv().size());
      for (size_t l = 0; l < alone[i].conv().size(); ++l) {
        for (size_t j = 0; j < alone[i].conv()[l].size(); ++j) {
          EXPECT_NEAR(batched[i].conv()[l][j], alone[i].conv()[l][j], tol);
        }
      }
      for (size_t v = 0; v < V; ++v) {
        EXPECT_NEAR(l_batched[i][v], l_alone[i][v], tol) << i << " " << v;
      }
    }
  }
}

// On the panel kernels (f32 weights on AVX2) each row's products sum in
// the same order whatever rows share the call, and every other pass of a
// decode step works on one session's row alone, so a session's step gives
// the same bits alone and in a batch: its greedy text does not depend on
// which other sessions the server batches it with.
TEST(ModelTypesTest, DecodeStepsGiveTheSameBitsAloneAndBatchedOnPanels) {
  for (const char* name : kOnePerType) {
    SCOPED_TRACE(name);
    const auto [fx, model] = Open(name);
    ASSERT_NE(model, nullptr);
    if (model->lm_head().kernel() != LinearKernel::kPanels) {
      GTEST_SKIP() << "the f32 products run on oneDNN on this CPU";
    }
    const size_t V = model->config().vocab_size;
    ForwardRunner runner(model);
    std::span<const int32_t> tokens(fx.tokens);
    // Seventeen sessions: more rows than one register tile holds on any ISA
    // but AVX-512, and a shorter last tile; stepped by one team over the
    // batch and in two groups of sessions (ForwardOptions::session_groups).
    const size_t contexts[] = {1,  2,  3,  4,  5,  6,  7,  8, 9,
                               10, 11, 12, 13, 14, 21, 30, 40};
    constexpr size_t kSessions = std::size(contexts);
    static_assert(kSessions >= 2 * kMinGroupSessions);
    for (uint32_t groups : {1u, 2u}) {
      SCOPED_TRACE(groups);
      ForwardRunner batch_runner(model, {.session_groups = groups});
      std::vector<ModelState> alone, batched;
      for (size_t i = 0; i < kSessions; ++i) {
        alone.push_back(model->NewState());
        Feed(runner, alone[i], tokens.subspan(0, contexts[i]));
        batched.push_back(alone[i].Copy());
      }
      for (size_t step = 0; step < 3; ++step) {
        std::vector<std::vector<float>> l_alone(kSessions),
            l_batched(kSessions, std::vector<float>(V));
        std::vector<ForwardItem> items;
        for (size_t i = 0; i < kSessions; ++i) {
          auto token = tokens.subspan(contexts[i] + step, 1);
          l_alone[i] = Feed(runner, alone[i], token);
          items.push_back(ForwardItem{.state = &batched[i],
                                      .tokens = token,
                                      .logits = l_batched[i].data()});
        }
        ASSERT_TRUE(batch_runner.Run(items).ok());
        ASSERT_EQ(batch_runner.last_session_groups(), groups);
        for (size_t i = 0; i < kSessions; ++i) {
          EXPECT_TRUE(SameBits(l_alone[i], l_batched[i]))
              << "session " << i << " step " << step;
          EXPECT_TRUE(SameState(alone[i], batched[i]))
              << "session " << i << " step " << step;
        }
      }
    }
  }
}

// A decode step into another state (ForwardItem::into: how the generation
// engine keeps the state before a token it may take back) gives the logits
// and the state (windows included) of the step in place, and leaves the
// state it read as it was; beside an ordinary item in the same batch. An
// `into` for a prompt piece, or shared with another item, is refused.
TEST(ModelTypesTest, AStepIntoAnotherStateLeavesTheStateAsItWas) {
  for (const char* name : kOnePerType) {
    SCOPED_TRACE(name);
    const auto [fx, model] = Open(name);
    ASSERT_NE(model, nullptr);
    const size_t V = model->config().vocab_size;
    ForwardRunner runner(model);
    std::span<const int32_t> tokens(fx.tokens);
    ModelState state = model->NewState(), other = model->NewState();
    Feed(runner, state, tokens.subspan(0, 6));
    Feed(runner, other, tokens.subspan(0, 3));
    const ModelState before = state.Copy();
    ModelState in_place = state.Copy(), other_alone = other.Copy();
    // The target holds another session's state, as an engine's reused
    // rollback slot does.
    ModelState into = model->NewState();
    Feed(runner, into, tokens.subspan(10, 4));
    const auto token = tokens.subspan(6, 1);
    const std::vector<float> l_in_place = Feed(runner, in_place, token);
    const std::vector<float> l_other = Feed(runner, other_alone, token);
    std::vector<float> l_into(V), l_beside(V);
    const ForwardItem items[] = {
        {.state = &state,
         .tokens = token,
         .logits = l_into.data(),
         .into = &into},
        {.state = &other, .tokens = token, .logits = l_beside.data()}};
    ASSERT_TRUE(runner.Run(items).ok());
    EXPECT_TRUE(SameState(state, before));
    EXPECT_TRUE(SameState(into, in_place));
    EXPECT_TRUE(SameState(other, other_alone));
    EXPECT_TRUE(SameBits(l_into, l_in_place));
    EXPECT_TRUE(SameBits(l_beside, l_other));

    const ForwardItem prompt[] = {{.state = &state,
                                   .tokens = tokens.subspan(7, 2),
                                   .logits = l_into.data(),
                                   .into = &into}};
    const ForwardItem shared[] = {
        {.state = &state, .tokens = token, .into = &other},
        {.state = &other, .tokens = token}};
    const ForwardItem itself[] = {
        {.state = &state, .tokens = token, .into = &state}};
    const ModelState other_before = other.Copy();
    for (const auto& bad : {std::span<const ForwardItem>(prompt),
                            std::span<const ForwardItem>(shared),
                            std::span<const ForwardItem>(itself)}) {
      const absl::Status s = runner.Run(bad);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("items["));
      EXPECT_TRUE(SameState(state, before));
      EXPECT_TRUE(SameState(other, other_before));
    }
  }
}

// Bad input anywhere in a batch changes no state and no window.
TEST(ModelTypesTest, BadTokenLeavesStatesAndWindowsAsTheyWere) {
  for (const char* name : kOnePerType) {
    SCOPED_TRACE(name);
    const auto [fx, model] = Open(name);
    ASSERT_NE(model, nullptr);
    ForwardRunner runner(model);
    ModelState a = model->NewState(), b = model->NewState();
    Feed(runner, a, std::span<const int32_t>(fx.tokens).subspan(0, 9));
    const ModelState a0 = a.Copy(), b0 = b.Copy();
    const std::vector<int32_t> good = {1, 2, 3}, bad = {4, 300, 5};
    ForwardItem items[] = {{.state = &a, .tokens = good},
                           {.state = &b, .tokens = bad}};
    EXPECT_EQ(runner.Run(items).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(SameState(a, a0));
    EXPECT_TRUE(SameState(b, b0));
  }
}

// A copy of a fixture's directory whose tensors `edit` renames or joins.
std::string Rewritten(
    const FixtureCase& fx, const std::string& out,
    const std::function<void(std::vector<TensorToWrite>&)>& edit) {
  auto file = SafetensorsFile::Open(fx.dir + "/model.safetensors").value();
  std::vector<TensorToWrite> tensors;
  for (const auto& [name, view] : file->tensors()) {
    TensorToWrite t{name, view.shape, std::vector<float>(view.numel()),
                    view.dtype};
    view.ToFloat(t.values.data());
    tensors.push_back(std::move(t));
  }
  edit(tensors);
  const std::string dir = ::testing::TempDir() + "/" + out;
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(fx.dir + "/config.json", dir + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  std::ofstream(dir + "/model.safetensors", std::ios::binary)
      << SerializeSafetensors(tensors);
  return dir;
}

TensorToWrite* Find(std::vector<TensorToWrite>& tensors,
                    const std::string& name) {
  for (TensorToWrite& t : tensors) {
    if (t.name == name) return &t;
  }
  ADD_FAILURE() << "no tensor " << name;
  return nullptr;
}

void Rename(std::vector<TensorToWrite>& tensors, const std::string& from,
            const std::string& to) {
  if (TensorToWrite* t = Find(tensors, from)) t->name = to;
}

// Checkpoints fla wrote before its renames load as the same model: the MLP
// as one fused gate_proj of 2·I rows (before February 2025), DeltaNet's
// beta_proj and its output norm named `norm`, Gated DeltaNet's unused D,
// and mamba_ssm's `backbone.embedding`.
TEST(ModelTypesTest, OlderTensorNamesLoadTheSameModel) {
  struct Case {
    const char* fixture;
    std::function<void(std::vector<TensorToWrite>&)> edit;
  };
  auto fuse_mlp = [](std::vector<TensorToWrite>& t) {
    for (int l = 0; l < 2; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".mlp.";
      TensorToWrite* gate = Find(t, p + "gate_proj.weight");
      TensorToWrite* up = Find(t, p + "up_proj.weight");
      gate->values.insert(gate->values.end(), up->values.begin(),
                          up->values.end());
      gate->shape[0] *= 2;
      up->name = "";
    }
    std::erase_if(t, [](const TensorToWrite& x) { return x.name.empty(); });
  };
  const Case cases[] = {
      {"delta_net_silu_l2",
       [&](std::vector<TensorToWrite>& t) {
         fuse_mlp(t);
         for (int l = 0; l < 2; ++l) {
           const std::string p = "model.layers." + std::to_string(l) + ".attn.";
           Rename(t, p + "b_proj.weight", p + "beta_proj.weight");
           Rename(t, p + "o_norm.weight", p + "norm.weight");
         }
       }},
      {"gated_deltanet_gva",
       [](std::vector<TensorToWrite>& t) {
         for (int l = 0; l < 2; ++l) {
           t.push_back({"model.layers." + std::to_string(l) + ".attn.D",
                        {4},
                        {1, 2, 3, 4},
                        DType::kF32});
         }
       }},
      {"gla_conv_gqa", fuse_mlp},
      {"mamba2_groups",
       [](std::vector<TensorToWrite>& t) {
         Rename(t, "backbone.embeddings.weight", "backbone.embedding.weight");
       }},
      // fla's first RWKV7Attention: the six token-shift mixes as one x_x of
      // (6, hidden), in the order r, w, k, v, a, g.
      {"rwkv7_unfused_nobias",
       [](std::vector<TensorToWrite>& t) {
         for (int l = 0; l < 3; ++l) {
           const std::string p = "model.layers." + std::to_string(l) + ".attn.";
           TensorToWrite x_x{p + "x_x", {6, 0}, {}, DType::kF32};
           for (const char* m : {"x_r", "x_w", "x_k", "x_v", "x_a", "x_g"}) {
             TensorToWrite* part = Find(t, p + m);
             x_x.shape[1] = part->shape[2];
             x_x.values.insert(x_x.values.end(), part->values.begin(),
                               part->values.end());
             part->name = "";
           }
           t.push_back(std::move(x_x));
         }
         std::erase_if(t,
                       [](const TensorToWrite& x) { return x.name.empty(); });
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.fixture);
    const FixtureCase fx = LoadFixture(c.fixture);
    auto model = LoadOrDie(fx.dir);
    auto older =
        LoadOrDie(Rewritten(fx, std::string("older_") + c.fixture, c.edit));
    ASSERT_NE(model, nullptr);
    ASSERT_NE(older, nullptr);
    ForwardRunner a(model), b(older);
    ModelState sa = model->NewState(), sb = older->NewState();
    EXPECT_TRUE(SameBits(Feed(a, sa, fx.tokens), Feed(b, sb, fx.tokens)));
  }
}

// A converted fixture's model loaded with its state file (written by
// tests/python/make_model_fixtures.py with the logits BlinkDL's own numpy
// statement gives from the same state, loaded there as RWKV's code does,
// value × key as it is in the file): every new session starts from it and
// gives those logits; the state is part of the model's fingerprint.
void ExpectStateFileStartsSessions(const FixtureCase& fx,
                                   std::shared_ptr<const Model>* model_out,
                                   std::shared_ptr<const Model>* plain_out) {
  const std::string file = fx.dir + "/initial_state.safetensors";
  auto loaded = Model::Load(fx.dir, "", WeightType::kF32, file);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const std::shared_ptr<const Model> model = *loaded;
  const std::shared_ptr<const Model> plain = LoadOrDie(fx.dir);
  ASSERT_NE(plain, nullptr);
  *model_out = model;
  *plain_out = plain;
  EXPECT_EQ(model->initial_state_file(), file);
  EXPECT_NE(model->fingerprint(), plain->fingerprint());
  EXPECT_EQ(model->state_bytes(), plain->state_bytes());

  std::ifstream in(fx.dir + "/logits_initial_state.f64", std::ios::binary);
  const size_t V = model->config().vocab_size, T = fx.tokens.size();
  std::vector<double> expected(T * V);
  in.read(reinterpret_cast<char*>(expected.data()), T * V * sizeof(double));
  ASSERT_TRUE(in.good());
  ForwardRunner runner(model);
  for (int session = 0; session < 2; ++session) {
    ModelState state = model->NewState();
    EXPECT_EQ(state.position(), 0u);
    std::vector<float> all(T * V);
    ForwardItem item{
        .state = &state, .tokens = fx.tokens, .all_logits = all.data()};
    ASSERT_TRUE(runner.Run(std::span<const ForwardItem>(&item, 1)).ok());
    double largest = 0;
    for (double x : expected) largest = std::max(largest, std::fabs(x));
    const double tol = testing::LogitTolerance(model->config(), T, largest);
    double worst = 0, moved = 0;
    for (size_t i = 0; i < T * V; ++i) {
      worst = std::max(worst, std::fabs(all[i] - expected[i]));
      moved = std::max(moved, std::fabs(expected[i] - fx.logits[i]));
    }
    EXPECT_LE(worst, tol) << "session " << session;
    // The state matters: it moves the logits far beyond the tolerance.
    EXPECT_GT(moved, 100 * tol);
  }
}

// RWKV's state files, RWKV-7's (rwkv7_converted) and RWKV-6's
// (rwkv6_converted): sessions start from them as RWKV's code does; a
// snapshot of a zero-started session is another model's; what is not such
// a state is refused by name.
TEST(ModelTypesTest, AnInitialStateFileStartsSessionsAsRwkvsCodeDoes) {
  {
    SCOPED_TRACE("rwkv6_converted");
    std::shared_ptr<const Model> model, plain;
    ExpectStateFileStartsSessions(LoadFixture("rwkv6_converted"), &model,
                                  &plain);
  }
  const FixtureCase fx = LoadFixture("rwkv7_converted");
  const std::string file = fx.dir + "/initial_state.safetensors";
  std::shared_ptr<const Model> model, plain;
  ExpectStateFileStartsSessions(fx, &model, &plain);
  ASSERT_NE(model, nullptr);

  // A snapshot of a session that started from zeros is another model's.
  ForwardRunner plain_runner(plain);
  ModelState zero_start = plain->NewState();
  Feed(plain_runner, zero_start, std::span<const int32_t>(fx.tokens).first(5));
  const std::shared_ptr<const Model> models[] = {model};
  EXPECT_FALSE(
      ParseModelSnapshot(
          SerializeModelSnapshot(*plain, zero_start, std::nullopt), models)
          .ok());

  // What is not an initial state of this model is refused, naming it.
  auto time_state = [&](int layer, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return TensorToWrite{"blocks." + std::to_string(layer) + ".att.time_state",
                         shape, std::vector<float>(n, 0.5f), DType::kF32};
  };
  struct Bad {
    std::vector<TensorToWrite> tensors;
    const char* words;
  };
  const Bad bad[] = {
      {{time_state(0, {2, 64, 64})}, "blocks.1.att.time_state"},
      {{time_state(0, {2, 64, 64}), time_state(1, {2, 32, 64})},
       "blocks.1.att.time_state"},
      {{time_state(0, {2, 64, 64}), time_state(1, {2, 64, 64}),
        time_state(2, {2, 64, 64})},
       "unexpected tensor 'blocks.2.att.time_state'"},
  };
  const std::string dir = ::testing::TempDir();
  for (size_t i = 0; i < std::size(bad); ++i) {
    SCOPED_TRACE(bad[i].words);
    const std::string path =
        dir + "/bad_state_" + std::to_string(i) + ".safetensors";
    std::ofstream(path, std::ios::binary)
        << SerializeSafetensors(bad[i].tensors);
    auto refused = Model::Load(fx.dir, "", WeightType::kF32, path);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(refused.status().message(), ::testing::HasSubstr(path));
    EXPECT_THAT(refused.status().message(), ::testing::HasSubstr(bad[i].words));
  }
  EXPECT_EQ(Model::Load(fx.dir, "", WeightType::kF32, dir + "/missing")
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  // State files are RWKV-7's and RWKV-6's.
  auto other =
      Model::Load(LoadFixture("gla_plain").dir, "", WeightType::kF32, file);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(other.status().message(),
              ::testing::HasSubstr("RWKV-7's and RWKV-6's"));
}

// A window size from config.json alone is checked against the file before
// the window's weights are allocated.
TEST(ModelTypesTest, AConvolutionWidthTheFileDoesNotHoldIsRefused) {
  // (A config without Python's Infinity, which this test's JSON reader
  // would not take.)
  const FixtureCase fx = LoadFixture("mamba2_limits_old_names");
  const std::string dir = Rewritten(fx, "wide_conv", [](auto&) {});
  std::ifstream in(dir + "/config.json");
  nlohmann::json config = nlohmann::json::parse(in, nullptr, false, true);
  ASSERT_FALSE(config.is_discarded());
  config["conv_kernel"] = 1 << 20;
  std::ofstream(dir + "/config.json") << config.dump();
  auto model = Model::Load(dir);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(model.status().message(), ::testing::HasSubstr("conv1d.weight"));
}

// Sessions of all five types in one engine, generating at once: greedy
// streams are the model's own argmax continuations, and a seeded sampled
// stream repeats.
TEST(ModelTypesTest, OneEngineServesEveryTypeAtOnce) {
  std::vector<std::shared_ptr<const Model>> models;
  for (const char* name : kOnePerType) {
    models.push_back(LoadOrDie(LoadFixture(name).dir, name));
    ASSERT_NE(models.back(), nullptr);
  }
  const std::vector<int32_t> prompt = {72, 101, 108, 108, 111, 44, 32, 119};
  auto local_greedy = [&](const std::shared_ptr<const Model>& m) {
    ForwardRunner runner(m);
    ModelState state = m->NewState();
    std::vector<int32_t> out;
    std::vector<float> logits = Feed(runner, state, prompt);
    for (int i = 0; i < 12; ++i) {
      const int32_t t = static_cast<int32_t>(
          std::max_element(logits.begin(), logits.end()) - logits.begin());
      out.push_back(t);
      if (m->config().eos_token_id == t) break;
      logits = Feed(runner, state, std::span<const int32_t>(&t, 1));
    }
    return out;
  };
  GenerationEngine engine(models);
  struct Run {
    std::promise<std::vector<int32_t>> done;
    std::vector<int32_t> ids;
  };
  std::vector<std::unique_ptr<Run>> runs;
  auto start = [&](const std::string& model, SamplingParams params) {
    auto s = engine.CreateSession(model, "");
    EXPECT_TRUE(s.ok()) << s.status();
    runs.push_back(std::make_unique<Run>());
    Run* r = runs.back().get();
    engine.Generate(s->session_id, prompt, params, [r](const GenerateEvent& e) {
      if (e.token_id >= 0) r->ids.push_back(e.token_id);
      if (e.finished) r->done.set_value(r->ids);
    });
  };
  const SamplingParams sampled{
      .temperature = 0.9f, .top_p = 0.95f, .seed = 11, .max_tokens = 12};
  for (const char* name : kOnePerType) {
    start(name, SamplingParams{.max_tokens = 12});
    start(name, sampled);
    start(name, sampled);
  }
  for (size_t i = 0; i < models.size(); ++i) {
    SCOPED_TRACE(kOnePerType[i]);
    const auto greedy = runs[3 * i]->done.get_future().get();
    EXPECT_EQ(greedy, local_greedy(models[i]));
    const auto s1 = runs[3 * i + 1]->done.get_future().get();
    const auto s2 = runs[3 * i + 2]->done.get_future().get();
    EXPECT_FALSE(s1.empty());
    EXPECT_EQ(s1, s2);
  }
}

// RWKV's channel-mix activation as torch.relu(x) ** 2 gives it: every
// negative value (−inf and values whose square would overflow included)
// to 0, NaN through, rows of an odd width (the vector loop's tail) alike.
TEST(ModelTypesTest, ReluSquareIsTorchsOnEveryKindOfValue) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> in = {-inf, -1e20f, -1.0f, -0.0f,   0.0f, 1e-3f,
                                 2.0f, 1e20f,  inf,   -1e-30f, 3.0f};
  std::vector<float> h;
  for (int r = 0; r < 3; ++r) h.insert(h.end(), in.begin(), in.end());
  RwkvReluSquare(h.data(), 3, in.size());
  for (size_t i = 0; i < h.size(); ++i) {
    const float x = in[i % in.size()];
    const float want = x > 0.0f ? x * x : 0.0f;
    EXPECT_EQ(h[i], want) << "x = " << x;
  }
  std::vector<float> nan = {std::nanf(""), -std::nanf("")};
  RwkvReluSquare(nan.data(), 1, nan.size());
  EXPECT_TRUE(std::isnan(nan[0]) && std::isnan(nan[1]));
}

}  // namespace
}  // namespace linattn

namespace linattn {
namespace {

// A checkpoint in shards (transformers' model.safetensors.index.json) is the
// same model as in one file: the same fingerprint and the same logits.
TEST(ModelTypesTest, AShardedCheckpointIsTheSameModel) {
  const FixtureCase fx = LoadFixture("granitemoehybrid_tied_bf16");
  auto whole = SafetensorsFile::Open(fx.dir + "/model.safetensors");
  ASSERT_TRUE(whole.ok()) << whole.status();
  ::linattn::testing::TempDir tmp;
  const std::string dir = tmp.Path("sharded");
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(fx.dir + "/config.json", dir + "/config.json");
  std::vector<TensorToWrite> shards[3];
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}};
  size_t i = 0;
  for (const auto& [name, view] : (*whole)->tensors()) {
    TensorToWrite t{name, view.shape, std::vector<float>(view.numel()),
                    view.dtype};
    view.ToFloat(t.values.data());
    const std::string shard =
        absl::StrCat("model-0000", i % 3 + 1, "-of-00003.safetensors");
    index["weight_map"][name] = shard;
    shards[i++ % 3].push_back(std::move(t));
  }
  for (int s = 0; s < 3; ++s) {
    std::ofstream(
        absl::StrCat(dir, "/model-0000", s + 1, "-of-00003.safetensors"),
        std::ios::binary)
        << SerializeSafetensors(shards[s]);
  }
  std::ofstream(dir + "/model.safetensors.index.json") << index.dump();
  const auto one = LoadOrDie(fx.dir), sharded = LoadOrDie(dir);
  ASSERT_NE(sharded, nullptr);
  EXPECT_EQ(sharded->fingerprint(), one->fingerprint());
  ForwardRunner a(one), b(sharded);
  ModelState sa = one->NewState(), sb = sharded->NewState();
  EXPECT_TRUE(SameBits(Feed(a, sa, fx.tokens), Feed(b, sb, fx.tokens)));
  // A shard the index names that is not there.
  std::filesystem::remove(dir + "/model-00002-of-00003.safetensors");
  auto missing = Model::Load(dir);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(),
              ::testing::HasSubstr("model-00002-of-00003.safetensors"));
}

// Qwen3-Next's checkpoints carry multi-token-prediction layers (mtp.*) that
// linattn does not run: left unread, as transformers leaves them, and said
// so; the model is the same.
TEST(ModelTypesTest, QwenMultiTokenPredictionWeightsAreLeftUnread) {
  const FixtureCase fx = LoadFixture("qwen3_next_moe_gva");
  auto whole = SafetensorsFile::Open(fx.dir + "/model.safetensors");
  ASSERT_TRUE(whole.ok()) << whole.status();
  ::linattn::testing::TempDir tmp;
  const std::string dir = tmp.Path("with_mtp");
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(fx.dir + "/config.json", dir + "/config.json");
  std::vector<TensorToWrite> tensors;
  for (const auto& [name, view] : (*whole)->tensors()) {
    TensorToWrite t{name, view.shape, std::vector<float>(view.numel()),
                    view.dtype};
    view.ToFloat(t.values.data());
    tensors.push_back(std::move(t));
  }
  const int64_t H = 64;
  tensors.push_back({"mtp.fc.weight",
                     {H, 2 * H},
                     std::vector<float>(2 * H * H, 0.5f),
                     DType::kF32});
  tensors.push_back(
      {"mtp.norm.weight", {H}, std::vector<float>(H, 1.0f), DType::kF32});
  std::ofstream(dir + "/model.safetensors", std::ios::binary)
      << SerializeSafetensors(tensors);
  const auto plain = LoadOrDie(fx.dir), with_mtp = LoadOrDie(dir);
  ASSERT_NE(with_mtp, nullptr);
  EXPECT_EQ(plain->ignored_note(), "");
  EXPECT_THAT(with_mtp->ignored_note(),
              ::testing::HasSubstr("2 tensors under 'mtp.'"));
  EXPECT_EQ(with_mtp->parameter_count(), plain->parameter_count());
  ForwardRunner a(plain), b(with_mtp);
  ModelState sa = plain->NewState(), sb = with_mtp->NewState();
  EXPECT_TRUE(SameBits(Feed(a, sa, fx.tokens), Feed(b, sb, fx.tokens)));
  // Another unknown tensor is still refused.
  tensors.push_back(
      {"model.extra.weight", {H}, std::vector<float>(H, 1.0f), DType::kF32});
  std::ofstream(dir + "/model.safetensors", std::ios::binary)
      << SerializeSafetensors(tensors);
  auto refused = Model::Load(dir);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              ::testing::HasSubstr("model.extra.weight"));
}

}  // namespace
}  // namespace linattn
