// Model directories that are corrupt or do not match their config fail with
// a clear error naming the file and field or tensor, never a crash.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "core/model/model.h"
#include "core/model/rwkv_world_tokenizer.h"
#include "tests/model/test_model.h"
#include "tests/util/temp_dir.h"

namespace linattn {
namespace {

using ::testing::HasSubstr;
using testing::ModelTensors;
using testing::SmallConfig;
using testing::WriteModel;
using testing::WriteRandomModel;

class ModelLoadTest : public ::testing::Test {
 protected:
  absl::Status LoadStatus(const std::string& dir) {
    return Model::Load(dir).status();
  }
  std::string Dir(const std::string& name) { return tmp_.Path(name); }
  testing::TempDir tmp_;
};

TEST_F(ModelLoadTest, LoadsAValidModelAndDescribesIt) {
  WriteRandomModel(Dir("ok"), SmallConfig(), 1);
  auto model = Model::Load(Dir("ok"), "small");
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->name(), "small");
  EXPECT_EQ((*model)->tokenizer().kind(), "byte");
  EXPECT_EQ((*model)->config().intermediate_size, 48u);
  // 2 layers × 2 heads × (16·16 + 16) floats.
  EXPECT_EQ((*model)->state_bytes(), 2u * 2 * (16 * 16 + 16) * 4);
  // Same files, same fingerprint; one changed weight, another.
  WriteRandomModel(Dir("same"), SmallConfig(), 1);
  WriteRandomModel(Dir("other"), SmallConfig(), 2);
  EXPECT_EQ(Model::Load(Dir("same")).value()->fingerprint(),
            (*model)->fingerprint());
  EXPECT_NE(Model::Load(Dir("other")).value()->fingerprint(),
            (*model)->fingerprint());
}

TEST_F(ModelLoadTest, MissingFilesAreNotFound) {
  EXPECT_EQ(LoadStatus(Dir("nothing")).code(), absl::StatusCode::kNotFound);
  std::filesystem::create_directories(Dir("config_only"));
  nlohmann::json config = SmallConfig();
  config["linattn_tokenizer"] = "bytes";
  std::ofstream(Dir("config_only") + "/config.json") << config.dump();
  absl::Status s = LoadStatus(Dir("config_only"));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("model.safetensors"));
}

// A directory with RWKV's World vocabulary beside config.json (and no
// other tokenizer file) is tokenized with it and chats in RWKV's
// convention; a vocabulary larger than the model's is refused.
TEST_F(ModelLoadTest, ReadsRwkvsWorldVocabularyBesideTheWeights) {
  std::string vocab;
  for (int b = 0; b < 256; ++b) {
    absl::StrAppend(&vocab, b + 1, b < 0x80 ? " '\\x" : " b'\\x",
                    absl::Hex(b, absl::kZeroPad2), "' 1\n");
  }
  absl::StrAppend(&vocab, "257 ' the' 4\n");
  nlohmann::json config = SmallConfig();
  config["linattn_tokenizer"] = nullptr;
  WriteRandomModel(Dir("rwkv"), config, 1);
  std::ofstream(Dir("rwkv") + "/" + kRwkvWorldVocabFile) << vocab;
  auto model = Model::Load(Dir("rwkv"));
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->tokenizer().kind(), "rwkv_world");
  EXPECT_THAT(*(*model)->tokenizer().Encode("a the"),
              ::testing::ElementsAre('a' + 1, 257));
  // With no template of its own it speaks RWKV's chat convention.
  EXPECT_EQ((*model)->chat_template().kind(), ChatTemplate::Kind::kRwkv);
  EXPECT_THAT((*model)->chat_template_note(), HasSubstr("rwkv"));
  config["vocab_size"] = 200;
  WriteRandomModel(Dir("small_vocab"), config, 1);
  std::ofstream(Dir("small_vocab") + "/" + kRwkvWorldVocabFile) << vocab;
  const absl::Status s = LoadStatus(Dir("small_vocab"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("rwkv_world"));
}

TEST_F(ModelLoadTest, BadConfigsNameTheField) {
  struct Case {
    const char* name;
    nlohmann::json change;
    const char* expect;
  };
  const Case cases[] = {
      {"type", {{"model_type", "llama"}}, "model_type"},
      {"map", {{"feature_map", "taylor"}}, "feature_map"},
      {"act", {{"hidden_act", "gelu"}}, "hidden_act"},
      {"kv", {{"num_kv_heads", 3}}, "num_kv_heads"},
      {"heads", {{"num_heads", 5}}, "expand_k"},
      {"zero", {{"hidden_size", 0}}, "hidden_size"},
      {"type_of", {{"hidden_size", "big"}}, "hidden_size"},
      {"hybrid", {{"attn", {{"layers", {1}}}}}, "attn"},
      {"mode", {{"attn_mode", "parallel"}}, "attn_mode"},
      {"attnres", {{"attnres_block_size", 4}}, "attnres_block_size"},
      {"eos", {{"eos_token_id", 999}}, "eos_token_id"},
      {"eps", {{"norm_eps", -1}}, "norm_eps"},
      // An intermediate size past int64's range (found by config_fuzz).
      {"ratio",
       {{"intermediate_size", nullptr}, {"hidden_ratio", 4.2e19}},
       "hidden_ratio"},
      {"tiny_ratio",
       {{"intermediate_size", nullptr}, {"hidden_ratio", 1e-9}},
       "hidden_ratio"},
  };
  for (const Case& c : cases) {
    nlohmann::json config = SmallConfig();
    config.update(c.change);
    std::filesystem::create_directories(Dir(c.name));
    std::ofstream(Dir(c.name) + "/config.json") << config.dump();
    absl::Status s = LoadStatus(Dir(c.name));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(s.message(), HasSubstr(c.expect)) << c.name;
    EXPECT_THAT(s.message(), HasSubstr("config.json")) << c.name;
  }
  std::filesystem::create_directories(Dir("json"));
  std::ofstream(Dir("json") + "/config.json") << "{\"model_type\": ";
  EXPECT_THAT(LoadStatus(Dir("json")).message(), HasSubstr("not valid JSON"));
}

TEST_F(ModelLoadTest, TensorsThatDoNotMatchTheConfigAreNamed) {
  const nlohmann::json config = SmallConfig();
  {  // wrong shape
    auto tensors = ModelTensors(config, 1);
    for (auto& t : tensors) {
      if (t.name == "model.layers.1.mlp.up_proj.weight") {
        t.shape = {47, 32};
        t.values.resize(47 * 32);
      }
    }
    WriteModel(Dir("shape"), config, tensors);
    absl::Status s = LoadStatus(Dir("shape"));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("model.layers.1.mlp.up_proj.weight"));
  }
  {  // missing tensor
    auto tensors = ModelTensors(config, 1);
    std::erase_if(tensors, [](const TensorToWrite& t) {
      return t.name == "model.layers.0.attn.norm.weight";
    });
    WriteModel(Dir("missing"), config, tensors);
    EXPECT_THAT(LoadStatus(Dir("missing")).message(),
                HasSubstr("model.layers.0.attn.norm.weight"));
  }
  {  // a tensor the config does not have (here: an unexpected feature map)
    auto tensors = ModelTensors(config, 1);
    tensors.push_back({"model.layers.0.attn.feature_map_q.layer.weight",
                       {16, 16},
                       std::vector<float>(256, 0.0f),
                       DType::kF32});
    WriteModel(Dir("extra"), config, tensors);
    absl::Status s = LoadStatus(Dir("extra"));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("unexpected tensor"));
  }
  {  // NaN weights
    auto tensors = ModelTensors(config, 1);
    tensors[3].values[5] = std::nanf("");
    WriteModel(Dir("nan"), config, tensors);
    EXPECT_THAT(LoadStatus(Dir("nan")).message(), HasSubstr("NaN or Inf"));
  }
  {  // t2r needs its feature-map weights
    nlohmann::json t2r = config;
    t2r["feature_map"] = "t2r";
    WriteModel(Dir("t2r"), t2r, ModelTensors(t2r, 1));
    EXPECT_THAT(LoadStatus(Dir("t2r")).message(),
                HasSubstr("model.layers.0.attn.feature_map_q.layer.weight"));
  }
}

// Sizes in config.json are checked against the file's tensors before
// anything of that size is allocated: a config naming a model of 2^40
// parameters over a small file is refused at once, naming the field or the
// tensor (it used to abort the server with std::bad_alloc).
TEST_F(ModelLoadTest, HugeConfigSizesAreRefusedBeforeAllocating) {
  const nlohmann::json config = SmallConfig();
  const auto tensors = ModelTensors(config, 1);
  struct Case {
    const char* name;
    const char* field;
    int64_t value;
    const char* expect;
  };
  for (const Case& c : {
           Case{"hidden", "hidden_size", 1 << 17, "model.embeddings.weight"},
           Case{"vocab", "vocab_size", 1 << 20, "model.embeddings.weight"},
           Case{"layers", "num_hidden_layers", 1 << 20, "num_hidden_layers"},
           Case{"inter", "intermediate_size", 1 << 20, "mlp.gate_proj"},
       }) {
    SCOPED_TRACE(c.name);
    nlohmann::json big = config;
    big[c.field] = c.value;
    if (std::string(c.field) == "hidden_size") big["vocab_size"] = 1 << 17;
    WriteModel(Dir(c.name), big, tensors);
    absl::Status s = LoadStatus(Dir(c.name));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.expect));
  }
}

TEST_F(ModelLoadTest, CorruptSafetensorsFail) {
  WriteRandomModel(Dir("base"), SmallConfig(), 1);
  std::string bytes;
  {
    std::ifstream in(Dir("base") + "/model.safetensors", std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto write_variant = [&](const std::string& name, const std::string& data) {
    std::filesystem::create_directories(Dir(name));
    std::filesystem::copy_file(Dir("base") + "/config.json",
                               Dir(name) + "/config.json");
    std::ofstream(Dir(name) + "/model.safetensors", std::ios::binary) << data;
  };
  write_variant("truncated", bytes.substr(0, bytes.size() - 100));
  EXPECT_EQ(LoadStatus(Dir("truncated")).code(),
            absl::StatusCode::kInvalidArgument);
  write_variant("tiny", bytes.substr(0, 5));
  EXPECT_EQ(LoadStatus(Dir("tiny")).code(), absl::StatusCode::kInvalidArgument);
  std::string dtype = bytes;
  const size_t at = dtype.find("\"F32\"");
  ASSERT_NE(at, std::string::npos);
  dtype.replace(at, 5, "\"I32\"");
  write_variant("dtype", dtype);
  absl::Status s = LoadStatus(Dir("dtype"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("I32"));
}

TEST_F(ModelLoadTest, VocabularySmallerThanTheTokenizerIsRefused) {
  nlohmann::json config = SmallConfig();
  config["vocab_size"] = 100;  // byte-level needs 256 ids
  WriteRandomModel(Dir("vocab"), config, 1);
  absl::Status s = LoadStatus(Dir("vocab"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("vocab_size"));
}

}  // namespace
}  // namespace linattn
