#include "core/model/chat_template.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "nlohmann/json.hpp"
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

// A ChatML template as published checkpoints write it.
constexpr char kChatMl[] =
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + "
    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

TEST(ChatTemplateTest, AModelDirectoryNamesItsTemplateAsTransformersReadsIt) {
  testing::TempDir dir;
  std::string note;
  EXPECT_EQ(ChatTemplate::ForModelDir(dir.Path(""), &note).kind(),
            ChatTemplate::Kind::kPlain);
  EXPECT_THAT(note, HasSubstr("names no chat template"));
  // tokenizer_config.json, with its special tokens (string or AddedToken).
  nlohmann::json config = {
      {"chat_template",
       "{{ bos_token }}|{{ messages[0].content }}|{{ eos_token }}"},
      {"bos_token", {{"content", "<s>"}, {"lstrip", false}}},
      {"eos_token", "</s>"}};
  std::ofstream(dir.Path("tokenizer_config.json")) << config.dump();
  ChatTemplate t = ChatTemplate::ForModelDir(dir.Path(""), &note);
  EXPECT_EQ(t.kind(), ChatTemplate::Kind::kJinja);
  EXPECT_THAT(note, HasSubstr("tokenizer_config.json"));
  EXPECT_EQ(*t.Render({{"user", "hi"}}, After::kNothing), "<s>|hi|</s>");
  EXPECT_EQ(t.end_of_turn(), "</s>");
  // chat_template.json comes before it, chat_template.jinja before both.
  std::ofstream(dir.Path("chat_template.json"))
      << nlohmann::json({{"chat_template", kChatMl}}).dump();
  EXPECT_EQ(*ChatTemplate::ForModelDir(dir.Path(""), &note)
                 .Render({{"developer", "Be brief."}, {"user", "Hi"}},
                         After::kNothing),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi"
            "<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_THAT(note, HasSubstr("chat_template.json"));
  std::ofstream(dir.Path("chat_template.jinja")) << "J{{ messages | length }}";
  EXPECT_EQ(*ChatTemplate::ForModelDir(dir.Path(""), &note)
                 .Render({{"user", "a"}}, After::kNothing),
            "J1");
  EXPECT_THAT(note, HasSubstr("chat_template.jinja"));
}

// RWKV's convention, as BlinkDL's RWKV7-G1x-templates.txt writes it:
// "System: …\n\nUser: …\n\nAssistant: …\n\nUser: …\n\nAssistant:", the
// turns cleaned as its clean_txt does.
TEST(ChatTemplateTest, RwkvTurnsAreBlinkDlsTemplates) {
  const ChatTemplate t = ChatTemplate::Rwkv();
  EXPECT_EQ(t.name(), std::string("rwkv"));
  EXPECT_EQ(t.end_of_turn(), "\n\n");
  EXPECT_EQ(*t.Render({{"user", "xxx"}}, After::kNothing),
            "User: xxx\n\nAssistant:");
  EXPECT_EQ(*t.Render({{"developer", "Be brief."},
                       {"user", "Hi"},
                       {"assistant", " Hello."},
                       {"user", "Again"}},
                      After::kNothing),
            "System: Be brief.\n\nUser: Hi\n\nAssistant: Hello.\n\nUser: "
            "Again\n\nAssistant:");
  // A session's reply ended at its blank line: the next turn follows at
  // once; cut short, the blank line comes first.
  EXPECT_EQ(*t.Render({{"user", "b"}}, After::kEndOfTurn),
            "User: b\n\nAssistant:");
  EXPECT_EQ(*t.Render({{"user", "b"}}, After::kCutReply),
            "\n\nUser: b\n\nAssistant:");
  // clean_txt: \r\n → \n, runs of newlines → one, stripped; so no turn
  // holds the blank line that ends one.
  EXPECT_EQ(CleanRwkvTurn(" \tone\r\n\r\ntwo\n\n\nthree\nfour \n\n"),
            "one\ntwo\nthree\nfour");
  EXPECT_EQ(CleanRwkvTurn("\r\r\n"), "");
  EXPECT_EQ(CleanRwkvTurn("a\rb"), "a\rb");
  EXPECT_EQ(*t.Render({{"user", "a\n\n\nb\n"}}, After::kNothing),
            "User: a\nb\n\nAssistant:");
  // No tool turns in it, as in linattn's other own templates.
  EXPECT_EQ(t.Render({{"tool", "x"}}, After::kNothing).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A directory without a template gets it when the model is RWKV's; a
  // template of the directory's own still wins.
  testing::TempDir dir;
  std::string note;
  EXPECT_EQ(
      ChatTemplate::ForModelDir(dir.Path(""), &note, ChatTemplate::Kind::kRwkv)
          .kind(),
      ChatTemplate::Kind::kRwkv);
  EXPECT_THAT(note, HasSubstr("RWKV's User:/Assistant: convention"));
  std::ofstream(dir.Path("chat_template.jinja")) << "J";
  EXPECT_EQ(
      ChatTemplate::ForModelDir(dir.Path(""), &note, ChatTemplate::Kind::kRwkv)
          .kind(),
      ChatTemplate::Kind::kJinja);
}

TEST(ChatTemplateTest, RequestsWithToolsGetTheToolUseTemplateOfANamedList) {
  testing::TempDir dir;
  std::ofstream(dir.Path("tokenizer_config.json"))
      << nlohmann::json({{"chat_template",
                          {{{"name", "default"}, {"template", "D"}},
                           {{"name", "tool_use"},
                            {"template", "T{{ tools | length }}"}}}}})
             .dump();
  ChatTemplate t = ChatTemplate::ForModelDir(dir.Path(""));
  EXPECT_EQ(*t.Render({{"user", "a"}}, After::kNothing), "D");
  EXPECT_EQ(*t.Render({{"user", "a"}}, After::kNothing, nullptr,
                      nlohmann::ordered_json::parse("[{}]")),
            "T1");
}

TEST(ChatTemplateTest, ATemplateOutsideTheSubsetIsRefusedWithItsLocation) {
  testing::TempDir dir;
  std::ofstream(dir.Path("chat_template.jinja"))
      << "{% for m in messages %}\n  {% include 'turn.jinja' %}{% endfor %}";
  std::string note;
  ChatTemplate t = ChatTemplate::ForModelDir(dir.Path(""), &note);
  EXPECT_EQ(t.kind(), ChatTemplate::Kind::kRefused);
  EXPECT_THAT(note, HasSubstr("line 2, column 6"));
  EXPECT_EQ(t.Usable().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(t.Usable().message()),
              HasSubstr("chat_template.jinja"));
  auto rendered = t.Render({{"user", "hi"}}, After::kNothing);
  EXPECT_EQ(rendered.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ChatTemplateTest, ATemplatesRefusalOfTheMessagesIsTheClientsError) {
  ChatTemplate t = ChatTemplate::FromJinja(
      "{% if messages[0].role != 'user' %}{{ raise_exception('user first') }}"
      "{% endif %}ok",
      "chat_template.jinja", {});
  auto r = t.Render({{"assistant", "hi"}}, After::kNothing);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("refuses them: user first"));
}

TEST(ChatTemplateTest, AJinjaContinuationIsTheTextPastWhatTheContextHolds) {
  jinja::Dict tokens;
  tokens.Set("eos_token", jinja::Value::String("<|im_end|>"));
  ChatTemplate t = ChatTemplate::FromJinja(kChatMl, "test", tokens);
  const std::vector<ChatMessage> history = {{"user", "Hi"},
                                            {"assistant", "Hello"}};
  // The context: the first prompt, the reply, and its end-of-turn marker.
  EXPECT_EQ(*t.Render({{"user", "More"}}, After::kEndOfTurn, &history),
            "\n<|im_start|>user\nMore<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(*t.Render({{"user", "More"}}, After::kCutReply, &history),
            "<|im_end|>\n<|im_start|>user\nMore<|im_end|>\n"
            "<|im_start|>assistant\n");
  // Without the history there is nothing to continue from.
  EXPECT_EQ(t.Render({{"user", "More"}}, After::kEndOfTurn).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // A template that rewrites the reply (here: trims it) cannot continue.
  ChatTemplate trims = ChatTemplate::FromJinja(
      "{% for m in messages %}[{{ m.content | trim }}]{% endfor %}", "test",
      tokens);
  const std::vector<ChatMessage> padded = {{"user", "Hi"},
                                           {"assistant", " Hello "}};
  EXPECT_EQ(trims.Render({{"user", "More"}}, After::kCutReply, &padded)
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ChatTemplateTest, ToolsCallsAndToolTurnsReachTheTemplateAsWritten) {
  ChatTemplate t = ChatTemplate::FromJinja(
      "{{ tools | tojson }}|{% for m in messages %}{{ m.role }}:"
      "{% for c in m.tool_calls %}{{ c.function.name }}"
      "{{ c.function.arguments | tojson }}{% endfor %}"
      "{{ m.tool_call_id }}{{ m.content }};{% endfor %}",
      "test", {});
  ChatMessage call{"assistant", ""};
  call.tool_calls = nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "f",
          "arguments": {"z": 1, "a": [true]}}}])");
  ChatMessage result{"tool", "42"};
  result.tool_call_id = "call_1";
  const auto tools = nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "f", "parameters": {}}}])");
  auto r =
      t.Render({{"user", "q"}, call, result}, After::kNothing, nullptr, tools);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(
      *r,
      R"([{"type": "function", "function": {"name": "f", "parameters": {}}}])"
      R"(|user:q;assistant:f{"z": 1, "a": [true]};tool:call_142;)");
  // linattn's own templates have no tool format: refused, naming the field.
  auto plain = ChatTemplate::Plain().Render({{"user", "q"}}, After::kNothing,
                                            nullptr, tools);
  EXPECT_THAT(std::string(plain.status().message()), HasSubstr("tools:"));
  auto turn =
      ChatTemplate::Plain().Render({{"user", "q"}, result}, After::kNothing);
  EXPECT_THAT(std::string(turn.status().message()),
              HasSubstr("messages[1].role"));
}

}  // namespace
}  // namespace linattn
