#include "core/util/utf8.h"

#include <string>

#include "gtest/gtest.h"

namespace linattn {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

TEST(Utf8Test, WellFormedTextIsValidAndUnchanged) {
  for (const std::string& s :
       {std::string(""), std::string("plain ascii"), std::string("\xC3\xA9"),
        std::string("\xE2\x9C\x93"), std::string("\xF0\x9F\x98\x80"),
        std::string("\xF4\x8F\xBF\xBF"), std::string("\xED\x9F\xBF"),
        std::string("a\0b", 3)}) {
    EXPECT_TRUE(IsValidUtf8(s)) << s;
    EXPECT_EQ(ToValidUtf8(s), s);
  }
}

TEST(Utf8Test, IllFormedPartsBecomeOneReplacementPerMaximalSubpart) {
  struct Case {
    std::string in, out;
  };
  const Case cases[] = {
      {"\x80", kFffd},                          // stray continuation
      {"\xFF", kFffd},                          // never a lead byte
      {"\xC0\xAF", kFffd + kFffd},              // overlong: C0 is never a lead
      {"\xE0\x80\xAF", kFffd + kFffd + kFffd},  // E0 needs A0..BF next
      {"\xED\xA0\x80", kFffd + kFffd + kFffd},  // a surrogate
      {"\xF4\x90\x80\x80", kFffd + kFffd + kFffd + kFffd},  // > U+10FFFF
      {"\xE2\x9C"
       "a",
       kFffd + "a"},  // truncated, then ASCII resumes
      {"\xF0\x9F\x98"
       "\xE2\x9C\x93",
       kFffd + "\xE2\x9C\x93"},
      {"a\xC3", "a" + kFffd},  // incomplete at the end
  };
  for (const Case& c : cases) {
    EXPECT_FALSE(IsValidUtf8(c.in));
    const std::string out = ToValidUtf8(c.in);
    EXPECT_EQ(out, c.out);
    EXPECT_TRUE(IsValidUtf8(out));
  }
}

TEST(Utf8StreamTest, HoldsBackIncompleteCharactersAndReplacesBadBytes) {
  Utf8Stream s;
  const std::string check = "\xE2\x9C\x93";  // ✓
  EXPECT_EQ(s.Push("a"), "a");
  EXPECT_EQ(s.Push(check.substr(0, 1)), "");
  EXPECT_EQ(s.Push(check.substr(1, 1)), "");
  EXPECT_EQ(s.Push(check.substr(2, 1) + "b"), check + "b");
  // A byte that can never start a character is replaced at once rather
  // than held or passed on.
  EXPECT_EQ(s.Push("\xFF"), kFffd);
  EXPECT_EQ(s.Push("\x80"), kFffd);
  // A lead byte followed by something that cannot continue it.
  EXPECT_EQ(s.Push("\xC3"), "");
  EXPECT_EQ(s.Push("x"), kFffd + "x");
  // What is still incomplete at the end becomes one replacement.
  EXPECT_EQ(s.Push("\xF0\x9F"), "");
  EXPECT_EQ(s.Flush(), kFffd);
  EXPECT_EQ(s.Flush(), "");
}

TEST(Utf8StreamTest, EveryByteSequenceComesOutValidWhateverTheSplit) {
  // Each byte value in turn, in pieces of every size from 1 to 5: the
  // concatenated output is always valid and equals the one-shot conversion.
  std::string all;
  for (int b = 0; b < 256; ++b) {
    all.push_back(static_cast<char>(b));
    all.push_back(static_cast<char>(0x80 | (b & 0x3F)));
  }
  const std::string whole = ToValidUtf8(all);
  for (size_t piece = 1; piece <= 5; ++piece) {
    Utf8Stream s;
    std::string out;
    for (size_t i = 0; i < all.size(); i += piece) {
      out += s.Push(absl::string_view(all).substr(i, piece));
    }
    out += s.Flush();
    EXPECT_TRUE(IsValidUtf8(out));
    EXPECT_EQ(out, whole) << "piece " << piece;
  }
}

}  // namespace
}  // namespace linattn
