// ChatTemplate: chat messages → the text a model continues (docs/design.md
// §3, "Chat templates").
//
// A model directory names its template as Hugging Face reads it, first
// found wins: chat_template.jinja, then "chat_template" in
// chat_template.json, then in tokenizer_config.json (a list of named
// templates gives the one named "default", and "tool_use" for requests
// with tools when the list has it). The template is a Jinja
// program; linattn runs it with its own engine (core/model/jinja) over the
// values transformers' apply_chat_template passes: messages,
// add_generation_prompt, tools and documents (None), and the special
// tokens tokenizer_config.json names (bos_token, eos_token …). A template
// outside the engine's subset is refused when the model loads, and the
// chat endpoints then refuse that model with the reason rather than
// render something else.
//
// A directory that names no template gets linattn's own:
//
//   plain:   "<|{role}|>\n{content}<|end|>\n" per message, then the
//            generation prompt "<|assistant|>\n"; a reply ends at "<|end|>"
//   chatml:  "<|im_start|>{role}\n{content}<|im_end|>\n" per message, then
//            "<|im_start|>assistant\n"; a reply ends at "<|im_end|>"
//   rwkv:    RWKV's own convention (BlinkDL's RWKV7-G1x-templates.txt), the
//            default of RWKV models (model types rwkv7 and rwkv6, or the World
//            tokenizer): "{Role}: {content}\n\n" per message (System, User,
//            Assistant), the content cleaned as BlinkDL advises (\r\n → \n,
//            runs of newlines → one, stripped), then "Assistant:"; a reply
//            ends at "\n\n" (and the model's reply begins with its space)
// (role: system, user or assistant; OpenAI's "developer" is system). A
// reply stops before its end-of-turn marker, whose text the model produced
// and the context keeps; messages that continue the conversation then
// begin with the newline after it (or, after a reply cut short, with the
// marker itself). A model's Jinja template renders whole conversations: a
// continuation renders the conversation with and without the new
// messages and sends the difference (Render's `history`).
#ifndef LINATTN_CORE_MODEL_CHAT_TEMPLATE_H_
#define LINATTN_CORE_MODEL_CHAT_TEMPLATE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/model/jinja/template.h"
#include "nlohmann/json.hpp"

namespace linattn {

struct ChatMessage {
  std::string role;  // system | developer | user | assistant | tool
  std::string content;
  bool content_null =
      false;  // sent as null or not at all (a template sees None)
  // OpenAI's tool calling as transformers' templates read it: an
  // assistant message's calls ([{id, type, function: {name, arguments}}],
  // arguments a JSON object), a tool message's call id and name.
  nlohmann::ordered_json tool_calls;  // null when none
  std::string tool_call_id;
  std::string name;
};

// BlinkDL's clean_txt for a turn of RWKV's convention (the rwkv template).
std::string CleanRwkvTurn(absl::string_view text);

class ChatTemplate {
 public:
  enum class Kind { kPlain, kChatMl, kRwkv, kJinja, kRefused };

  // The template of the model in `dir`; `note` (if given) says which file
  // gave it, or why linattn's own is used: `fallback` (plain, or rwkv for
  // RWKV models), which must be one of linattn's own.
  static ChatTemplate ForModelDir(const std::string& dir,
                                  std::string* note = nullptr,
                                  Kind fallback = Kind::kPlain);
  static ChatTemplate Plain() { return ChatTemplate(Kind::kPlain); }
  static ChatTemplate ChatMl() { return ChatTemplate(Kind::kChatMl); }
  static ChatTemplate Rwkv() { return ChatTemplate(Kind::kRwkv); }
  // A Jinja template from its text; `origin` names where it came from (in
  // errors). `special_tokens` are the values the template sees besides
  // the messages (bos_token, eos_token …). A template the engine refuses
  // gives Kind::kRefused.
  static ChatTemplate FromJinja(absl::string_view source, std::string origin,
                                jinja::Dict special_tokens);

  Kind kind() const { return kind_; }
  const char* name() const;
  // OK, or FAILED_PRECONDITION saying why the model's template is refused.
  absl::Status Usable() const;

  // What the messages follow in the context.
  enum class After {
    kNothing,    // a new conversation
    kEndOfTurn,  // a reply that ended at its end-of-turn marker
    kCutReply,   // a reply that ended without it (length, eos, cancel)
  };
  // The messages as the model reads them, then the generation prompt.
  // INVALID_ARGUMENT naming messages[i].role for a role it does not know,
  // or "messages: …" when a Jinja template refuses the conversation
  // (raise_exception) or fails on it. A Jinja template renders whole
  // conversations, so a continuation needs the conversation so far:
  // `history`, its last message the assistant's reply as the model wrote
  // it. The context then holds the template's text for the history's
  // prompt, the reply, and (kEndOfTurn) its marker; the new text is what
  // the template writes for the whole conversation past that.
  // FAILED_PRECONDITION without a history, or when the whole does not
  // begin with what the context holds (a template that rewrites earlier
  // turns, such as one that drops past reasoning).
  // `tools` (null, or OpenAI's list of function definitions) go to a Jinja
  // template as `tools`; linattn's own templates have no tool format and
  // refuse them, and tool messages and calls, naming the field.
  absl::StatusOr<std::string> Render(
      const std::vector<ChatMessage>& messages, After after,
      const std::vector<ChatMessage>* history = nullptr,
      const nlohmann::ordered_json& tools = nullptr) const;
  // Whether the template writes tool calls as <tool_call>{json}</tool_call>
  // (Hermes' and Qwen's form), so that a reply's calls can be read back
  // (tool_calls.h).
  bool writes_tool_call_tags() const { return tool_call_tags_; }
  // The end-of-turn marker: a reply's generation stops at it (for a Jinja
  // template the eos_token tokenizer_config.json names; empty if none,
  // when the model's end-of-sequence id ends a reply).
  std::string end_of_turn() const;

 private:
  explicit ChatTemplate(Kind kind) : kind_(kind) {}
  absl::StatusOr<std::string> RenderJinja(
      const std::vector<ChatMessage>& messages, bool add_generation_prompt,
      const nlohmann::ordered_json& tools) const;
  static std::string RenderRwkv(const std::vector<ChatMessage>& messages,
                                After after);

  Kind kind_;
  std::string origin_;   // kJinja, kRefused: the file
  std::string refusal_;  // kRefused: why
  std::shared_ptr<const jinja::Template> jinja_;
  // A list of named templates' "tool_use": what requests with tools get
  // (as transformers picks it), or why it is refused.
  std::shared_ptr<const jinja::Template> tool_use_;
  std::string tool_use_refusal_;
  jinja::Dict special_tokens_;
  std::string eos_token_;
  bool tool_call_tags_ = false;
};

}  // namespace linattn

#endif  // LINATTN_CORE_MODEL_CHAT_TEMPLATE_H_
