#include "server/model_check.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "core/model/model.h"

namespace linattn {

namespace {

// What the tokenizer makes of a short text, as ids.
std::string Sample(const Tokenizer& tokenizer) {
  const std::string text = "Hello, world!";
  auto ids = tokenizer.EncodeStart(text);
  if (!ids.ok())
    return absl::StrCat("(cannot encode: ", ids.status().message(), ")");
  std::string out = absl::StrCat("\"", text, "\" →");
  for (int32_t id : *ids) absl::StrAppend(&out, " ", id);
  return out;
}

}  // namespace

int CheckModels(const ServerOptions& options, std::FILE* out) {
  if (options.models.empty()) {
    std::fprintf(out, "no model to check (--model names none)\n");
    return 1;
  }
  int status = 0;
  for (const std::string& dir : options.models) {
    const auto state = options.initial_states.find(dir);
    auto model =
        Model::Load(dir, "", options.weights,
                    state == options.initial_states.end() ? "" : state->second);
    if (!model.ok()) {
      std::fprintf(out, "%s: cannot be served: %s\n", dir.c_str(),
                   std::string(model.status().message()).c_str());
      status = 1;
      continue;
    }
    const Model& m = **model;
    const ModelConfig& c = m.config();
    std::fprintf(out, "model '%s' from %s\n", m.name().c_str(), dir.c_str());
    std::fprintf(out,
                 "  architecture   %s, %lld layers, hidden %lld, %lld heads, "
                 "vocabulary %lld\n",
                 std::string(ModelTypeName(c.type)).c_str(),
                 static_cast<long long>(c.num_hidden_layers),
                 static_cast<long long>(c.hidden_size),
                 static_cast<long long>(c.num_heads),
                 static_cast<long long>(c.vocab_size));
    std::fprintf(out, "  weights        %llu parameters, %s\n",
                 static_cast<unsigned long long>(m.parameter_count()),
                 WeightTypeName(m.weight_type()));
    std::fprintf(out, "  tokenizer      %s, %u ids; %s\n",
                 m.tokenizer().kind().c_str(), m.tokenizer().size(),
                 Sample(m.tokenizer()).c_str());
    std::fprintf(out, "  chat template  %s\n", m.chat_template_note().c_str());
    std::fprintf(out, "  state          %llu bytes per session\n",
                 static_cast<unsigned long long>(m.state_bytes()));
    if (c.is_hybrid())
      std::fprintf(out, "  attention      %s\n", HybridSummary(m).c_str());
    if (c.num_experts > 0) {
      uint32_t layers = 0;
      for (uint32_t l = 0; l < c.num_hidden_layers; ++l) {
        layers += c.layer_has_experts(l) ? 1 : 0;
      }
      std::fprintf(out,
                   "  experts        %u per layer of %u, %u chosen per token, "
                   "in %u of %u layers\n",
                   c.num_experts, c.expert_size, c.experts_per_token, layers,
                   c.num_hidden_layers);
    }
    if (!m.ignored_note().empty()) {
      std::fprintf(out, "  left unread    %s\n", m.ignored_note().c_str());
    }
    if (!m.initial_state_file().empty()) {
      std::fprintf(out, "  initial state  %s\n",
                   m.initial_state_file().c_str());
    }
    if (absl::Status s = m.chat_template().Usable(); !s.ok()) {
      std::fprintf(out, "  cannot be served with chat endpoints: %s\n",
                   std::string(s.message()).c_str());
      status = 1;
    } else {
      std::fprintf(out, "  ok\n");
    }
  }
  return status;
}

}  // namespace linattn
