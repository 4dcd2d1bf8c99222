// tokenizer.json: what `tokenizers` (Hugging Face's Rust library, the one
// the files are written for) does, worked out by hand from its source for
// each rule, and refusals that name the JSON path. The comparison with
// Hugging Face's own JavaScript implementation on trained files is in
// tokenizer_json_oracle_test.cc.
#include "core/model/tokenizer_json/tokenizer_json.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/model/tokenizer_json/onig_regex.h"
#include "nlohmann/json.hpp"

namespace linattn {
namespace {

using json = nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A BPE whose vocabulary is `tokens` (ids in order) with `merges`.
json Bpe(const std::vector<std::string>& tokens,
         const std::vector<std::pair<std::string, std::string>>& merges = {}) {
  json vocab = json::object();
  for (size_t i = 0; i < tokens.size(); ++i) vocab[tokens[i]] = i;
  json m = json::array();
  for (const auto& [a, b] : merges) m.push_back({a, b});
  return {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}};
}

json File(json model) {
  return {{"version", "1.0"},          {"added_tokens", json::array()},
          {"normalizer", nullptr},     {"pre_tokenizer", nullptr},
          {"post_processor", nullptr}, {"decoder", nullptr},
          {"model", std::move(model)}};
}

std::unique_ptr<Tokenizer> Load(const json& file) {
  auto t = ParseTokenizerJson(file.dump());
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

std::vector<int32_t> Ids(const Tokenizer& t, const std::string& text) {
  auto ids = t.Encode(text);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

std::string LoadError(const json& file) {
  auto t = ParseTokenizerJson(file.dump());
  EXPECT_FALSE(t.ok());
  return t.ok() ? "" : std::string(t.status().message());
}

// Characters as their own tokens: a0 b1 c2 … for the letters given.
std::vector<std::string> Chars(const std::string& letters) {
  std::vector<std::string> out;
  for (char c : letters) out.push_back(std::string(1, c));
  return out;
}

TEST(TokenizerJson, MergesApplyLowestRankFirstAndLeftmostAmongEqualRanks) {
  // word.rs merge_all: "aaa" with (a,a) merges the first pair; "abc" with
  // (b,c) ranked before (a,b) gives a + bc.
  auto t = Load(File(Bpe({"a", "b", "c", "aa", "bc", "ab"},
                         {{"b", "c"}, {"a", "a"}, {"a", "b"}})));
  EXPECT_THAT(Ids(*t, "aaa"), ElementsAre(3, 0));
  EXPECT_THAT(Ids(*t, "abc"), ElementsAre(0, 4));
  EXPECT_THAT(Ids(*t, "abab"), ElementsAre(5, 5));
}

TEST(TokenizerJson, LegacyMergesSkipVersionLinesForRanks) {
  json model = Bpe({"a", "b", "c", "ab", "bc"});
  model["merges"] = {"#version: 0.2", "b c", "a b"};
  auto t = Load(File(model));
  EXPECT_THAT(Ids(*t, "abc"), ElementsAre(0, 4));
}

TEST(TokenizerJson, ByteFallbackAndFusedUnknowns) {
  // merge_word: a character outside the vocabulary becomes its <0xHH>
  // bytes when all exist, else the unknown token (fused with fuse_unk).
  std::vector<std::string> vocab = {"<unk>", "a", "<0xC3>", "<0xA9>"};
  json model = Bpe(vocab);
  model["unk_token"] = "<unk>";
  model["byte_fallback"] = true;
  model["fuse_unk"] = true;
  auto t = Load(File(model));
  EXPECT_THAT(Ids(*t, "a\u00e9a"), ElementsAre(1, 2, 3, 1));
  // ☃ (E2 98 83) has no byte tokens here: unknown, two in a row fuse.
  EXPECT_THAT(Ids(*t, "a\u2603\u2603a"), ElementsAre(1, 0, 1));
  model["fuse_unk"] = false;
  auto unfused = Load(File(model));
  EXPECT_THAT(Ids(*unfused, "a\u2603\u2603a"), ElementsAre(1, 0, 0, 1));
}

TEST(TokenizerJson, UnknownWithoutUnkTokenIsDropped) {
  auto t = Load(File(Bpe({"a"})));
  EXPECT_THAT(Ids(*t, "a?a"), ElementsAre(0, 0));
}

TEST(TokenizerJson, AddedTokensSplitFirstAndKeepTheirIds) {
  json f = File(Bpe(Chars("abc<>")));
  f["added_tokens"] = {
      {{"id", 5}, {"content", "<a>"}, {"special", true}, {"normalized", false}},
      {{"id", 6}, {"content", "bc"}, {"special", false}, {"normalized", true}}};
  auto t = Load(f);
  EXPECT_THAT(Ids(*t, "a<a>bca"), ElementsAre(0, 5, 6, 0));
  EXPECT_EQ(t->size(), 7u);
  // Special tokens decode to nothing; others to their text.
  EXPECT_EQ(t->Decode(std::vector<int32_t>{0, 5, 6}), "a bc");  // no decoder
  EXPECT_EQ(t->TokenBytes(5), "");
}

TEST(TokenizerJson, AddedTokenIdsFollowTheVocabularyNotTheFile) {
  // AddedVocabulary::add_tokens: a content the model has keeps the model's
  // id; a new one counts up from the model's size.
  json f = File(Bpe(Chars("ab")));
  f["added_tokens"] = {{{"id", 9}, {"content", "b"}, {"special", true}},
                       {{"id", 7}, {"content", "<x>"}, {"special", true}}};
  auto t = Load(f);
  EXPECT_THAT(Ids(*t, "a<x>"), ElementsAre(0, 2));
  EXPECT_EQ(t->size(), 3u);
}

TEST(TokenizerJson, SingleWordLstripRstrip) {
  json f = File(Bpe(Chars("abcx _")));
  f["added_tokens"] = {{{"id", 6},
                        {"content", "ab"},
                        {"single_word", true},
                        {"normalized", false},
                        {"special", false}},
                       {{"id", 7},
                        {"content", "<m>"},
                        {"lstrip", true},
                        {"rstrip", true},
                        {"normalized", false},
                        {"special", true}}};
  auto t = Load(f);
  // "cab" and "ab_" are inside words (\w on a side): not the token.
  EXPECT_THAT(Ids(*t, "ab cab ab_"), ElementsAre(6, 4, 2, 0, 1, 4, 0, 1, 5));
  // The spaces on both sides go into <m>.
  EXPECT_THAT(Ids(*t, "x  <m>  x"), ElementsAre(3, 7, 3));
}

TEST(TokenizerJson, NormalizedAddedTokensMatchTheirNormalizedForm) {
  json f = File(Bpe({"\u2581", "a", "b"}));
  f["normalizer"] = {{"type", "Replace"},
                     {"pattern", {{"String", " "}}},
                     {"content", "\u2581"}};
  f["added_tokens"] = {{{"id", 3},
                        {"content", "a b"},
                        {"normalized", true},
                        {"special", false}}};
  auto t = Load(f);
  EXPECT_THAT(Ids(*t, "ba b"), ElementsAre(2, 3));
  // The normalized form; without a decoder tokens are joined by spaces.
  EXPECT_EQ(t->TokenBytes(3), " a\u2581b");
}

TEST(TokenizerJson, MetaspaceFirstPrependsOnlyAtTheStartOfTheText) {
  json f = File(Bpe({"\u2581", "h", "i", "\u2581h", "<s>"}, {{"\u2581", "h"}}));
  f["pre_tokenizer"] = {{"type", "Metaspace"},
                        {"replacement", "\u2581"},
                        {"prepend_scheme", "first"},
                        {"split", true}};
  f["added_tokens"] = {{{"id", 4},
                        {"content", "<s>"},
                        {"special", true},
                        {"normalized", false}}};
  auto t = Load(f);
  EXPECT_THAT(Ids(*t, "hi"), ElementsAre(3, 2));
  EXPECT_THAT(Ids(*t, "<s>hi"), ElementsAre(4, 1, 2));
  EXPECT_THAT(Ids(*t, "hi hi"), ElementsAre(3, 2, 3, 2));
}

TEST(TokenizerJson, MetaspaceFirstAfterAPrependNormalizerAndASplit) {
  // The Prepend's ▁ aligns to the first character, so a piece cut right
  // after it still begins the text.
  json f = File(Bpe({"\u2581", "h", "i", "x"}));
  f["normalizer"] = {{"type", "Prepend"}, {"prepend", "x"}};
  f["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"},
                           {"pattern", {{"String", "x"}}},
                           {"behavior", "Isolated"},
                           {"invert", false}},
                          {{"type", "Metaspace"},
                           {"replacement", "\u2581"},
                           {"prepend_scheme", "first"},
                           {"split", false}}}}};
  auto t = Load(f);
  // "xhi" → "x" | "hi": both begin at byte 0 of "hi".
  EXPECT_THAT(Ids(*t, "hi"), ElementsAre(0, 3, 0, 1, 2));
}

TEST(TokenizerJson, SplitBehaviors) {
  // normalizer.rs split on "-": the-final--countdown.
  auto ids_with = [](const std::string& behavior, bool invert) {
    json f = File(Bpe(Chars("-cdefhilnortuwa")));
    f["model"]["ignore_merges"] = true;
    json vocab = f["model"]["vocab"];
    for (const char* w : {"the", "final", "countdown", "the-", "final-",
                          "-final", "-countdown", "--"}) {
      vocab[w] = vocab.size();
    }
    f["model"]["vocab"] = vocab;
    f["pre_tokenizer"] = {{"type", "Split"},
                          {"pattern", {{"String", "-"}}},
                          {"behavior", behavior},
                          {"invert", invert}};
    auto t = Load(f);
    std::string out;
    for (int32_t id : Ids(*t, "the-final--countdown")) {
      absl::StrAppend(&out, "[", t->Decode(std::vector<int32_t>{id}), "]");
    }
    return out;
  };
  EXPECT_EQ(ids_with("Removed", false), "[the][final][countdown]");
  EXPECT_EQ(ids_with("Isolated", false), "[the][-][final][-][-][countdown]");
  EXPECT_EQ(ids_with("MergedWithPrevious", false),
            "[the-][final-][-][countdown]");
  EXPECT_EQ(ids_with("MergedWithNext", false), "[the][-final][-][-countdown]");
  EXPECT_EQ(ids_with("Contiguous", false), "[the][-][final][--][countdown]");
  // Inverted: the pattern's matches are what is kept apart.
  EXPECT_EQ(ids_with("Removed", true), "[-][-][-]");
}

TEST(TokenizerJson, EmptyMatchesFollowOnigurumasIteration) {
  // a* on "baac": empty at 0, "aa", no empty at 3 (where "aa" ended),
  // empty at 4.
  auto re = tokenizer_json::OnigRegex::Compile("a*", "test");
  ASSERT_TRUE(re.ok());
  std::vector<tokenizer_json::Span> matches;
  ASSERT_TRUE((*re)->FindAll("baac", &matches).ok());
  EXPECT_THAT(matches, ElementsAre(tokenizer_json::Span{0, 0},
                                   tokenizer_json::Span{1, 3},
                                   tokenizer_json::Span{4, 4}));
}

TEST(TokenizerJson, OnigurumaClassesKeepTheirMeaning) {
  auto spans = [](const std::string& pattern, const std::string& text) {
    auto re = tokenizer_json::OnigRegex::Compile(pattern, "test");
    EXPECT_TRUE(re.ok()) << re.status();
    std::vector<tokenizer_json::Span> m;
    if (re.ok()) {
      EXPECT_TRUE((*re)->FindAll(text, &m).ok());
    }
    return m.size();
  };
  EXPECT_EQ(spans(R"(\s)",
                  "a\xC2\x85"
                  "b\u00a0c\ufeffd"),
            2u);                                           // NEL, NBSP
  EXPECT_EQ(spans(R"(\w+)", "a\u0301\u00b2_\u203f"), 1u);  // mark, No, Pc
  EXPECT_EQ(spans(R"(\h+)", "x0aFz"), 1u);                 // hex digits
  EXPECT_EQ(spans(R"(\u00e9)", "\u00e9"), 1u);
  EXPECT_EQ(spans(R"(^a$)", "b\na\nc"), 1u);  // line anchors
  for (const char* refused :
       {"[[:alpha:]]", "[a&&b]", R"(\G)", "(?u:a)", "a{2}+", R"([\S])"}) {
    auto re = tokenizer_json::OnigRegex::Compile(refused, "p");
    EXPECT_FALSE(re.ok()) << refused;
  }
}

TEST(TokenizerJson, DigitsPunctuationAndWhitespaceUseUnicodeClasses) {
  json f = File(Bpe({}));
  f["model"]["unk_token"] = nullptr;
  // Splits are visible through a vocabulary of whole pieces.
  json vocab = json::object();
  for (const char* w : {"a", "\u0663\u0664", "b", "\u00b2", "!", ",",
                        "h\u00e9llo", "w\u00f6rld", "!!", "1", "2"}) {
    vocab[w] = vocab.size();
  }
  f["model"]["vocab"] = vocab;
  f["model"]["ignore_merges"] = true;
  f["pre_tokenizer"] = {{"type", "Digits"}, {"individual_digits", false}};
  EXPECT_THAT(Ids(*Load(f), "a\u0663\u0664b\u00b2"), ElementsAre(0, 1, 2, 3));
  f["pre_tokenizer"] = {{"type", "Punctuation"}, {"behavior", "Isolated"}};
  EXPECT_THAT(Ids(*Load(f), "a!!,b"), ElementsAre(0, 4, 4, 5, 2));
  f["pre_tokenizer"] = {{"type", "Whitespace"}};
  EXPECT_THAT(Ids(*Load(f), " h\u00e9llo  w\u00f6rld!! "),
              ElementsAre(6, 7, 8));
  f["pre_tokenizer"] = {{"type", "Digits"}, {"individual_digits", true}};
  EXPECT_THAT(Ids(*Load(f), "12"), ElementsAre(9, 10));
}

TEST(TokenizerJson, ByteLevelRoundTripsEveryByteAndNel) {
  // The GPT-2 split with Oniguruma's \s: U+0085 is whitespace, U+FEFF not.
  // GPT-2's alphabet, written out here from byte_level.rs bytes_char.
  json f = File(Bpe({}));
  json alphabet = json::object();
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable =
        (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const uint32_t cp = printable ? b : 0x100 + n++;
    std::string s;
    if (cp < 0x80) {
      s.push_back(static_cast<char>(cp));
    } else {
      s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    alphabet[s] = b;
  }
  f["model"]["vocab"] = alphabet;
  const json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", true},
                           {"use_regex", true}};
  f["pre_tokenizer"] = byte_level;
  f["decoder"] = byte_level;
  auto t = Load(f);
  const std::string text = "a \xC2\x85 b\xEF\xBB\xBF\n\t\xF0\x9F\x98\x80";
  std::vector<int32_t> ids = Ids(*t, text);
  ASSERT_EQ(ids.size(), text.size());  // one token per byte, no merges
  for (size_t i = 0; i < text.size(); ++i) {
    EXPECT_EQ(ids[i], static_cast<uint8_t>(text[i]));
  }
  EXPECT_EQ(t->Decode(ids), text);
  EXPECT_EQ(t->Pieces(ids), text);
  // Ids that do not make UTF-8 decode with U+FFFD, as from_utf8_lossy.
  EXPECT_EQ(t->Decode(std::vector<int32_t>{0xE2, 0x82, 'a'}),
            "\xEF\xBF\xBD"
            "a");
}

TEST(TokenizerJson, SentencePieceStyleDecoding) {
  // Llama-2's chain: Replace ▁→' ', ByteFallback, Fuse, Strip(' ', 1, 0).
  json f = File(
      Bpe({"<unk>", "\u2581hi", "\u2581there", "<0xE2>", "<0x82>", "<0xAC>"}));
  f["decoder"] = {
      {"type", "Sequence"},
      {"decoders",
       {{{"type", "Replace"},
         {"pattern", {{"String", "\u2581"}}},
         {"content", " "}},
        {{"type", "ByteFallback"}},
        {{"type", "Fuse"}},
        {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  auto t = Load(f);
  EXPECT_EQ(t->Decode(std::vector<int32_t>{1, 2, 3, 4, 5}), "hi there\u20ac");
  // A piece keeps the space a text's start drops.
  EXPECT_EQ(t->Pieces(std::vector<int32_t>{1, 2}), " hi there");
  // An invalid byte run is one U+FFFD per byte (byte_fallback.rs).
  EXPECT_EQ(t->Decode(std::vector<int32_t>{1, 3, 4}),
            "hi\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(TokenizerJson, MetaspaceDecoderDropsEveryReplacementOfTheFirstToken) {
  json f = File(Bpe({"\u2581\u2581a", "\u2581b"}));
  f["decoder"] = {{"type", "Metaspace"},
                  {"replacement", "\u2581"},
                  {"prepend_scheme", "always"},
                  {"split", true}};
  auto t = Load(f);
  EXPECT_EQ(t->Decode(std::vector<int32_t>{0, 1}), "a b");
  f["decoder"]["prepend_scheme"] = "never";
  EXPECT_EQ(Load(f)->Decode(std::vector<int32_t>{0, 1}), "  a b");
}

TEST(TokenizerJson, UnigramBestPathUnknownsAndByteFallback) {
  json vocab = json::array();
  for (const auto& [piece, score] :
       std::vector<std::pair<std::string, double>>{{"<unk>", 0.0},
                                                   {"a", -1.0},
                                                   {"b", -1.0},
                                                   {"ab", -1.5},
                                                   {"<0xE2>", -5.0},
                                                   {"<0x98>", -5.0},
                                                   {"<0x83>", -5.0}}) {
    vocab.push_back(json::array({piece, score}));
  }
  json model = {{"type", "Unigram"},
                {"unk_id", 0},
                {"byte_fallback", false},
                {"vocab", vocab}};
  auto t = Load(File(model));
  EXPECT_THAT(Ids(*t, "abab"), ElementsAre(3, 3));               // -3 beats -4
  EXPECT_THAT(Ids(*t, "a\u2603\u2603b"), ElementsAre(1, 0, 2));  // fused
  model["byte_fallback"] = true;
  auto fallback = Load(File(model));
  EXPECT_THAT(Ids(*fallback, "a\u2603b"), ElementsAre(1, 4, 5, 6, 2));
}

// Segmentations of equal score: Rust's Viterbi keeps the path it found
// first (a later one must score strictly higher), so the piece that starts
// earliest and runs longest wins.
TEST(TokenizerJson, UnigramTiesKeepThePathFoundFirst) {
  json vocab = json::array();
  for (const auto& [piece, score] : std::vector<std::pair<std::string, double>>{
           {"<unk>", 0.0}, {"a", -1.0}, {"b", -1.0}, {"ab", -2.0}}) {
    vocab.push_back(json::array({piece, score}));
  }
  auto t = Load(File({{"type", "Unigram"}, {"unk_id", 0}, {"vocab", vocab}}));
  EXPECT_THAT(Ids(*t, "ab"), ElementsAre(3));
  EXPECT_THAT(Ids(*t, "abab"), ElementsAre(3, 3));
  EXPECT_THAT(Ids(*t, "bab"), ElementsAre(2, 3));
}

TEST(TokenizerJson, PostProcessorAddsSpecialTokensOnlyAtTheStart) {
  json f = File(Bpe(Chars("ab")));
  f["added_tokens"] = {{{"id", 2}, {"content", "<s>"}, {"special", true}},
                       {{"id", 3}, {"content", "</s>"}, {"special", true}}};
  f["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
        {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}}},
      {"pair", json::array()},
      {"special_tokens",
       {{"<s>", {{"id", "<s>"}, {"ids", {2}}, {"tokens", {"<s>"}}}},
        {"</s>", {{"id", "</s>"}, {"ids", {3}}, {"tokens", {"</s>"}}}}}}};
  auto t = Load(f);
  EXPECT_THAT(Ids(*t, "ab"), ElementsAre(0, 1));
  auto start = t->EncodeStart("ab");
  ASSERT_TRUE(start.ok());
  EXPECT_THAT(*start, ElementsAre(2, 0, 1, 3));
}

TEST(TokenizerJson, NormalizersNfkcLowercaseStrip) {
  json f = File(Bpe({"fi", "x", "i\u0307", " "}));
  f["model"]["ignore_merges"] = true;
  f["normalizer"] = {
      {"type", "Sequence"},
      {"normalizers",
       {{{"type", "NFKC"}},
        {{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
        {{"type", "Lowercase"}}}}};
  auto t = Load(f);
  EXPECT_THAT(Ids(*t, "\u00a0\ufb01\u2003"), ElementsAre(0));  // ﬁ → fi
  EXPECT_THAT(Ids(*t, "\u0130"), ElementsAre(2));  // İ → i + dot above
}

TEST(TokenizerJson, EncodeRefusesTextThatIsNotUtf8) {
  auto t = Load(File(Bpe(Chars("a"))));
  auto ids = t->Encode(std::string("a\xFF", 2));
  ASSERT_FALSE(ids.ok());
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TokenizerJson, RefusalsNameTheJsonPath) {
  json f = File(Bpe(Chars("ab")));
  f["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Digits"}}, {{"type", "Punctuation"}}, {{"type", "Foo"}}}}};
  EXPECT_EQ(LoadError(f),
            "tokenizer.json: pre_tokenizer.pretokenizers[2].type: 'Foo' is "
            "not supported");
  f["pre_tokenizer"] = nullptr;
  f["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", ""}};
  EXPECT_EQ(LoadError(f),
            "tokenizer.json: normalizer.type: 'Precompiled' is not supported");
  f["normalizer"] = nullptr;
  f["decoder"] = {{"type", "WordPiece"}};
  EXPECT_EQ(LoadError(f),
            "tokenizer.json: decoder.type: 'WordPiece' is not supported");
  f["decoder"] = nullptr;
  f["model"] = Bpe(Chars("ab"), {{"a", "b"}});
  EXPECT_EQ(LoadError(f),
            "tokenizer.json: model.merges[0]: 'ab' is not in model.vocab");
  f["model"] = {{"type", "WordPiece"}, {"vocab", json::object()}};
  EXPECT_EQ(LoadError(f),
            "tokenizer.json: model.type: 'WordPiece' is not supported");
  f["model"] = Bpe(Chars("ab"));
  f["model"]["dropout"] = 0.1;
  EXPECT_THAT(LoadError(f), HasSubstr("model.dropout"));
  f["model"]["dropout"] = nullptr;
  f["pre_tokenizer"] = {{"type", "Split"},
                        {"pattern", {{"Regex", "[[:alpha:]]"}}},
                        {"behavior", "Isolated"},
                        {"invert", false}};
  EXPECT_THAT(LoadError(f),
              HasSubstr("tokenizer.json: pre_tokenizer.pattern.Regex: at "
                        "offset 1: a POSIX bracket"));
  EXPECT_THAT(LoadError(json::parse("[1]")), HasSubstr("must be an object"));
  auto bad = ParseTokenizerJson("{\"model\": ");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("tokenizer.json: not valid JSON"));
}

}  // namespace
}  // namespace linattn
