// A Jinja template as Hugging Face renders chat templates: parsed once,
// rendered many times (concurrently) over a context of named values.
//
//   auto t = jinja::Template::Parse(text);           // refusals name
//   if (!t.ok()) …                                   // line and column
//   jinja::Dict context;
//   context.Set("messages", jinja::Value::FromJson(messages));
//   absl::StatusOr<std::string> prompt = (*t)->Render(context);
//
// The language is the subset published chat templates use (see parser.h);
// values and their operations follow Python's (value.h).
#ifndef LINATTN_CORE_MODEL_JINJA_TEMPLATE_H_
#define LINATTN_CORE_MODEL_JINJA_TEMPLATE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/model/jinja/ast.h"
#include "core/model/jinja/render.h"
#include "core/model/jinja/value.h"

namespace linattn::jinja {

class Template {
 public:
  // INVALID_ARGUMENT "line L, column C: …" for text outside the subset.
  static absl::StatusOr<std::shared_ptr<const Template>> Parse(
      absl::string_view source);

  // The text the template writes. Errors: FAILED_PRECONDITION with the
  // template's own message for raise_exception(message);
  // RESOURCE_EXHAUSTED past `limits`; INVALID_ARGUMENT "line L, column C:
  // …" for an operation Python would refuse (an undefined value used, a
  // type error …).
  absl::StatusOr<std::string> Render(const Dict& context,
                                     const RenderLimits& limits = {}) const;

 private:
  Body body_;
};

}  // namespace linattn::jinja

#endif  // LINATTN_CORE_MODEL_JINJA_TEMPLATE_H_
