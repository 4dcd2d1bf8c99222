// Chat templates on arbitrary text: the Jinja parser accepts a template or
// refuses it with "line L, column C: …", never crashes; a template it
// accepts renders over a conversation within small limits or fails with an
// error, never crashes or runs away.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "core/model/jinja/template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  auto t = linattn::jinja::Template::Parse(source);
  if (!t.ok()) {
    if (t.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  static const linattn::jinja::Dict* context = [] {
    auto* d = new linattn::jinja::Dict();
    d->Set("messages",
           linattn::jinja::Value::FromJson(nlohmann::ordered_json::parse(R"([
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Hi \u00e9 \ud83d\ude00"},
      {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
        "function": {"name": "f", "arguments": {"x": 1.5, "y": [true, null]}}}]},
      {"role": "tool", "content": "42"}])")));
    d->Set("tools", linattn::jinja::Value::None());
    d->Set("add_generation_prompt", linattn::jinja::Value::Bool(true));
    d->Set("bos_token", linattn::jinja::Value::String("<s>"));
    return d;
  }();
  linattn::jinja::RenderLimits limits;
  limits.max_output_bytes = 1 << 20;
  limits.max_steps = 20000;
  limits.max_call_depth = 16;
  (void)(*t)->Render(*context, limits);
  return 0;
}
