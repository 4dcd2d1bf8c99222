#include "server/openai/completion_run.h"

#include "server/observability.h"

namespace linattn {

CompletionRun::~CompletionRun() {
  Finish(false);
  if (limiter == nullptr) return;
  double used = static_cast<double>(prompt.size());
  for (const Choice& c : choices) {
    used += static_cast<double>(c.completion_tokens);
  }
  limiter->GiveBack(tenant, charged - used);
}

void CompletionRun::Finish(bool success) {
  if (finished_) return;
  finished_ = true;
  std::vector<std::string> ids = cleanup;
  if (own_base && !(success && store)) ids.push_back(base);
  for (const std::string& session : ids) {
    (void)DeleteAndWait(*engine, session, tenant);
  }
}

absl::Status CompletionRun::Failed() const {
  for (const Choice& c : choices) {
    if (!c.status.ok()) return c.status;
  }
  return absl::OkStatus();
}

void CompletionRun::Absorb(const GenerateMux::Event& e) {
  Choice& c = choices[e.choice];
  const GenerateEvent& g = e.event;
  if (g.token_id >= 0 && logprobs) {
    if (stream) {
      if (!c.tokens.empty()) {
        c.text_offset += model->tokenizer().TokenBytes(c.tokens[0]).size();
      }
      c.tokens.clear();
      c.logprobs.clear();
      c.top.clear();
    }
    c.tokens.push_back(g.token_id);
    c.logprobs.push_back(g.logprob);
    c.top.push_back(g.top_logprobs);
  }
  if (g.token_id >= 0) {
    c.completion_tokens = g.completion_tokens;
    CurrentHttpCall().tokens_out++;
    const auto now = std::chrono::steady_clock::now();
    if (observability != nullptr) {
      const bool first =
          c.last_token == std::chrono::steady_clock::time_point();
      const auto since = first ? start : c.last_token;
      const double seconds = std::chrono::duration<double>(now - since).count();
      if (first) {
        observability->FirstToken(seconds);
      } else {
        observability->BetweenTokens(seconds);
      }
    }
    c.last_token = now;
  }
  if (!stream || kind == Kind::kResponse || parse_tool_calls) c.text += g.text;
  if (g.finished) {
    c.finish_reason = g.finish_reason;
    c.status = g.status;
  }
}

}  // namespace linattn
