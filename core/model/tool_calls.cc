#include "core/model/tool_calls.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "core/util/json_depth.h"
#include "nlohmann/json.hpp"

namespace linattn {

namespace {
constexpr absl::string_view kOpen = "<tool_call>";
constexpr absl::string_view kClose = "</tool_call>";
}  // namespace

ReplyWithToolCalls ParseToolCallTags(absl::string_view text) {
  ReplyWithToolCalls reply;
  const size_t first = text.find(kOpen);
  if (first == absl::string_view::npos) {
    reply.content = std::string(text);
    return reply;
  }
  size_t pos = first;
  while (pos != absl::string_view::npos) {
    const size_t body = pos + kOpen.size();
    const size_t close = text.find(kClose, body);
    const absl::string_view json_text = absl::StripAsciiWhitespace(text.substr(
        body, close == absl::string_view::npos ? absl::string_view::npos
                                               : close - body));
    if (!JsonDepthWithin(json_text, kMaxJsonDepth))
      return {std::string(text), {}};
    const auto j = nlohmann::ordered_json::parse(json_text, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("name") ||
        !j["name"].is_string()) {
      return {std::string(text), {}};
    }
    ToolCall call;
    call.name = j["name"].get<std::string>();
    const auto args = j.contains("arguments")
                          ? j["arguments"]
                          : nlohmann::ordered_json::object();
    call.arguments = args.is_string() ? args.get<std::string>() : args.dump();
    reply.calls.push_back(std::move(call));
    if (close == absl::string_view::npos) break;
    // Only whitespace may stand between and after the blocks.
    const size_t next = text.find(kOpen, close + kClose.size());
    const absl::string_view between =
        text.substr(close + kClose.size(), next == absl::string_view::npos
                                               ? absl::string_view::npos
                                               : next - close - kClose.size());
    if (!absl::StripAsciiWhitespace(between).empty()) {
      return {std::string(text), {}};
    }
    pos = next;
  }
  reply.content =
      std::string(absl::StripAsciiWhitespace(text.substr(0, first)));
  return reply;
}

size_t ToolCallFreeLength(absl::string_view text) {
  const size_t open = text.find(kOpen);
  if (open != absl::string_view::npos) return open;
  // A suffix that may grow into "<tool_call>".
  for (size_t n = std::min(text.size(), kOpen.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == kOpen.substr(0, n)) {
      return text.size() - n;
    }
  }
  return text.size();
}

}  // namespace linattn
