#include "core/model/jinja/render.h"

#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/model/jinja/builtins.h"
#include "core/model/jinja/lexer.h"

namespace linattn::jinja {

Renderer::Renderer(const Dict& context, const RenderLimits& limits)
    : limits_(limits) {
  auto globals = std::make_shared<Scope>();
  static const Dict* const kGlobals = new Dict(Globals());
  for (const auto& [k, v] : kGlobals->items()) globals->vars[k] = v;
  auto top = std::make_shared<Scope>();
  top->parent = std::move(globals);
  for (const auto& [k, v] : context.items()) top->vars[k] = v;
  scope_ = std::move(top);
}

absl::Status Renderer::Run(const Body& body, std::string* out) {
  top_out_ = out;
  auto flow = Exec(body, out);
  return flow.status();
}

absl::Status Renderer::Located(int line, int column,
                               const absl::Status& s) const {
  if (s.ok() || s.code() == absl::StatusCode::kFailedPrecondition ||
      s.code() == absl::StatusCode::kResourceExhausted ||
      absl::StartsWith(s.message(), "line ")) {
    return s;
  }
  return absl::Status(s.code(), At(line, column, s.message()));
}

absl::Status Renderer::Step(int line, int column) {
  if (++steps_ > limits_.max_steps) {
    return absl::ResourceExhaustedError(
        At(line, column,
           absl::StrCat("the template ran more than ", limits_.max_steps,
                        " loop iterations and calls")));
  }
  return absl::OkStatus();
}

Value Renderer::Lookup(const std::string& name) const {
  for (const Scope* s = scope_.get(); s != nullptr; s = s->parent.get()) {
    auto it = s->vars.find(name);
    if (it != s->vars.end()) return it->second;
  }
  return Value::Undefined(name);
}

void Renderer::SetLocal(const std::string& name, Value value) {
  scope_->vars[name] = std::move(value);
}

absl::StatusOr<Renderer::Flow> Renderer::Exec(const Body& body,
                                              std::string* out) {
  for (const auto& s : body) {
    auto flow = ExecOne(*s, out);
    if (!flow.ok()) return flow;
    if (out->size() > limits_.max_output_bytes) {
      return absl::ResourceExhaustedError(
          At(s->line, s->column,
             absl::StrCat("the template wrote more than ",
                          limits_.max_output_bytes, " bytes")));
    }
    if (*flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

absl::StatusOr<Renderer::Flow> Renderer::ExecOne(const Stmt& s,
                                                 std::string* out) {
  switch (s.kind) {
    case Stmt::Kind::kText:
      out->append(s.text);
      return Flow::kNormal;
    case Stmt::Kind::kEmit: {
      auto v = Eval(*s.expr);
      if (!v.ok()) return Located(s.line, s.column, v.status());
      out->append(v->Str());
      return Flow::kNormal;
    }
    case Stmt::Kind::kIf:
      for (size_t i = 0; i < s.conditions.size(); ++i) {
        auto c = Eval(*s.conditions[i]);
        if (!c.ok()) return Located(s.line, s.column, c.status());
        if (c->Truthy()) return Exec(s.bodies[i], out);
      }
      return Exec(s.else_body, out);
    case Stmt::Kind::kFor:
      return ExecFor(s, out);
    case Stmt::Kind::kSet: {
      auto v = Eval(*s.expr);
      if (!v.ok()) return Located(s.line, s.column, v.status());
      if (absl::Status st = Assign(s, *v); !st.ok()) {
        return Located(s.line, s.column, st);
      }
      return Flow::kNormal;
    }
    case Stmt::Kind::kSetBlock: {
      std::string captured;
      auto flow = Exec(s.body, &captured);
      if (!flow.ok()) return flow;
      SetLocal(s.targets[0], Value::String(std::move(captured)));
      return flow;
    }
    case Stmt::Kind::kMacro:
      SetLocal(s.text, DefineMacro(s));
      return Flow::kNormal;
    case Stmt::Kind::kBreak:
      return Flow::kBreak;
    case Stmt::Kind::kContinue:
      return Flow::kContinue;
    case Stmt::Kind::kWith: {
      std::vector<Value> values;
      for (const auto& e : s.values) {
        auto v = Eval(*e);
        if (!v.ok()) return Located(s.line, s.column, v.status());
        values.push_back(std::move(*v));
      }
      auto inner = std::make_shared<Scope>();
      inner->parent = scope_;
      for (size_t i = 0; i < values.size(); ++i) {
        inner->vars[s.targets[i]] = values[i];
      }
      std::swap(scope_, inner);
      auto flow = Exec(s.body, out);
      std::swap(scope_, inner);
      return flow;
    }
    case Stmt::Kind::kScope:
      return Exec(s.body, out);
  }
  return Flow::kNormal;
}

absl::Status Renderer::Assign(const Stmt& s, const Value& value) {
  if (!s.attribute.empty()) {
    const Value target = Lookup(s.targets[0]);
    if (!target.is_namespace()) {
      return absl::InvalidArgumentError(
          "can only assign attributes of a namespace()");
    }
    // What a namespace holds outlives the iteration that built it: the
    // one way a template nests values without bound.
    if (value.depth() > kMaxValueDepth) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "a value nested deeper than ", kMaxValueDepth, " levels"));
    }
    target.namespace_dict().Set(s.attribute, value);
    return absl::OkStatus();
  }
  return Bind(s.targets, value);
}

absl::Status Renderer::Bind(const std::vector<std::string>& targets,
                            const Value& value) {
  if (targets.size() == 1) {
    SetLocal(targets[0], value);
    return absl::OkStatus();
  }
  auto items = Iterate(value);
  if (!items.ok()) return items.status();
  if (items->size() != targets.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(items->size() < targets.size() ? "not enough" : "too many",
                     " values to unpack (expected ", targets.size(), ")"));
  }
  for (size_t i = 0; i < items->size(); ++i) SetLocal(targets[i], (*items)[i]);
  return absl::OkStatus();
}

absl::StatusOr<Renderer::Flow> Renderer::ExecFor(const Stmt& s,
                                                 std::string* out) {
  auto iterable = Eval(*s.expr);
  if (!iterable.ok()) return Located(s.line, s.column, iterable.status());
  auto all = Iterate(*iterable);
  if (!all.ok()) return Located(s.line, s.column, all.status());

  // Each iteration starts from the scope around the loop: what one
  // iteration sets is gone in the next (as jinja2's compiled loops reset
  // their names), and nothing set inside leaks out.
  const std::shared_ptr<Scope> outer = scope_;
  auto fresh = [&] {
    scope_ = std::make_shared<Scope>();
    scope_->parent = outer;
  };
  auto restore = [&] { scope_ = outer; };
  fresh();

  auto bind = [&](const Value& item) { return Bind(s.targets, item); };

  // The loop's filter (`for x in xs if cond`) sees each item bound.
  std::vector<Value> items;
  if (s.condition) {
    for (const Value& item : *all) {
      if (absl::Status st = bind(item); !st.ok()) {
        restore();
        return Located(s.line, s.column, st);
      }
      auto keep = Eval(*s.condition);
      if (!keep.ok()) {
        restore();
        return Located(s.line, s.column, keep.status());
      }
      if (keep->Truthy()) items.push_back(item);
    }
  } else {
    items = std::move(*all);
  }

  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    if (absl::Status st = Step(s.line, s.column); !st.ok()) {
      restore();
      return st;
    }
    fresh();
    if (absl::Status st = bind(items[i]); !st.ok()) {
      restore();
      return Located(s.line, s.column, st);
    }
    Dict loop;
    loop.Set("index", Value::Int(i + 1));
    loop.Set("index0", Value::Int(i));
    loop.Set("revindex", Value::Int(n - i));
    loop.Set("revindex0", Value::Int(n - i - 1));
    loop.Set("first", Value::Bool(i == 0));
    loop.Set("last", Value::Bool(i == n - 1));
    loop.Set("length", Value::Int(n));
    loop.Set("depth", Value::Int(1));
    loop.Set("depth0", Value::Int(0));
    loop.Set("previtem", i > 0 ? items[i - 1] : Value::Undefined("previtem"));
    loop.Set("nextitem",
             i + 1 < n ? items[i + 1] : Value::Undefined("nextitem"));
    loop.Set(
        "cycle",
        Value::Callable(
            "cycle",
            [i](Renderer&, const CallArgs& a) -> absl::StatusOr<Value> {
              if (a.positional.empty()) {
                return absl::InvalidArgumentError("no items for cycling given");
              }
              return a.positional[i % a.positional.size()];
            }));
    SetLocal("loop", Value::DictOf(std::move(loop)));
    auto flow = Exec(s.body, out);
    if (!flow.ok()) {
      restore();
      return flow;
    }
    if (*flow == Flow::kBreak) break;
  }
  restore();
  if (n == 0) return Exec(s.else_body, out);
  return Flow::kNormal;
}

Value Renderer::DefineMacro(const Stmt& s) {
  // The macro sees the scope it is defined in. That scope holds the macro,
  // so the macro holds it weakly (a strong reference would be a cycle that
  // outlives the render); the renderer keeps it alive until the end.
  if (kept_scopes_.empty() || kept_scopes_.back() != scope_) {
    kept_scopes_.push_back(scope_);
  }
  std::weak_ptr<Scope> closure = scope_;
  const Stmt* def = &s;
  return Value::Callable(
      s.text,
      [closure, def](Renderer& r,
                     const CallArgs& args) -> absl::StatusOr<Value> {
        if (args.positional.size() > def->params.size()) {
          return absl::InvalidArgumentError(
              absl::StrCat("macro '", def->text, "' takes not more than ",
                           def->params.size(), " argument(s)"));
        }
        if (absl::Status st = r.Step(def->line, def->column); !st.ok()) {
          return st;
        }
        if (r.call_depth_ >= r.limits_.max_call_depth) {
          return absl::ResourceExhaustedError(
              At(def->line, def->column,
                 absl::StrCat("macro calls nested deeper than ",
                              r.limits_.max_call_depth)));
        }
        auto frame = std::make_shared<Scope>();
        frame->parent = closure.lock();
        for (const auto& [key, value] : args.keyword) {
          bool known = false;
          for (const MacroParam& p : def->params) known |= p.name == key;
          if (!known) {
            return absl::InvalidArgumentError(
                absl::StrCat("macro '", def->text,
                             "' takes no keyword argument '", key, "'"));
          }
        }
        std::swap(r.scope_, frame);
        ++r.call_depth_;
        auto finish = [&] {
          --r.call_depth_;
          std::swap(r.scope_, frame);
        };
        for (size_t i = 0; i < def->params.size(); ++i) {
          const MacroParam& p = def->params[i];
          Value v;
          bool given = false;
          if (i < args.positional.size()) {
            v = args.positional[i];
            given = true;
          }
          for (const auto& [key, value] : args.keyword) {
            if (key == p.name) {
              v = value;
              given = true;
            }
          }
          if (!given) {
            if (p.default_value) {
              auto d = r.Eval(*p.default_value);
              if (!d.ok()) {
                finish();
                return d.status();
              }
              v = *d;
            } else {
              v = Value::Undefined(p.name);
            }
          }
          r.SetLocal(p.name, v);
        }
        std::string out;
        auto flow = r.Exec(def->body, &out);
        finish();
        if (!flow.ok()) return flow.status();
        return Value::String(std::move(out));
      });
}

}  // namespace linattn::jinja
