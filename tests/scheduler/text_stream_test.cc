#include "core/scheduler/text_stream.h"

#include <gtest/gtest.h>

namespace linattn {
namespace {

// Feeds `tokens` (the last one ends the text) and returns what was sent,
// piece by piece joined with '|', and whether a stop string ended it.
std::pair<std::string, bool> Feed(std::vector<std::string> stops,
                                  const std::vector<std::string>& tokens) {
  TextStream text(std::move(stops));
  std::string out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    TextStream::Piece p = text.Next(tokens[i], i + 1 == tokens.size());
    if (i > 0) out += '|';
    out += p.text;
    if (p.stopped) return {out, true};
  }
  return {out, false};
}

TEST(TextStream, PassesTextThroughWithoutStops) {
  EXPECT_EQ(Feed({}, {"Hel", "lo", " world"}),
            std::make_pair(std::string("Hel|lo| world"), false));
}

TEST(TextStream, HoldsASplitCharacterUntilItCompletes) {
  // "é" is C3 A9, split across two tokens.
  EXPECT_EQ(Feed({}, {"caf\xC3", "\xA9!"}),
            std::make_pair(std::string("caf|\xC3\xA9!"), false));
  // Cut off at the end: U+FFFD.
  EXPECT_EQ(Feed({}, {"a", "\xC3"}),
            std::make_pair(std::string("a|\xEF\xBF\xBD"), false));
}

TEST(TextStream, HoldsATailThatMayBecomeAStopAndEndsBeforeIt) {
  // "EN" could start "END": held; "D" completes it; the text ends before.
  EXPECT_EQ(Feed({"END"}, {"the ", "EN", "D", "more"}),
            std::make_pair(std::string("the ||"), true));
  // "EN" followed by something else is released.
  EXPECT_EQ(Feed({"END"}, {"EN", "Ox", "y"}),
            std::make_pair(std::string("|ENOx|y"), false));
  // The earliest of several stops wins, inside one token.
  EXPECT_EQ(Feed({"cd", "b"}, {"abcd"}),
            std::make_pair(std::string("a"), true));
}

TEST(TextStream, TheLastTokenReleasesWhatWasHeld) {
  EXPECT_EQ(Feed({"END"}, {"x", "EN"}),
            std::make_pair(std::string("x|EN"), false));
  // An empty last token (an end-of-sequence token's) flushes too.
  EXPECT_EQ(Feed({"END"}, {"EN", ""}),
            std::make_pair(std::string("|EN"), false));
}

}  // namespace
}  // namespace linattn
