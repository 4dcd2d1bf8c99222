// SentencePiece through the run-time module, against what Debian's
// python3-sentencepiece gives for the same model (a fixture).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "core/model/model.h"
#include "core/model/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tests/model/fixtures.h"
#include "tests/model/test_model.h"
#include "tests/util/temp_dir.h"

namespace linattn {
namespace {

TEST(SentencePieceTest, EncodesAndDecodesAsTheLibraryDoes) {
  const std::string dir = testing::FixtureRoot() + "/spm";
  std::ifstream in(dir + "/expected.json");
  ASSERT_TRUE(in.good()) << dir;
  const nlohmann::json expected = nlohmann::json::parse(in);
  auto tokenizer = LoadSentencePieceTokenizer(dir + "/tokenizer.model");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->kind(), "sentencepiece");
  EXPECT_EQ((*tokenizer)->size(), expected["pieces"].get<uint32_t>());
  for (const auto& c : expected["cases"]) {
    const std::string text = c["text"];
    auto ids = (*tokenizer)->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, c["ids"].get<std::vector<int32_t>>()) << text;
    // Decoded as a whole, as the library decodes: the text again.
    EXPECT_EQ((*tokenizer)->Decode(*ids), c["decoded"].get<std::string>())
        << text;
    // Pieces continue a text (generation streams them), so the first keeps
    // the space the encoder put before the text.
    if (!ids->empty()) {
      EXPECT_EQ((*tokenizer)->Pieces(*ids),
                absl::StrCat(" ", c["decoded"].get<std::string>()))
          << text;
    }
  }
}

// Whole-text decoding past the first buffer's size, and of nothing.
TEST(SentencePieceTest, DecodesLongTextsAndNoIds) {
  auto tokenizer = LoadSentencePieceTokenizer(testing::FixtureRoot() +
                                              "/spm/tokenizer.model");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  std::string text = "the linear attention state";
  while (text.size() < 1000) text += " decode a stream of tokens";
  auto ids = (*tokenizer)->Encode(text);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ((*tokenizer)->Decode(*ids), text);
  EXPECT_EQ((*tokenizer)->Pieces(*ids), absl::StrCat(" ", text));
  EXPECT_EQ((*tokenizer)->Decode({}), "");
}

TEST(SentencePieceTest, AModelDirectoryWithTokenizerModelUsesIt) {
  testing::TempDir tmp;
  nlohmann::json config = testing::SmallConfig();
  config["vocab_size"] = 300;
  config["linattn_tokenizer"] = nullptr;  // the directory's files decide
  testing::WriteRandomModel(tmp.Path("m"), config, 3);
  std::filesystem::copy_file(testing::FixtureRoot() + "/spm/tokenizer.model",
                             tmp.Path("m/tokenizer.model"));
  auto model = Model::Load(tmp.Path("m"));
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->tokenizer().kind(), "sentencepiece");
  // A corrupt tokenizer.model is an error naming the file.
  std::ofstream(tmp.Path("m/tokenizer.model")) << "not a model";
  absl::Status s = Model::Load(tmp.Path("m")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tokenizer.model"), std::string::npos) << s;
}

}  // namespace
}  // namespace linattn
