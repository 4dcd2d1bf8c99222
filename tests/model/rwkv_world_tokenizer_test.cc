// RWKV's World tokenizer (core/model/rwkv_world_tokenizer.h): against RWKV's
// own TRIE_TOKENIZER, restated in tests/tokenizers/rwkv_world_reference.py
// (the ctest fixture writes a vocabulary in RWKV's format and the ids that
// tokenizer gives), and the file format's every form and refusal by hand.
#include "core/model/rwkv_world_tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace linattn {
namespace {

using ::testing::HasSubstr;

std::string FixtureDir() {
  const char* dir = std::getenv("LINATTN_TOKENIZER_FIXTURES");
  return dir == nullptr ? "" : absl::StrCat(dir, "/rwkv_world");
}

TEST(RwkvWorldTokenizer, EncodesAsRwkvsOwnTokenizer) {
  ASSERT_FALSE(FixtureDir().empty()) << "LINATTN_TOKENIZER_FIXTURES unset";
  auto tokenizer = LoadRwkvWorldTokenizer(
      absl::StrCat(FixtureDir(), "/", kRwkvWorldVocabFile));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->kind(), "rwkv_world");
  std::ifstream in(absl::StrCat(FixtureDir(), "/rwkv_world_expected.json"));
  ASSERT_TRUE(in.good());
  const nlohmann::json expected = nlohmann::json::parse(in);
  EXPECT_EQ((*tokenizer)->size(), expected["vocab_size"].get<uint32_t>());
  int cases = 0;
  for (const auto& c : expected["cases"]) {
    const std::string text =
        absl::HexStringToBytes(c["text"].get<std::string>());
    const std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    auto got = (*tokenizer)->Encode(text);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, want) << absl::CEscape(text);
    EXPECT_EQ((*tokenizer)->Pieces(want), text);
    ++cases;
  }
  EXPECT_GT(cases, 300);
}

// The 256 single bytes as RWKV's file writes them (str reprs for ASCII,
// bytes reprs above), then `extra` lines from id 257.
std::string Vocabulary(const std::vector<std::string>& extra) {
  std::string out;
  for (int b = 0; b < 256; ++b) {
    std::string literal;
    if (b >= 0x80) {
      literal = absl::StrCat("b'\\x", absl::Hex(b, absl::kZeroPad2), "'");
    } else if (b == '\'') {
      literal = "\"'\"";
    } else if (b == '\\') {
      literal = "'\\\\'";
    } else if (b >= 0x20 && b < 0x7f) {
      literal = absl::StrCat("'", std::string(1, static_cast<char>(b)), "'");
    } else {
      literal = absl::StrCat("'\\x", absl::Hex(b, absl::kZeroPad2), "'");
    }
    absl::StrAppend(&out, b + 1, " ", literal, " 1\n");
  }
  int id = 257;
  for (const std::string& line : extra) {
    absl::StrAppend(&out, id++, " ", line, "\n");
  }
  return out;
}

TEST(RwkvWorldTokenizer, ReadsEveryLiteralFormReprWrites) {
  auto tokenizer = ParseRwkvWorldVocabulary(
      Vocabulary({"'\\n\\n' 2", "\"it's\" 4", "'a\\\\b' 3", "'中文' 6",
                  "'\\u2028' 3", "'\\U0001f600' 4", "'\\x85' 2",
                  "b'\\xe4\\xb8' 2", "'\\t\\r\\x0b\\x0c' 4", "'\\101\\7' 2",
                  "'\\q' 2", "b'\\u00' 4", "'  ' 2"}),
      "vocab");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const Tokenizer& t = **tokenizer;
  EXPECT_EQ(t.size(), 257u + 13);
  EXPECT_EQ(t.TokenBytes(257), "\n\n");
  EXPECT_EQ(t.TokenBytes(258), "it's");
  EXPECT_EQ(t.TokenBytes(259), "a\\b");
  EXPECT_EQ(t.TokenBytes(260), "中文");
  EXPECT_EQ(t.TokenBytes(261), "\xe2\x80\xa8");
  EXPECT_EQ(t.TokenBytes(262), "\xf0\x9f\x98\x80");
  EXPECT_EQ(t.TokenBytes(263), "\xc2\x85");  // a str's \x85 is U+0085
  EXPECT_EQ(t.TokenBytes(264), "\xe4\xb8");
  EXPECT_EQ(t.TokenBytes(265), "\t\r\v\f");
  EXPECT_EQ(t.TokenBytes(266), "A\a");
  EXPECT_EQ(t.TokenBytes(267), "\\q");    // Python keeps unknown escapes
  EXPECT_EQ(t.TokenBytes(268), "\\u00");  // no \u in bytes
  EXPECT_EQ(t.TokenBytes(0), "");         // the end of text
  EXPECT_EQ(t.TokenBytes(100000), "");
  EXPECT_EQ(t.TokenBytes(1), std::string(1, '\0'));
  EXPECT_EQ(t.TokenBytes(129), "\x80");
  // Greedy: the longest token at each position.
  auto ids = t.Encode("a\n\n\n中文字  x");
  ASSERT_TRUE(ids.ok());
  EXPECT_THAT(*ids,
              ::testing::ElementsAre('a' + 1, 257, '\n' + 1, 260, 0xe5 + 1,
                                     0xad + 1, 0x97 + 1, 269, 'x' + 1));
  EXPECT_EQ(t.Pieces(*ids), "a\n\n\n中文字  x");
}

TEST(RwkvWorldTokenizer, RefusesABadFileNamingTheLine) {
  struct Bad {
    std::string vocab, message;
  };
  std::string missing_byte = Vocabulary({});
  missing_byte.erase(missing_byte.find("66 'A' 1\n"), 9);
  const std::vector<Bad> bads = {
      {Vocabulary({"'ab' 3"}),
       "line 257: the token has 2 bytes, the line says 3"},
      {Vocabulary({"'ab' 2", "'ab' 2"}), "ids 257 and 258 are the same token"},
      {Vocabulary({"'ab 2"}), "line 257: the token is not a quoted"},
      {Vocabulary({"'a'b' 3"}), "line 257: an unescaped quote"},
      {Vocabulary({"b'é' 2"}), "line 257: a bytes literal holds only ASCII"},
      {Vocabulary({"'\\ud800' 3"}), "line 257: code point 55296 has no UTF-8"},
      {Vocabulary({"'\\x4' 1"}), "line 257: \\x takes two hex digits"},
      {Vocabulary({"'' 0"}), "line 257: a token holds 1 to"},
      {Vocabulary({"'x' 1", ""}), "line 258: expected `ID LITERAL LENGTH`"},
      {Vocabulary({}) + "0 'zz' 2\n", "line 257: the id must be in [1,"},
      {Vocabulary({}) + "5 'zz' 2\n", "line 257: id 5 appears twice"},
      {Vocabulary({"'\\N{BULLET}' 3"}), "\\N{…} escapes are not read"},
      {missing_byte, "byte 65 has no token of its own"},
      {"1 'a' 1\n\xff\n", "not UTF-8 text"},
      {"", "no tokens"},
  };
  for (const Bad& bad : bads) {
    auto t = ParseRwkvWorldVocabulary(bad.vocab, "vocab");
    ASSERT_FALSE(t.ok()) << bad.message;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message(t.status().message());
    EXPECT_THAT(message, HasSubstr(bad.message));
    EXPECT_THAT(message, ::testing::StartsWith("vocab: "));
  }
  EXPECT_EQ(LoadRwkvWorldTokenizer("/nonexistent/vocab.txt").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace linattn
