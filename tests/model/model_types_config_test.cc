// config.json of the gated and delta-rule model types: fla's defaults, the
// older spellings fla wrote, Python's Infinity, and refusals naming the
// field.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/model/config.h"

namespace linattn {
namespace {

using ::testing::HasSubstr;

ModelConfig Parse(const std::string& json) {
  auto c = ParseModelConfig(json);
  EXPECT_TRUE(c.ok()) << c.status() << "\n" << json;
  return c.ok() ? *c : ModelConfig{};
}

void ExpectRefused(const std::string& json, const std::string& field) {
  auto c = ParseModelConfig(json);
  ASSERT_FALSE(c.ok()) << json;
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("config.json: " + field + ":"))
      << json;
}

TEST(ModelTypesConfigTest, DefaultsAreFlasConfigClasses) {
  // RetNetConfig: 8 heads, expand_k 1, expand_v 2, hidden_ratio 2
  // (int(2048·2·2/3) = 2730 → 2816), output gate with the fused norm.
  const ModelConfig r = Parse(R"({"model_type": "retnet"})");
  EXPECT_EQ(r.type, ModelType::kRetNet);
  EXPECT_EQ(r.num_heads, 8u);
  EXPECT_EQ(r.head_k, 256u);
  EXPECT_EQ(r.head_v, 512u);
  EXPECT_EQ(r.intermediate_size, 2816u);
  EXPECT_TRUE(r.output_gate);
  EXPECT_TRUE(r.fused_gate_norm);
  EXPECT_EQ(r.conv_channels(), 0u);
  EXPECT_EQ(r.num_hidden_layers, 24u);
  // An explicit null hidden_ratio is fla's GatedMLP's 4: 5461 → 5632.
  EXPECT_EQ(Parse(R"({"model_type": "retnet", "hidden_ratio": null})")
                .intermediate_size,
            5632u);
  // GLAConfig: 4 heads, expand_k 0.5, no short convolution.
  const ModelConfig g = Parse(R"({"model_type": "gla"})");
  EXPECT_EQ(g.head_k, 256u);
  EXPECT_EQ(g.head_v, 512u);
  EXPECT_FALSE(g.use_short_conv);
  EXPECT_FALSE(g.clamp_min.has_value());
  EXPECT_EQ(g.intermediate_size, 5632u);
  // DeltaNetConfig: 16 heads, silu q/k, L2 norm, convolutions of 4.
  const ModelConfig d = Parse(R"({"model_type": "delta_net"})");
  EXPECT_EQ(d.num_heads, 16u);
  EXPECT_EQ(d.head_k, 128u);
  EXPECT_TRUE(d.silu_qk && d.silu_v && d.qk_l2norm && d.use_beta);
  EXPECT_FALSE(d.output_gate);
  EXPECT_EQ(d.conv_size, 4u);
  EXPECT_EQ(d.conv_channels(), 3u * 2048);
  // GatedDeltaNetConfig: 6 heads of 256, v 512 wide, 21 layers, gate on.
  const ModelConfig gd = Parse(R"({"model_type": "gated_deltanet"})");
  EXPECT_EQ(gd.num_heads, 6u);
  EXPECT_EQ(gd.state_heads, 6u);
  EXPECT_EQ(gd.head_k, 256u);
  EXPECT_EQ(gd.head_v, 512u);
  EXPECT_EQ(gd.num_hidden_layers, 21u);
  EXPECT_TRUE(gd.output_gate && gd.qk_l2norm);
  EXPECT_EQ(gd.conv_channels(), 6u * 256 * 2 + 6u * 512);
  // Mamba2Config: 4096 / 64 = 64 heads, state 128, ε 1e-5, no MLP.
  const ModelConfig m = Parse(R"({"model_type": "mamba2"})");
  EXPECT_EQ(m.num_heads, 64u);
  EXPECT_EQ(m.head_v, 64u);
  EXPECT_EQ(m.head_k, 128u);
  EXPECT_EQ(m.intermediate_size, 4096u);
  EXPECT_EQ(m.num_hidden_layers, 48u);
  EXPECT_FLOAT_EQ(m.norm_eps, 1e-5f);
  EXPECT_TRUE(m.rmsnorm && m.use_conv_bias && !m.use_bias);
  EXPECT_EQ(m.dt_min, 0.0);
  EXPECT_TRUE(std::isinf(m.dt_max));
  EXPECT_FALSE(m.has_mlp());
  EXPECT_EQ(m.conv_channels(), 4096u + 2 * 128);
}

TEST(ModelTypesConfigTest, PythonsInfinityIsReadWhereANumberIsExpected) {
  // As Python's json.dump writes (0.0, inf).
  const ModelConfig m = Parse(
      "{\"model_type\": \"mamba2\", \"dt_limit\": [0.0, Infinity],\n"
      " \"note\": \"Infinity and NaN inside a string stay text\"}");
  EXPECT_TRUE(std::isinf(m.dt_max) && m.dt_max > 0);
  const ModelConfig lim =
      Parse(R"({"model_type": "mamba2", "dt_limit": [0.001, 0.1]})");
  EXPECT_DOUBLE_EQ(lim.dt_min, 0.001);
  EXPECT_DOUBLE_EQ(lim.dt_max, 0.1);
  ExpectRefused(R"({"model_type": "mamba2", "dt_limit": [0.0, NaN]})",
                "dt_limit");
  ExpectRefused(R"({"model_type": "mamba2", "dt_limit": [-Infinity, 1]})",
                "dt_limit");
  ExpectRefused(R"({"model_type": "mamba2", "dt_limit": [0.5, 0.1]})",
                "dt_limit");
  ExpectRefused(R"({"model_type": "mamba2", "dt_limit": [0.1]})", "dt_limit");
  // Anywhere else Infinity is still not a size.
  ExpectRefused(R"({"model_type": "mamba2", "hidden_size": Infinity})",
                "hidden_size");
}

TEST(ModelTypesConfigTest, OlderSpellingsAreRead) {
  const ModelConfig m = Parse(
      R"({"model_type": "mamba2", "time_step_limit": [0.01, 0.2],
          "layer_norm_epsilon": 1e-4})");
  EXPECT_DOUBLE_EQ(m.dt_min, 0.01);
  EXPECT_DOUBLE_EQ(m.dt_max, 0.2);
  EXPECT_FLOAT_EQ(m.norm_eps, 1e-4f);
  // The newer name wins where both are written.
  EXPECT_FLOAT_EQ(Parse(R"({"model_type": "mamba2", "norm_eps": 1e-6,
                            "layer_norm_epsilon": 1e-4})")
                      .norm_eps,
                  1e-6f);
  // fla's releases disagree on an older `rms_norm: false`.
  ExpectRefused(R"({"model_type": "mamba2", "rms_norm": false})", "rms_norm");
  EXPECT_FALSE(
      Parse(R"({"model_type": "mamba2", "rms_norm": false, "rmsnorm": false})")
          .rmsnorm);
}

// fla names the norm g_norm_swish_gate only in front of a gate function
// spelled "swish"; RetNet also has a parallel kernel.
TEST(ModelTypesConfigTest, TheNormsNameFollowsTheGateFunctionsSpelling) {
  EXPECT_TRUE(Parse(R"({"model_type": "retnet"})").fused_gate_norm);
  EXPECT_FALSE(Parse(R"({"model_type": "retnet", "hidden_act": "silu"})")
                   .fused_gate_norm);
  EXPECT_FALSE(
      Parse(R"({"model_type": "gla", "fuse_norm": false})").fused_gate_norm);
  EXPECT_FALSE(Parse(R"({"model_type": "gla", "use_output_gate": false})")
                   .fused_gate_norm);
  Parse(R"({"model_type": "retnet", "attn_mode": "parallel"})");
}

// RWKV7Config's defaults and what RWKV7Attention and RWKV7FeedForward
// make of them (fla/models/rwkv7, fla/layers/rwkv7.py).
TEST(ModelTypesConfigTest, Rwkv7DefaultsAreFlasConfigAndLayers) {
  const ModelConfig c = Parse(R"({"model_type": "rwkv7"})");
  EXPECT_EQ(c.type, ModelType::kRwkv7);
  EXPECT_EQ(c.hidden_size, 2048u);
  EXPECT_EQ(c.num_hidden_layers, 24u);
  EXPECT_EQ(c.head_k, 64u);  // head_dim 64: 32 heads
  EXPECT_EQ(c.num_heads, 32u);
  EXPECT_EQ(c.state_heads, 32u);
  EXPECT_EQ(c.head_v, 64u);  // value_dim = hidden_size
  EXPECT_EQ(c.decay_rank, 64u);
  EXPECT_EQ(c.gate_rank, 128u);
  EXPECT_EQ(c.a_rank, 64u);
  EXPECT_EQ(c.v_rank, 16u);
  EXPECT_EQ(c.intermediate_size, 8192u);  // 4·2048
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-5f);
  EXPECT_TRUE(c.norm_first && c.norm_bias && c.fuse_norm);
  EXPECT_FALSE(c.has_mlp());
  EXPECT_TRUE(c.layer_norms());
  EXPECT_EQ(c.conv_channels(), 0u);
  // head_dim wins over num_heads (RWKV7Attention); null head_dim comes
  // from num_heads (RWKV7Config).
  EXPECT_EQ(Parse(R"({"model_type": "rwkv7", "hidden_size": 256,
                      "head_dim": 64, "num_heads": 8})")
                .num_heads,
            4u);
  const ModelConfig n = Parse(R"({"model_type": "rwkv7", "hidden_size": 256,
                                  "head_dim": null, "num_heads": 8})");
  EXPECT_EQ(n.head_k, 32u);
  EXPECT_EQ(n.num_heads, 8u);
  // value_dim as one number or one per layer (all the same): 2·hidden
  // gives heads twice as wide in v.
  for (const char* v : {"512", "[512, 512]"}) {
    const ModelConfig w =
        Parse(std::string(R"({"model_type": "rwkv7", "hidden_size": 256,
                        "num_hidden_layers": 2, "value_dim": )") +
              v + "}");
    EXPECT_EQ(w.head_v, 128u) << v;
    EXPECT_EQ(w.value_dim(), 512u) << v;
  }
  // Null ranks are RWKV7Attention's own: max(32, round(s·√H·f/32)·32) with
  // f = head_dim/64 (not the gate's). H = 1024, head 64: decay and a
  // round(2.5) = 2 (halves to even) → 64; gate round(5) → 160; v
  // round(1.7) → 64. H = 4096, head 128: decay round(10) → 320.
  const ModelConfig r = Parse(R"({"model_type": "rwkv7", "hidden_size": 1024,
      "decay_low_rank_dim": null, "gate_low_rank_dim": null,
      "a_low_rank_dim": null, "v_low_rank_dim": null})");
  EXPECT_EQ(r.decay_rank, 64u);
  EXPECT_EQ(r.a_rank, 64u);
  EXPECT_EQ(r.gate_rank, 160u);
  EXPECT_EQ(r.v_rank, 64u);
  EXPECT_EQ(Parse(R"({"model_type": "rwkv7", "hidden_size": 4096,
                      "head_dim": 128, "decay_low_rank_dim": null})")
                .decay_rank,
            320u);
  // The channel mix: int(hidden·ratio) rounded up to a multiple of 32.
  EXPECT_EQ(Parse(R"({"model_type": "rwkv7", "hidden_size": 100,
                      "head_dim": 50, "hidden_ratio": 3.5})")
                .intermediate_size,
            352u);  // 350 → 352
  EXPECT_EQ(Parse(R"({"model_type": "rwkv7", "hidden_size": 64,
                      "head_dim": 16, "hidden_ratio": null})")
                .intermediate_size,
            256u);
}

// RWKV6Config's defaults and what RWKV6Attention and RWKV6FeedForward make
// of them (fla/models/rwkv6, fla/layers/rwkv6.py).
TEST(ModelTypesConfigTest, Rwkv6DefaultsAreFlasConfigAndLayers) {
  const ModelConfig c = Parse(R"({"model_type": "rwkv6"})");
  EXPECT_EQ(c.type, ModelType::kRwkv6);
  EXPECT_EQ(c.hidden_size, 2048u);
  EXPECT_EQ(c.num_hidden_layers, 24u);
  EXPECT_EQ(c.num_heads, 4u);
  EXPECT_EQ(c.state_heads, 4u);
  EXPECT_EQ(c.head_k, 256u);  // expand_k 0.5: 1024 keys over 4 heads
  EXPECT_EQ(c.head_v, 512u);  // expand_v 1
  EXPECT_EQ(c.key_dim(), 1024u);
  EXPECT_EQ(c.value_dim(), 2048u);
  EXPECT_EQ(c.mix_rank, 32u);
  EXPECT_EQ(c.decay_rank, 64u);
  EXPECT_EQ(c.intermediate_size, 7168u);  // 3.5·2048
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-5f);
  EXPECT_TRUE(c.norm_first && c.norm_bias);
  EXPECT_FALSE(c.has_mlp());
  EXPECT_TRUE(c.layer_norms());
  EXPECT_TRUE(c.is_rwkv());
  EXPECT_EQ(c.conv_channels(), 0u);
  // The channel mix: int(hidden·ratio) rounded up to a multiple of 32, the
  // ratio 3.5 when null.
  EXPECT_EQ(Parse(R"({"model_type": "rwkv6", "hidden_size": 100,
                      "num_heads": 2, "hidden_ratio": 2.5})")
                .intermediate_size,
            256u);  // 250 → 256
  EXPECT_EQ(Parse(R"({"model_type": "rwkv6", "hidden_size": 64,
                      "hidden_ratio": null})")
                .intermediate_size,
            224u);
  const ModelConfig w = Parse(R"({"model_type": "rwkv6", "hidden_size": 64,
      "num_heads": 2, "expand_k": 1, "expand_v": 2, "proj_low_rank_dim": 8,
      "gate_low_rank_dim": 16})");
  EXPECT_EQ(w.head_k, 32u);
  EXPECT_EQ(w.head_v, 64u);
  EXPECT_EQ(w.mix_rank, 8u);
  EXPECT_EQ(w.decay_rank, 16u);
  // A null gate_low_rank_dim makes w_proj a plain Linear (rank 0 here).
  EXPECT_EQ(
      Parse(R"({"model_type": "rwkv6", "gate_low_rank_dim": null})").decay_rank,
      0u);
}

// fla's hybrids: `attn` as fla/models/hybrid.py normalises it, each layer's
// spec found by its index.
TEST(ModelTypesConfigTest, HybridAttentionLayersAreFlasSpecs) {
  const ModelConfig one = Parse(
      R"({"model_type": "gla", "hidden_size": 64, "num_hidden_layers": 3,
          "attn": {"layers": [2, 0], "num_heads": 4}})");
  ASSERT_TRUE(one.is_hybrid());
  ASSERT_EQ(one.attn.size(), 1u);
  EXPECT_EQ(one.attn[0].num_kv_heads, 4u);  // num_heads when absent
  EXPECT_EQ(one.attn[0].head_dim, 16u);
  EXPECT_EQ(one.attn[0].window, 0u);
  EXPECT_EQ(one.attn[0].rope_theta, 10000.0);
  EXPECT_FALSE(one.attn[0].qkv_bias);
  EXPECT_NE(one.attention_layer(0), nullptr);
  EXPECT_EQ(one.attention_layer(1), nullptr);
  EXPECT_NE(one.attention_layer(2), nullptr);

  const ModelConfig two = Parse(
      R"({"model_type": "gated_deltanet", "hidden_size": 64,
          "num_hidden_layers": 4, "head_dim": 16, "num_heads": 4,
          "attn": [{"layers": [1], "num_heads": 2, "window_size": 8,
                    "rope_theta": 500, "qkv_bias": true},
                   {"layers": [3], "num_heads": 8, "num_kv_heads": 2,
                    "window_size": null}]})");
  ASSERT_EQ(two.attn.size(), 2u);
  EXPECT_EQ(two.attention_layer(1)->window, 8u);
  EXPECT_EQ(two.attention_layer(1)->rope_theta, 500.0);
  EXPECT_TRUE(two.attention_layer(1)->qkv_bias);
  EXPECT_EQ(two.attention_layer(3)->num_kv_heads, 2u);
  EXPECT_EQ(two.attention_layer(3)->head_dim, 8u);
  EXPECT_EQ(two.attention_layer(0), nullptr);

  // A null attn, and a list whose specs name no layer, are no hybrid.
  EXPECT_FALSE(Parse(R"({"model_type": "gla", "attn": null})").is_hybrid());
  EXPECT_FALSE(
      Parse(
          R"({"model_type": "gla", "attn": [{"layers": [], "num_heads": 4}]})")
          .is_hybrid());
}

TEST(ModelTypesConfigTest, BadHybridSpecsAreRefusedByField) {
  const std::string head =
      R"({"model_type": "gla", "hidden_size": 64, "num_hidden_layers": 2, )";
  const std::pair<std::string, std::string> cases[] = {
      {R"("attn": 3})", "attn"},
      {R"("attn": [3]})", "attn[0]"},
      {R"("attn": {"num_heads": 4}})", "attn.layers"},
      {R"("attn": {"layers": 1, "num_heads": 4}})", "attn.layers"},
      {R"("attn": {"layers": [2], "num_heads": 4}})", "attn.layers"},
      {R"("attn": {"layers": [-1], "num_heads": 4}})", "attn.layers"},
      {R"("attn": {"layers": [true], "num_heads": 4}})", "attn.layers"},
      {R"("attn": [{"layers": [0], "num_heads": 4},
                   {"layers": [0], "num_heads": 4}]})",
       "attn[1].layers"},
      {R"("attn": {"layers": [0]}})", "attn.num_heads"},
      {R"("attn": {"layers": [0], "num_heads": 0}})", "attn.num_heads"},
      {R"("attn": {"layers": [0], "num_heads": 5}})", "attn.num_heads"},
      {R"("attn": {"layers": [0], "num_heads": 64}})", "attn.num_heads"},
      {R"("attn": {"layers": [0], "num_heads": 4, "num_kv_heads": 3}})",
       "attn.num_kv_heads"},
      {R"("attn": {"layers": [0], "num_heads": 4, "window_size": 0}})",
       "attn.window_size"},
      {R"("attn": {"layers": [0], "num_heads": 4, "rope_theta": -1}})",
       "attn.rope_theta"},
      {R"("attn": {"layers": [0], "num_heads": 4, "rope_theta": Infinity}})",
       "attn.rope_theta"},
      {R"("attn": {"layers": [0], "num_heads": 4, "qkv_bias": "yes"}})",
       "attn.qkv_bias"},
  };
  for (const auto& [tail, field] : cases) ExpectRefused(head + tail, field);
  // The types whose fla blocks take no Attention (mamba2) or cannot run it
  // (rwkv7).
  for (const char* type : {"mamba2", "rwkv7"}) {
    ExpectRefused(
        absl::StrCat(R"({"model_type": ")", type,
                     R"(", "attn": {"layers": [0], "num_heads": 4}})"),
        "attn");
  }
}

TEST(ModelTypesConfigTest, WhatCannotBeServedExactlyIsRefusedByField) {
  struct Case {
    std::string json;
    std::string field;
  };
  const Case cases[] = {
      {R"({"model_type": "retnet", "hidden_size": 600, "num_heads": 2})",
       "expand_k"},  // head_k 300 > 256
      {R"({"model_type": "retnet", "feature_map": "logsigmoid"})",
       "feature_map"},
      {R"({"model_type": "retnet", "num_kv_heads": 3})", "num_kv_heads"},
      {R"({"model_type": "retnet", "attn": {"layers": [1, 1], "num_heads": 4}})",
       "attn.layers"},
      {R"({"model_type": "gla", "clamp_min": 0.5})", "clamp_min"},
      {R"({"model_type": "gla", "feature_map": "gelu"})", "feature_map"},
      {R"({"model_type": "gla", "hidden_act": "gelu"})", "hidden_act"},
      {R"({"model_type": "delta_net", "qk_activation": "tanh"})",
       "qk_activation"},
      {R"({"model_type": "delta_net", "qk_norm": "none"})", "qk_norm"},
      {R"({"model_type": "delta_net", "num_heads": 7})", "expand_k"},
      {R"({"model_type": "gated_deltanet", "num_heads": 2, "num_v_heads": 5})",
       "num_v_heads"},
      {R"({"model_type": "gated_deltanet", "head_dim": 10, "expand_v": 0.33})",
       "expand_v"},
      {R"({"model_type": "mamba2", "num_heads": 7})", "num_heads"},
      {R"({"model_type": "mamba2", "n_groups": 3})", "n_groups"},
      {R"({"model_type": "mamba2", "head_dim": 100})", "head_dim"},
      {R"({"model_type": "mamba2", "state_size": 70000})", "state_size"},
      {R"({"model_type": "rwkv5"})", "model_type"},
      {R"({"model_type": "rwkv6", "hidden_act": "swish"})", "hidden_act"},
      {R"({"model_type": "rwkv6", "num_heads": 3})", "expand_k"},
      {R"({"model_type": "rwkv6", "proj_low_rank_dim": 0})",
       "proj_low_rank_dim"},
      {R"({"model_type": "rwkv6", "proj_low_rank_dim": null})",
       "proj_low_rank_dim"},
      {R"({"model_type": "rwkv6", "gate_low_rank_dim": -1})",
       "gate_low_rank_dim"},
      {R"({"model_type": "rwkv6", "hidden_ratio": 0})", "hidden_ratio"},
      {R"({"model_type": "rwkv6", "attn": {"layers": [24], "num_heads": 4}})",
       "attn.layers"},
      {R"({"model_type": "rwkv7", "hidden_act": "swish"})", "hidden_act"},
      {R"({"model_type": "rwkv7", "hidden_size": 96, "head_dim": 64})",
       "head_dim"},
      {R"({"model_type": "rwkv7", "head_dim": null})", "num_heads"},
      {R"({"model_type": "rwkv7", "hidden_size": 64, "head_dim": 16,
           "num_hidden_layers": 2, "value_dim": [64, 128]})",
       "value_dim"},
      {R"({"model_type": "rwkv7", "hidden_size": 64, "head_dim": 16,
           "num_hidden_layers": 2, "value_dim": [64]})",
       "value_dim"},
      {R"({"model_type": "rwkv7", "hidden_size": 64, "head_dim": 16,
           "value_dim": 96})",
       "value_dim"},
      {R"({"model_type": "rwkv7", "value_dim": "wide"})", "value_dim"},
      {R"({"model_type": "rwkv7", "decay_low_rank_dim": 0})",
       "decay_low_rank_dim"},
      {R"({"model_type": "rwkv7", "norm_first": "yes"})", "norm_first"},
      // hidden 2^20 with heads of 2^16: 2.5·1024·1024 → a rank of 2.6M.
      {R"({"model_type": "rwkv7", "hidden_size": 1048576, "head_dim": 65536,
           "decay_low_rank_dim": null})",
       "decay_low_rank_dim"},
      {R"({"model_type": "rwkv7", "attn": {"layers": [1], "num_heads": 4}})",
       "attn"},
      {R"({"model_type": "gla", "attn_mode": "parallel"})", "attn_mode"},
      // Widths whose products would wrap around 32 bits: 2·G·N = 2^32.
      {R"({"model_type": "mamba2", "hidden_size": 64, "expand": 1024,
           "head_dim": 1, "n_groups": 32768, "state_size": 65536})",
       "state_size"},
      {R"({"model_type": "gated_deltanet", "num_heads": 65536,
           "head_dim": 65536})",
       "num_heads"},
  };
  for (const Case& c : cases) ExpectRefused(c.json, c.field);
}

}  // namespace
}  // namespace linattn

namespace linattn {
namespace {

// transformers' GraniteMoeHybridConfig: its own field names and defaults,
// the attention layers from layer_types (or its alias), and refusals by
// field for what linattn cannot serve exactly.
TEST(ModelTypesConfigTest, GraniteMoeHybridReadsTransformersFields) {
  const ModelConfig d = Parse(
      R"({"model_type": "granitemoehybrid", "hidden_size": 256,
          "num_hidden_layers": 3, "layer_types": ["mamba", "attention",
          "mamba"], "num_attention_heads": 4, "num_key_value_heads": 2,
          "rms_norm_eps": 1e-5, "position_embedding_type": "nope",
          "attention_multiplier": 0.015625, "residual_multiplier": 0.22,
          "embedding_multiplier": 12, "logits_scaling": 6,
          "mamba_n_heads": 8, "mamba_d_state": 32, "mamba_n_groups": 2})");
  EXPECT_EQ(d.type, ModelType::kGraniteMoeHybrid);
  EXPECT_FLOAT_EQ(d.norm_eps, 1e-5f);
  EXPECT_EQ(d.mamba_inner, 512u);  // mamba_expand 2
  EXPECT_EQ(d.state_heads, 8u);
  EXPECT_EQ(d.head_v, 64u);
  EXPECT_EQ(d.head_k, 32u);
  EXPECT_EQ(d.gated_norm_groups, 1u);  // over all I, whatever n_groups
  EXPECT_EQ(d.conv_channels(), 512u + 2 * 2 * 32);
  EXPECT_EQ(d.intermediate_size, 1024u);  // shared_intermediate_size
  EXPECT_EQ(d.num_experts, 8u);
  EXPECT_EQ(d.experts_per_token, 2u);
  EXPECT_EQ(d.expert_size, 11008u);
  EXPECT_DOUBLE_EQ(d.residual_multiplier, 0.22);
  ASSERT_EQ(d.attention_layer(0), nullptr);
  ASSERT_NE(d.attention_layer(1), nullptr);
  EXPECT_EQ(d.attention_layer(1)->num_kv_heads, 2u);
  EXPECT_EQ(d.attention_layer(1)->head_dim, 64u);
  EXPECT_FALSE(d.attention_layer(1)->rope);
  EXPECT_DOUBLE_EQ(d.attention_layer(1)->scale, 0.015625);
  // All Mamba without layer_types: the attention fields are not read.
  const ModelConfig m = Parse(
      R"({"model_type": "granitemoehybrid", "hidden_size": 80,
          "num_hidden_layers": 2, "num_local_experts": 0,
          "mamba_n_heads": 5})");  // 80 is no multiple of 32 heads
  EXPECT_FALSE(m.is_hybrid());
  EXPECT_EQ(m.num_experts, 0u);
  // Rotary from rope_parameters.
  const ModelConfig r = Parse(
      R"({"model_type": "granitemoehybrid", "hidden_size": 64,
          "num_hidden_layers": 1, "layers_block_type": ["attention"],
          "num_attention_heads": 4, "position_embedding_type": "rope",
          "rope_parameters": {"rope_type": "default", "rope_theta": 500}})");
  EXPECT_TRUE(r.attention_layer(0)->rope);
  EXPECT_DOUBLE_EQ(r.attention_layer(0)->rope_theta, 500);
}

TEST(ModelTypesConfigTest, GraniteMoeHybridRefusesByField) {
  const std::string base =
      R"({"model_type": "granitemoehybrid", "hidden_size": 64,
          "num_hidden_layers": 2, "num_attention_heads": 4,
          "mamba_n_heads": 2, )";
  auto with = [&](const std::string& fields) { return base + fields + "}"; };
  ExpectRefused(with(R"("num_local_experts": 2, "num_experts_per_tok": 3)"),
                "num_experts_per_tok");
  ExpectRefused(with(R"("num_local_experts": 5000)"), "num_local_experts");
  ExpectRefused(with(R"("layer_types": ["mamba"])"), "layer_types");
  ExpectRefused(with(R"("layer_types": ["mamba", "mlp"])"), "layer_types[1]");
  ExpectRefused(with(R"("layer_types": ["mamba", "attention"],
                        "layers_block_type": ["attention", "mamba"])"),
                "layers_block_type");
  ExpectRefused(with(R"("attn": {"layers": [0], "num_heads": 4})"), "attn");
  ExpectRefused(with(R"("residual_multiplier": 1e39)"), "residual_multiplier");
  ExpectRefused(with(R"("logits_scaling": 0)"), "logits_scaling");
  ExpectRefused(with(R"("logits_scaling": 1e-40)"), "logits_scaling");
  ExpectRefused(with(R"("embedding_multiplier": Infinity)"),
                "embedding_multiplier");
  ExpectRefused(with(R"("time_step_limit": [0.5, 0.1])"), "time_step_limit");
  ExpectRefused(with(R"("mamba_d_head": 48)"), "mamba_d_head");
  ExpectRefused(with(R"("mamba_n_heads": 3)"), "mamba_n_heads");
  ExpectRefused(with(R"("mamba_expand": 1048576)"), "mamba_expand");
  ExpectRefused(with(R"("shared_intermediate_size": -1)"),
                "shared_intermediate_size");
  ExpectRefused(with(R"("num_nextn_predict_layers": 1)"),
                "num_nextn_predict_layers");
  ExpectRefused(with(R"("hidden_act": "gelu")"), "hidden_act");
  ExpectRefused(with(R"("rms_norm_eps": 0)"), "rms_norm_eps");
  // The attention layers' fields, when layer_types has one.
  const std::string attention = R"("layer_types": ["mamba", "attention"], )";
  ExpectRefused(with(attention + R"("position_embedding_type": "alibi")"),
                "position_embedding_type");
  ExpectRefused(with(attention + R"("position_embedding_type": "rope",
                        "rope_scaling": {"rope_type": "yarn", "factor": 4})"),
                "rope_scaling.rope_type");
  ExpectRefused(with(attention + R"("position_embedding_type": "rope",
                        "rope_parameters": {"rope_theta": -1})"),
                "rope_parameters.rope_theta");
  ExpectRefused(with(attention + R"("head_dim": 32)"), "head_dim");
  ExpectRefused(with(attention + R"("num_key_value_heads": 3)"),
                "num_key_value_heads");
  ExpectRefused(with(attention + R"("attention_multiplier": 0)"),
                "attention_multiplier");
}

// qwen3_next: transformers' Qwen3NextConfig fields and defaults (the
// 80B-A3B's), layer_types or full_attention_interval, the sparse layers
// from decoder_sparse_step and mlp_only_layers, the partial rotary from
// the top level or rope_parameters.
TEST(ModelTypesConfigTest, Qwen3NextReadsTransformersFields) {
  const ModelConfig d = Parse(R"({"model_type": "qwen3_next"})");
  EXPECT_EQ(d.type, ModelType::kQwen3Next);
  EXPECT_EQ(d.num_hidden_layers, 48u);
  EXPECT_FLOAT_EQ(d.norm_eps, 1e-6f);
  EXPECT_EQ(d.norm_weight_offset, 1.0f);  // zero-centred norms
  EXPECT_EQ(d.num_heads, 16u);            // linear_num_key_heads
  EXPECT_EQ(d.state_heads, 32u);          // linear_num_value_heads
  EXPECT_EQ(d.head_k, 128u);
  EXPECT_EQ(d.head_v, 128u);
  EXPECT_EQ(d.conv_size, 4u);
  EXPECT_EQ(d.conv_channels(), 2u * 16 * 128 + 32 * 128);
  EXPECT_EQ(d.num_experts, 512u);
  EXPECT_EQ(d.experts_per_token, 10u);
  EXPECT_EQ(d.expert_size, 512u);
  EXPECT_EQ(d.expert_mlp_size, 512u);
  EXPECT_TRUE(d.norm_topk_prob && d.router_softmax_all && d.shared_expert_gate);
  for (uint32_t l = 0; l < 48; ++l) {
    EXPECT_TRUE(d.layer_has_experts(l)) << l;
    EXPECT_EQ(d.attention_layer(l) != nullptr, l % 4 == 3) << l;
  }
  const ModelConfig::SoftmaxAttention& a = *d.attention_layer(3);
  EXPECT_EQ(a.num_heads, 16u);
  EXPECT_EQ(a.num_kv_heads, 2u);
  EXPECT_EQ(a.head_dim, 256u);
  EXPECT_EQ(a.rotary_dim, 64u);  // partial_rotary_factor 0.25
  EXPECT_TRUE(a.qk_norm && a.output_gate && a.rope);
  EXPECT_EQ(a.scale, 0);  // head_dim^-1/2
  EXPECT_DOUBLE_EQ(a.rope_theta, 10000);

  const ModelConfig s = Parse(
      R"({"model_type": "qwen3_next", "num_hidden_layers": 6,
          "layer_types": ["linear_attention", "full_attention",
          "linear_attention", "linear_attention", "full_attention",
          "linear_attention"], "decoder_sparse_step": 2,
          "mlp_only_layers": [3], "intermediate_size": 96,
          "shared_expert_intermediate_size": 48, "norm_topk_prob": false,
          "rope_theta": 10000000, "partial_rotary_factor": 0.5,
          "head_dim": 64})");
  const bool sparse[] = {false, true, false, false, false, true};
  for (uint32_t l = 0; l < 6; ++l) {
    EXPECT_EQ(s.layer_has_experts(l), sparse[l]) << l;
    EXPECT_EQ(s.mlp_width(l), sparse[l] ? 48u : 96u) << l;
    EXPECT_EQ(s.attention_layer(l) != nullptr, l == 1 || l == 4) << l;
  }
  EXPECT_EQ(s.widest_mlp(), 96u);
  EXPECT_FALSE(s.norm_topk_prob);
  EXPECT_EQ(s.attention_layer(1)->rotary_dim, 32u);
  EXPECT_DOUBLE_EQ(s.attention_layer(1)->rope_theta, 1e7);
  // rope_parameters (transformers from v5) over the top level; all dense
  // without experts.
  const ModelConfig r = Parse(
      R"({"model_type": "qwen3_next", "num_hidden_layers": 2,
          "full_attention_interval": 2, "num_experts": 0, "head_dim": 16,
          "partial_rotary_factor": 0.25, "rope_parameters": {"rope_type":
          "default", "rope_theta": 500, "partial_rotary_factor": 0.5}})");
  EXPECT_EQ(r.attention_layer(0), nullptr);
  ASSERT_NE(r.attention_layer(1), nullptr);
  EXPECT_EQ(r.attention_layer(1)->rotary_dim, 8u);
  EXPECT_DOUBLE_EQ(r.attention_layer(1)->rope_theta, 500);
  EXPECT_FALSE(r.layer_has_experts(0) || r.layer_has_experts(1));
  EXPECT_EQ(r.mlp_width(0), 5632u);
  // The legacy rope_scaling wins when it is given and not empty, as
  // transformers reads `rope_scaling or rope_parameters`.
  const std::string two = R"({"model_type": "qwen3_next",
      "num_hidden_layers": 2, "full_attention_interval": 2, "num_experts": 0,
      "head_dim": 16, "rope_parameters": {"rope_theta": 500,
      "partial_rotary_factor": 0.5}, )";
  const ModelConfig legacy_wins = Parse(
      two + R"("rope_scaling": {"rope_type": "default", "rope_theta": 40}})");
  EXPECT_DOUBLE_EQ(legacy_wins.attention_layer(1)->rope_theta, 40);
  EXPECT_EQ(legacy_wins.attention_layer(1)->rotary_dim, 4u);  // top level's
  const ModelConfig empty_skipped = Parse(two + R"("rope_scaling": {}})");
  EXPECT_DOUBLE_EQ(empty_skipped.attention_layer(1)->rope_theta, 500);
  EXPECT_EQ(empty_skipped.attention_layer(1)->rotary_dim, 8u);
  EXPECT_EQ(Parse(R"({"model_type": "qwen3_next", "num_hidden_layers": 1,
                      "num_experts": 0, "layer_types": ["linear_attention"]})")
                .vocab_size,
            151936u);
  // transformers' legacy layer names.
  const ModelConfig legacy = Parse(
      R"({"model_type": "qwen3_next", "num_hidden_layers": 2, "head_dim": 16,
          "layer_types": ["mamba", "attention"]})");
  EXPECT_EQ(legacy.attention_layer(0), nullptr);
  EXPECT_NE(legacy.attention_layer(1), nullptr);
}

TEST(ModelTypesConfigTest, Qwen3NextRefusesByField) {
  const std::string base =
      R"({"model_type": "qwen3_next", "hidden_size": 64,
          "num_hidden_layers": 2, "layer_types": ["linear_attention",
          "full_attention"], "head_dim": 16, "num_attention_heads": 4,
          "num_key_value_heads": 2, "linear_num_key_heads": 2,
          "linear_num_value_heads": 4, "linear_key_head_dim": 16,
          "linear_value_head_dim": 16, "num_experts": 4,
          "num_experts_per_tok": 2, )";
  auto with = [&](const std::string& fields) { return base + fields + "}"; };
  EXPECT_TRUE(ParseModelConfig(with(R"("rms_norm_eps": 1e-6)")).ok());
  ExpectRefused(with(R"("linear_num_value_heads": 3)"),
                "linear_num_value_heads");
  ExpectRefused(with(R"("num_key_value_heads": 3)"), "num_key_value_heads");
  ExpectRefused(with(R"("num_experts_per_tok": 5)"), "num_experts_per_tok");
  ExpectRefused(with(R"("num_experts": 5000)"), "num_experts");
  ExpectRefused(with(R"("mlp_only_layers": [-1])"), "mlp_only_layers[0]");
  ExpectRefused(with(R"("mlp_only_layers": [0, 1.5])"), "mlp_only_layers[1]");
  ExpectRefused(with(R"("head_dim": null)"), "head_dim");
  ExpectRefused(with(R"("rope_theta": null)"), "rope_theta");
  ExpectRefused(with(R"("rope_parameters": {"full_attention": {"rope_type":
                        "default", "rope_theta": 500}})"),
                "rope_parameters.full_attention");
  ExpectRefused(with(R"("mlp_only_layers": 1)"), "mlp_only_layers");
  ExpectRefused(with(R"("decoder_sparse_step": 0)"), "decoder_sparse_step");
  ExpectRefused(with(R"("shared_expert_intermediate_size": 0)"),
                "shared_expert_intermediate_size");
  ExpectRefused(with(R"("layer_types": ["linear_attention"])"), "layer_types");
  ExpectRefused(with(R"("layer_types": ["linear_attention", "mlp"])"),
                "layer_types[1]");
  ExpectRefused(with(R"("partial_rotary_factor": 0.35)"),
                "partial_rotary_factor");  // int(5.6): 5 channels
  ExpectRefused(with(R"("partial_rotary_factor": 1.5)"),
                "partial_rotary_factor");
  ExpectRefused(with(R"("partial_rotary_factor": null)"),
                "partial_rotary_factor");
  ExpectRefused(with(R"("rope_scaling": {"rope_type": "yarn", "factor": 4})"),
                "rope_scaling.rope_type");
  ExpectRefused(with(R"("rope_parameters": {"partial_rotary_factor": 0})"),
                "rope_parameters.partial_rotary_factor");
  ExpectRefused(with(R"("attn": {"layers": [0], "num_heads": 4})"), "attn");
  ExpectRefused(with(R"("hidden_act": "gelu")"), "hidden_act");
  ExpectRefused(with(R"("head_dim": 1048576)"), "head_dim");
}

}  // namespace
}  // namespace linattn
