// The syntax tree of a parsed template: expressions and statements, each
// with the line and column it starts at (runtime errors name them).
#ifndef LINATTN_CORE_MODEL_JINJA_AST_H_
#define LINATTN_CORE_MODEL_JINJA_AST_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/model/jinja/value.h"

namespace linattn::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Expr {
  enum class Kind {
    kLiteral,    // value
    kName,       // name
    kList,       // items
    kTuple,      // items
    kDict,       // items: key, value, key, value …
    kAttr,       // a.name
    kItem,       // a[b]
    kSlice,      // a[b:c:d]; items: start, stop, step (null when absent)
    kCall,       // a(items…, keyword…)
    kFilter,     // a | name(items…, keyword…)
    kTest,       // a is [not] name(items…)
    kNeg,        // -a
    kPos,        // +a
    kNot,        // not a
    kAnd,        // a and b
    kOr,         // a or b
    kBinary,     // a op b: + - * / // % **
    kConcat,     // items joined with ~
    kCompare,    // a op b: == != < <= > >= in, "not in"
    kCondition,  // items: then, test, else (null when absent)
  };
  Kind kind;
  int line = 0;
  int column = 0;
  Value value;
  std::string name;  // the name, attribute, filter, test or operator
  bool negated = false;
  ExprPtr a, b;
  std::vector<ExprPtr> items;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null: required
};

struct Stmt {
  enum class Kind {
    kText,      // text
    kEmit,      // {{ expr }}
    kIf,        // conditions[i] → bodies[i]; else_body
    kFor,       // targets in expr [if condition]: body; else_body
    kSet,       // targets (or target.attribute) = expr
    kSetBlock,  // {% set target %}body{% endset %}
    kMacro,     // name(params): body
    kBreak,
    kContinue,
    kWith,   // targets[i] = values[i]; body
    kScope,  // a body that renders as is ({% generation %})
  };
  Kind kind;
  int line = 0;
  int column = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;
  std::vector<ExprPtr> conditions;
  std::vector<Body> bodies;
  Body body;
  Body else_body;
  std::vector<std::string> targets;
  std::string attribute;  // kSet of a namespace attribute
  std::vector<ExprPtr> values;
  std::vector<MacroParam> params;
};

}  // namespace linattn::jinja

#endif  // LINATTN_CORE_MODEL_JINJA_AST_H_
