// Tool calls in a model's reply, in the form Hermes-style templates (Qwen
// 2.5/3, Hermes 2/3 and the checkpoints trained on their format) tell the
// model to write:
//
//   <tool_call>
//   {"name": "get_weather", "arguments": {"location": "Paris"}}
//   </tool_call>
//
// one block per call, after any text. A reply whose blocks do not all hold
// a JSON object with a string "name" is text, as it stands.
#ifndef LINATTN_CORE_MODEL_TOOL_CALLS_H_
#define LINATTN_CORE_MODEL_TOOL_CALLS_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace linattn {

struct ToolCall {
  std::string name;
  std::string arguments;  // JSON text of an object, as OpenAI returns it
};

struct ReplyWithToolCalls {
  std::string content;  // the text before the first call (whitespace-trimmed)
  std::vector<ToolCall> calls;
};

// The reply's calls; none (and `content` the whole text) when it has no
// well-formed call. A block the reply ends inside counts when its JSON is
// whole (a reply cut at its end-of-turn marker may lack </tool_call>).
ReplyWithToolCalls ParseToolCallTags(absl::string_view text);

// How much of a reply being streamed can go out as text: all of it up to
// where a call begins, or may begin (a suffix that is a prefix of
// "<tool_call>").
size_t ToolCallFreeLength(absl::string_view text);

}  // namespace linattn

#endif  // LINATTN_CORE_MODEL_TOOL_CALLS_H_
