// The renderer: runs a parsed template over a context with Jinja's
// scoping (a for loop's body and a macro's body are scopes of their own;
// `if` is not; namespaces carry values out of loops), loop variables,
// macros and loop controls. It stops with RESOURCE_EXHAUSTED when a
// template would loop, recurse or write without bound.
#ifndef LINATTN_CORE_MODEL_JINJA_RENDER_H_
#define LINATTN_CORE_MODEL_JINJA_RENDER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "core/model/jinja/ast.h"
#include "core/model/jinja/value.h"

namespace linattn::jinja {

struct RenderLimits {
  size_t max_output_bytes = size_t{64} << 20;
  int64_t max_steps = 2'000'000;  // loop iterations and calls, in all
  int max_call_depth = 64;        // nested macro calls
};

class Renderer {
 public:
  Renderer(const Dict& context, const RenderLimits& limits);

  // Runs `body` into *out. Errors are "line L, column C: …"; a template's
  // raise_exception(message) is FAILED_PRECONDITION with the message.
  absl::Status Run(const Body& body, std::string* out);

 private:
  struct Scope {
    absl::flat_hash_map<std::string, Value> vars;
    std::shared_ptr<Scope> parent;
  };
  enum class Flow { kNormal, kBreak, kContinue };

  absl::StatusOr<Flow> Exec(const Body& body, std::string* out);
  absl::StatusOr<Flow> ExecOne(const Stmt& s, std::string* out);
  absl::StatusOr<Flow> ExecFor(const Stmt& s, std::string* out);
  absl::Status Assign(const Stmt& s, const Value& value);
  // Names ← a value (one name) or its items (several, as Python unpacks).
  absl::Status Bind(const std::vector<std::string>& targets,
                    const Value& value);
  Value DefineMacro(const Stmt& s);

  absl::StatusOr<Value> Eval(const Expr& e);
  absl::StatusOr<Value> EvalBinary(const Expr& e, const Value& a,
                                   const Value& b);
  absl::StatusOr<Value> EvalCompare(const Expr& e);
  absl::StatusOr<CallArgs> EvalArgs(const Expr& e);

  Value Lookup(const std::string& name) const;
  void SetLocal(const std::string& name, Value value);
  absl::Status Step(int line, int column);
  absl::Status Located(int line, int column, const absl::Status& s) const;

  const RenderLimits limits_;
  std::shared_ptr<Scope> scope_;
  // The scopes macros were defined in (a macro refers to its scope weakly).
  std::vector<std::shared_ptr<Scope>> kept_scopes_;
  int64_t steps_ = 0;
  int call_depth_ = 0;
  std::string* top_out_ = nullptr;
};

}  // namespace linattn::jinja

#endif  // LINATTN_CORE_MODEL_JINJA_RENDER_H_
