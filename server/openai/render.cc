#include "server/openai/render.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/model/tool_calls.h"
#include "core/session/session_manager.h"

namespace linattn {

using Kind = CompletionRun::Kind;

const char* FinishReason(const std::string& engine_reason) {
  return engine_reason == "length" ? "length" : "stop";
}

namespace {

json TokenBytesJson(const std::string& bytes) {
  json out = json::array();
  for (unsigned char c : bytes) out.push_back(int(c));
  return out;
}

// Log-probabilities of choice tokens [from, to), as completions (legacy)
// or chat write them.
json LogprobsJson(const CompletionRun& r, const CompletionRun::Choice& c,
                  size_t from, size_t to, size_t text_offset) {
  const Tokenizer& tok = r.model->tokenizer();
  if (r.kind == Kind::kChat) {
    json content = json::array();
    for (size_t i = from; i < to; ++i) {
      const std::string bytes = tok.TokenBytes(c.tokens[i]);
      json top = json::array();
      for (const auto& [id, lp] : c.top[i]) {
        const std::string b = tok.TokenBytes(id);
        top.push_back(
            {{"token", b}, {"logprob", lp}, {"bytes", TokenBytesJson(b)}});
      }
      content.push_back({{"token", bytes},
                         {"logprob", c.logprobs[i]},
                         {"bytes", TokenBytesJson(bytes)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), lps = json::array(), offsets = json::array();
  json tops = r.params.top_logprobs > 0 ? json::array() : json(nullptr);
  for (size_t i = from; i < to; ++i) {
    const std::string bytes = tok.TokenBytes(c.tokens[i]);
    tokens.push_back(bytes);
    lps.push_back(c.logprobs[i]);
    offsets.push_back(text_offset);
    text_offset += bytes.size();
    if (!tops.is_null()) {
      json top = json::object();
      for (const auto& [id, lp] : c.top[i]) top[tok.TokenBytes(id)] = lp;
      tops.push_back(top);
    }
  }
  return {{"tokens", tokens},
          {"token_logprobs", lps},
          {"top_logprobs", tops},
          {"text_offset", offsets}};
}

json OutputText(const std::string& text) {
  return {
      {"type", "output_text"}, {"text", text}, {"annotations", json::array()}};
}

json OutputItem(const CompletionRun& r, const std::string& status) {
  const std::string text = r.choices.empty() ? "" : r.choices[0].text;
  return {{"type", "message"},
          {"id", r.item_id},
          {"status", status},
          {"role", "assistant"},
          {"content", json::array({OutputText(text)})}};
}

std::string Sse(const json& data) {
  return absl::StrCat("data: ", DumpJson(data), "\n\n");
}

std::string SseEvent(CompletionRun& r, const char* type, json data) {
  data["type"] = type;
  data["sequence_number"] = r.sequence++;
  return absl::StrCat("event: ", type, "\ndata: ", DumpJson(data), "\n\n");
}

// An event of the response's one output text part.
std::string TextPartEvent(CompletionRun& r, const char* type, json data) {
  data["item_id"] = r.item_id;
  data["output_index"] = 0;
  data["content_index"] = 0;
  return SseEvent(r, type, std::move(data));
}

// OpenAI's tool_calls for `calls` (in a stream's delta each has its index).
json ToolCallsJson(const std::vector<ToolCall>& calls, bool indexed) {
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json call = {
        {"id", absl::StrCat("call_", RandomSessionId())},
        {"type", "function"},
        {"function",
         {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (indexed) call["index"] = i;
    out.push_back(std::move(call));
  }
  return out;
}

// A chunk of a completion or chat completion stream for one choice.
json Chunk(const CompletionRun& r, int choice, json delta_or_text,
           json logprobs, json finish_reason) {
  const bool chat = r.kind == Kind::kChat;
  json c = {{"index", choice},
            {"logprobs", std::move(logprobs)},
            {"finish_reason", std::move(finish_reason)}};
  c[chat ? "delta" : "text"] = std::move(delta_or_text);
  json chunk = {{"id", r.id},
                {"object", chat ? "chat.completion.chunk" : "text_completion"},
                {"created", r.created},
                {"model", r.model->name()},
                {"system_fingerprint", r.model->fingerprint_hex()},
                {"choices", json::array({c})}};
  if (r.include_usage) chunk["usage"] = nullptr;
  return chunk;
}

}  // namespace

json UsageJson(const CompletionRun& r) {
  uint64_t completion = 0;
  for (const auto& c : r.choices) completion += c.completion_tokens;
  const uint64_t prompt = r.cached + r.prompt.size();
  if (r.kind == Kind::kResponse) {
    return {{"input_tokens", prompt},
            {"input_tokens_details", {{"cached_tokens", r.cached}}},
            {"output_tokens", completion},
            {"output_tokens_details", {{"reasoning_tokens", 0}}},
            {"total_tokens", prompt + completion}};
  }
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", r.cached}}}};
}

std::string EndStatus(const CompletionRun& r) {
  const bool cut = !r.choices.empty() && r.choices[0].finish_reason == "length";
  return cut ? "incomplete" : "completed";
}

json ResponseJson(const CompletionRun& r, const std::string& status) {
  const bool cut = !r.choices.empty() && r.choices[0].finish_reason == "length";
  json output = json::array();
  if (status != "in_progress") output.push_back(OutputItem(r, EndStatus(r)));
  return {
      {"id", r.id},
      {"object", "response"},
      {"created_at", r.created},
      {"status", status},
      {"error", nullptr},
      {"incomplete_details",
       cut ? json{{"reason", "max_output_tokens"}} : json(nullptr)},
      {"instructions",
       r.instructions.empty() ? json(nullptr) : json(r.instructions)},
      {"max_output_tokens", r.params.max_tokens},
      {"model", r.model->name()},
      {"output", output},
      {"parallel_tool_calls", false},
      {"previous_response_id", r.previous_response_id.empty()
                                   ? json(nullptr)
                                   : json(r.previous_response_id)},
      {"store", r.store},
      {"temperature", r.params.temperature},
      {"top_p", r.params.top_p},
      {"text", {{"format", {{"type", "text"}}}}},
      {"tool_choice", "auto"},
      {"tools", json::array()},
      {"truncation", "disabled"},
      {"usage", status == "in_progress" ? json(nullptr) : UsageJson(r)},
      {"metadata", json::object()},
  };
}

json CompletionJson(const CompletionRun& r) {
  const bool chat = r.kind == Kind::kChat;
  json choices = json::array();
  for (size_t i = 0; i < r.choices.size(); ++i) {
    const auto& c = r.choices[i];
    json choice = {
        {"index", i},
        {"logprobs", r.logprobs ? LogprobsJson(r, c, 0, c.tokens.size(), 0)
                                : json(nullptr)},
        {"finish_reason", FinishReason(c.finish_reason)}};
    if (chat && r.parse_tool_calls) {
      const ReplyWithToolCalls reply = ParseToolCallTags(c.text);
      choice["message"] = {
          {"role", "assistant"},
          {"content", reply.calls.empty() || !reply.content.empty()
                          ? json(reply.content)
                          : json(nullptr)}};
      if (!reply.calls.empty()) {
        choice["message"]["tool_calls"] = ToolCallsJson(reply.calls, false);
        choice["finish_reason"] = "tool_calls";
      }
    } else if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    } else {
      choice["text"] = r.echo ? r.prompt_text + c.text : c.text;
    }
    choices.push_back(std::move(choice));
  }
  json body = {{"id", r.id},
               {"object", chat ? "chat.completion" : "text_completion"},
               {"created", r.created},
               {"model", r.model->name()},
               {"system_fingerprint", r.model->fingerprint_hex()},
               {"choices", choices},
               {"usage", UsageJson(r)}};
  if (!r.session_id.empty()) body["session_id"] = r.session_id;
  return body;
}

std::string StreamPrelude(CompletionRun& r) {
  std::string out;
  if (r.kind == Kind::kResponse) {
    out += SseEvent(r, "response.created",
                    {{"response", ResponseJson(r, "in_progress")}});
    out += SseEvent(r, "response.in_progress",
                    {{"response", ResponseJson(r, "in_progress")}});
    json item = OutputItem(r, "in_progress");
    item["content"] = json::array();
    out += SseEvent(r, "response.output_item.added",
                    {{"output_index", 0}, {"item", item}});
    out += TextPartEvent(r, "response.content_part.added",
                         {{"part", OutputText("")}});
    return out;
  }
  for (uint32_t i = 0; i < r.n; ++i) {
    if (r.kind == Kind::kChat) {
      out += Sse(Chunk(r, i, {{"role", "assistant"}, {"content", ""}}, nullptr,
                       nullptr));
    } else if (r.echo) {
      out += Sse(Chunk(r, i, r.prompt_text, nullptr, nullptr));
    }
  }
  return out;
}

namespace {

// A chat stream whose tool calls are read back: text goes out as content
// up to where a call begins (or may begin); at the end, the calls go as
// one tool_calls delta (finish_reason "tool_calls"), or, if the reply
// holds none after all, the rest of its text.
std::string StreamWithToolCalls(CompletionRun& r, const GenerateMux::Event& e,
                                json logprobs) {
  CompletionRun::Choice& c = r.choices[e.choice];
  const GenerateEvent& g = e.event;
  std::string out;
  // What was sent holds no call and ends in no part of one: only the rest
  // is searched (each token costs its own length, not the reply's).
  const size_t unsent_free =
      c.text_sent +
      ToolCallFreeLength(absl::string_view(c.text).substr(c.text_sent));
  const size_t free = g.finished ? c.text.size() : unsent_free;
  ReplyWithToolCalls reply;
  if (g.finished) reply = ParseToolCallTags(c.text);
  const size_t until = reply.calls.empty() ? free : unsent_free;
  std::string delta;
  if (until > c.text_sent) {
    delta = c.text.substr(c.text_sent, until - c.text_sent);
    c.text_sent = until;
  }
  if (!delta.empty() || !logprobs.is_null()) {
    out += Sse(
        Chunk(r, e.choice, {{"content", delta}}, std::move(logprobs), nullptr));
  }
  if (g.finished && g.status.ok()) {
    if (!reply.calls.empty()) {
      out += Sse(Chunk(r, e.choice,
                       {{"tool_calls", ToolCallsJson(reply.calls, true)}},
                       nullptr, nullptr));
    }
    out += Sse(Chunk(r, e.choice, json::object(), nullptr,
                     reply.calls.empty() ? json(FinishReason(g.finish_reason))
                                         : json("tool_calls")));
  }
  return out;
}

}  // namespace

std::string StreamEvent(CompletionRun& r, const GenerateMux::Event& e) {
  const CompletionRun::Choice& c = r.choices[e.choice];
  const GenerateEvent& g = e.event;
  std::string out;
  if (r.kind == Kind::kResponse) {
    if (!g.text.empty()) {
      out +=
          TextPartEvent(r, "response.output_text.delta", {{"delta", g.text}});
    }
    return out;
  }
  const bool chat = r.kind == Kind::kChat;
  const bool token = g.token_id >= 0;
  json logprobs = nullptr;
  if (r.logprobs && token) {
    logprobs = LogprobsJson(r, c, 0, 1, c.text_offset);
  }
  if (r.parse_tool_calls) return StreamWithToolCalls(r, e, std::move(logprobs));
  if (!g.text.empty() || !logprobs.is_null()) {
    out +=
        Sse(Chunk(r, e.choice, chat ? json{{"content", g.text}} : json(g.text),
                  std::move(logprobs), nullptr));
  }
  if (g.finished && g.status.ok()) {
    out += Sse(Chunk(r, e.choice, chat ? json::object() : json(""), nullptr,
                     FinishReason(g.finish_reason)));
  }
  return out;
}

std::string StreamTail(CompletionRun& r, const absl::Status& failed,
                       const std::function<void(json& body)>& keep) {
  const bool response = r.kind == Kind::kResponse;
  if (!failed.ok()) {
    const json error = StatusErrorJson(failed);
    if (!response) return Sse(error) + "data: [DONE]\n\n";
    return SseEvent(r, "error",
                    {{"code", error["error"]["code"]},
                     {"message", error["error"]["message"]},
                     {"param", error["error"]["param"]}});
  }
  std::string out;
  if (response) {
    const std::string status = EndStatus(r);
    const std::string& text = r.choices[0].text;
    out += TextPartEvent(r, "response.output_text.done", {{"text", text}});
    out += TextPartEvent(r, "response.content_part.done",
                         {{"part", OutputText(text)}});
    out += SseEvent(r, "response.output_item.done",
                    {{"output_index", 0}, {"item", OutputItem(r, status)}});
    json body = ResponseJson(r, status);
    keep(body);
    out += SseEvent(
        r,
        status == "incomplete" ? "response.incomplete" : "response.completed",
        {{"response", body}});
    return out;
  }
  if (r.include_usage) {
    json chunk = Chunk(r, 0, "", nullptr, nullptr);
    chunk["choices"] = json::array();
    chunk["usage"] = UsageJson(r);
    out += Sse(chunk);
  }
  return out + "data: [DONE]\n\n";
}

}  // namespace linattn
