// Writes small fla-layout model directories from C++ (no PyTorch needed):
// a config.json and a model.safetensors with every tensor the config asks
// for, filled from a seeded generator. Tests then break them on purpose.
#ifndef LINATTN_TESTS_MODEL_TEST_MODEL_H_
#define LINATTN_TESTS_MODEL_TEST_MODEL_H_

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/model/config.h"
#include "core/model/safetensors.h"
#include "nlohmann/json.hpp"

namespace linattn::testing {

inline nlohmann::json SmallConfig() {
  return {{"model_type", "linear_attn"}, {"hidden_size", 32},
          {"num_hidden_layers", 2},      {"num_heads", 2},
          {"num_kv_heads", nullptr},     {"feature_map", "elu"},
          {"norm_feature_map", true},    {"hidden_act", "swish"},
          {"intermediate_size", 48},     {"norm_eps", 1e-6},
          {"vocab_size", 260},           {"tie_word_embeddings", false},
          {"bos_token_id", nullptr},     {"eos_token_id", nullptr}};
}

// Every tensor `config` implies, random N(0, 1/√fan_in) (norm weights near
// 1). `zero_lm_head` makes every logit 0 (greedy then picks id 0).
inline std::vector<TensorToWrite> ModelTensors(const nlohmann::json& config,
                                               uint32_t seed,
                                               bool zero_lm_head = false) {
  auto c = ParseModelConfig(config.dump()).value();
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<TensorToWrite> out;
  auto add = [&](const std::string& name, std::vector<int64_t> shape,
                 float scale, float offset = 0.0f) {
    TensorToWrite t{name, shape, {}, DType::kF32};
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    for (int64_t i = 0; i < n; ++i)
      t.values.push_back(offset + scale * normal(rng));
    out.push_back(std::move(t));
  };
  const int64_t H = c.hidden_size, V = c.vocab_size, I = c.intermediate_size;
  const int64_t dk = c.head_k_dim(), dv = c.head_v_dim();
  const float sh = 1.0f / std::sqrt(float(H));
  add("model.embeddings.weight", {V, H}, 1.0f);
  for (uint32_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    add(p + "attn_norm.weight", {H}, 0.1f, 1.0f);
    add(p + "attn.q_proj.weight", {int64_t(c.key_dim()), H}, sh);
    add(p + "attn.k_proj.weight", {int64_t(c.num_kv_heads) * dk, H}, sh);
    add(p + "attn.v_proj.weight", {int64_t(c.num_kv_heads) * dv, H}, sh);
    if (c.elementwise_affine) add(p + "attn.norm.weight", {dv}, 0.1f, 1.0f);
    add(p + "attn.o_proj.weight", {H, int64_t(c.value_dim())},
        1.0f / std::sqrt(float(c.value_dim())));
    add(p + "mlp_norm.weight", {H}, 0.1f, 1.0f);
    add(p + "mlp.gate_proj.weight", {I, H}, sh);
    add(p + "mlp.up_proj.weight", {I, H}, sh);
    add(p + "mlp.down_proj.weight", {H, I}, 1.0f / std::sqrt(float(I)));
  }
  add("model.norm.weight", {H}, 0.1f, 1.0f);
  if (!c.tie_word_embeddings) {
    add("lm_head.weight", {V, H}, zero_lm_head ? 0.0f : sh);
  }
  return out;
}

// A model whose greedy choice is `token` at every position: embeddings all
// ones, every projection zero (each layer then adds nothing, so the final
// norm sees the same vector everywhere) and lm_head one-hot on `token`.
inline std::vector<TensorToWrite> OneTokenModelTensors(
    const nlohmann::json& config, int32_t token) {
  auto c = ParseModelConfig(config.dump()).value();
  std::vector<TensorToWrite> out = ModelTensors(config, 1);
  const int64_t H = c.hidden_size;
  for (TensorToWrite& t : out) {
    const bool norm = t.name.ends_with("norm.weight");
    std::fill(t.values.begin(), t.values.end(), norm ? 1.0f : 0.0f);
    if (t.name == "model.embeddings.weight") {
      std::fill(t.values.begin(), t.values.end(), 1.0f);
    }
    if (t.name == "lm_head.weight") {
      std::fill(t.values.begin() + int64_t{token} * H,
                t.values.begin() + (int64_t{token} + 1) * H, 1.0f);
    }
  }
  return out;
}

// A random byte-level model that writes ASCII: lm_head's rows past 127 are
// zero, so those ids' logits are 0 while some ASCII logit is almost surely
// positive (greedy text is then ASCII, and text sent back in is the same
// bytes, which the comparisons of text with token contexts rely on).
inline std::vector<TensorToWrite> AsciiModelTensors(
    const nlohmann::json& config, uint32_t seed) {
  auto c = ParseModelConfig(config.dump()).value();
  std::vector<TensorToWrite> out = ModelTensors(config, seed);
  for (TensorToWrite& t : out) {
    if (t.name == "lm_head.weight") {
      std::fill(t.values.begin() + 128 * int64_t{c.hidden_size}, t.values.end(),
                0.0f);
    }
  }
  return out;
}

// The models are byte-level: config.json says so unless the caller set
// "linattn_tokenizer" (null: the directory's tokenizer files decide).
inline void WriteModel(const std::string& dir, const nlohmann::json& config,
                       const std::vector<TensorToWrite>& tensors) {
  std::filesystem::create_directories(dir);
  nlohmann::json file = config;
  if (!file.contains("linattn_tokenizer")) file["linattn_tokenizer"] = "bytes";
  std::ofstream(dir + "/config.json") << file.dump(2);
  std::ofstream(dir + "/model.safetensors", std::ios::binary)
      << SerializeSafetensors(tensors, {{"format", "pt"}});
}

inline void WriteRandomModel(const std::string& dir,
                             const nlohmann::json& config, uint32_t seed,
                             bool zero_lm_head = false) {
  WriteModel(dir, config, ModelTensors(config, seed, zero_lm_head));
}

}  // namespace linattn::testing

#endif  // LINATTN_TESTS_MODEL_TEST_MODEL_H_
