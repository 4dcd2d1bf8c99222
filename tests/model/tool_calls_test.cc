#include "core/model/tool_calls.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace linattn {
namespace {

TEST(ToolCallsTest, ReadsHermesBlocksAfterText) {
  const ReplyWithToolCalls r = ParseToolCallTags(
      "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"location\": \"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n"
      "{\"name\": \"search\", \"arguments\": \"{\\\"q\\\": "
      "1}\"}\n</tool_call>");
  EXPECT_EQ(r.content, "Let me look.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  // Arguments keep the model's key order.
  EXPECT_EQ(r.calls[0].arguments, R"({"location":"Paris","days":2})");
  // Arguments the model wrote as a string are that string.
  EXPECT_EQ(r.calls[1].arguments, R"({"q": 1})");
}

TEST(ToolCallsTest, AReplyEndingInsideItsLastBlockStillCounts) {
  const ReplyWithToolCalls r =
      ParseToolCallTags("<tool_call>{\"name\": \"f\"}");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{}");
}

TEST(ToolCallsTest, AnythingMalformedIsText) {
  for (const char* text :
       {"<tool_call>{\"name\": 3}</tool_call>",
        "<tool_call>not json</tool_call>",
        "<tool_call>{\"arguments\": {}}</tool_call>",
        "<tool_call>{\"name\": \"f\"}</tool_call> trailing words",
        "plain text, no calls"}) {
    const ReplyWithToolCalls r = ParseToolCallTags(text);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text);
  }
}

TEST(ToolCallsTest, StreamedTextStopsWhereACallMayBegin) {
  EXPECT_EQ(ToolCallFreeLength("Hello"), 5u);
  EXPECT_EQ(ToolCallFreeLength("Hello <tool"), 6u);
  EXPECT_EQ(ToolCallFreeLength("Hello <"), 6u);
  EXPECT_EQ(ToolCallFreeLength("a<tool_call>{"), 1u);
  EXPECT_EQ(ToolCallFreeLength("a < b"), 5u);
}

}  // namespace
}  // namespace linattn
