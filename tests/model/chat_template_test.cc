#include "core/model/chat_template.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "tests/util/temp_dir.h"

namespace linattn {
namespace {

using ::testing::HasSubstr;
using After = ChatTemplate::After;

TEST(ChatTemplateTest, PlainRendersEveryTurnThenTheGenerationPrompt) {
  auto t = ChatTemplate::Plain().Render({{"developer", "Be brief."},
                                         {"user", "Hi"},
                                         {"assistant", "Hello"},
                                         {"user", "Who?"}},
                                        After::kNothing);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t,
            "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n"
            "<|assistant|>\nHello<|end|>\n<|user|>\nWho?<|end|>\n"
            "<|assistant|>\n");
  EXPECT_EQ(ChatTemplate::Plain().end_of_turn(), "<|end|>");
}

TEST(ChatTemplateTest, AContinuationClosesThePreviousReply) {
  const ChatTemplate chatml = ChatTemplate::ChatMl();
  EXPECT_EQ(*chatml.Render({{"user", "More"}}, After::kEndOfTurn),
            "\n<|im_start|>user\nMore<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(*chatml.Render({{"user", "More"}}, After::kCutReply),
            "<|im_end|>\n<|im_start|>user\nMore<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, AnUnknownRoleIsRefusedNamingIt) {
  auto t = ChatTemplate::Plain().Render({{"user", "a"}, {"tool", "b"}},
                                        After::kNothing);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("messages[1].role"));
}

TEST(ChatTemplateTest, AModelDirectoryNamesChatMlOrFallsBackToPlain) {
  testing::TempDir dir;
  std::string note;
  EXPECT_EQ(ChatTemplate::ForModelDir(dir.Path(""), &note).kind(),
            ChatTemplate::Kind::kPlain);
  EXPECT_THAT(note, HasSubstr("names no chat template"));
  std::ofstream(dir.Path("tokenizer_config.json"))
      << R"({"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"})";
  EXPECT_EQ(ChatTemplate::ForModelDir(dir.Path(""), &note).kind(),
            ChatTemplate::Kind::kPlain);
  EXPECT_THAT(note, HasSubstr("Jinja"));
  std::ofstream(dir.Path("chat_template.json"))
      << R"({"chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"})";
  EXPECT_EQ(ChatTemplate::ForModelDir(dir.Path(""), &note).kind(),
            ChatTemplate::Kind::kChatMl);
  EXPECT_THAT(note, HasSubstr("chat_template.json"));
}

}  // namespace
}  // namespace linattn
