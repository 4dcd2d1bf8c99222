#include "core/model/jinja/template.h"

#include "core/model/jinja/lexer.h"
#include "core/model/jinja/parser.h"

namespace linattn::jinja {

absl::StatusOr<std::shared_ptr<const Template>> Template::Parse(
    absl::string_view source) {
  auto tokens = Tokenize(source);
  if (!tokens.ok()) return tokens.status();
  auto body = jinja::Parse(*tokens);
  if (!body.ok()) return body.status();
  auto t = std::shared_ptr<Template>(new Template());
  t->body_ = std::move(*body);
  return std::shared_ptr<const Template>(std::move(t));
}

absl::StatusOr<std::string> Template::Render(const Dict& context,
                                             const RenderLimits& limits) const {
  Renderer renderer(context, limits);
  std::string out;
  if (absl::Status s = renderer.Run(body_, &out); !s.ok()) return s;
  return out;
}

}  // namespace linattn::jinja
