// The Jinja engine's own contract: what it refuses at parse time (with the
// line and column), the limits a hostile template meets, and values
// rendered the way Python prints them. Rendering as the reference engine
// does is jinja_reference_test.cc.
#include <string>

#include "core/model/jinja/template.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace linattn::jinja {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<std::string> Render(const std::string& source, Dict context = {},
                                   const RenderLimits& limits = {}) {
  auto t = Template::Parse(source);
  if (!t.ok()) return t.status();
  return (*t)->Render(context, limits);
}

TEST(JinjaTest, RefusesWhatItDoesNotImplementNamingLineAndColumn) {
  struct Case {
    const char* source;
    const char* expect;
  };
  const Case cases[] = {
      {"hi\n  {% include 'x.jinja' %}", "line 2, column 6: 'include' blocks"},
      {"{% extends 'base' %}", "line 1, column 4: 'extends'"},
      {"{% call m() %}x{% endcall %}", "'call' blocks"},
      {"{% filter upper %}x{% endfilter %}", "'filter' blocks"},
      {"{{ x | frobnicate }}",
       "line 1, column 8: no filter named 'frobnicate'"},
      {"{% if x is prime %}{% endif %}", "no test named 'prime'"},
      {"{% for x in y recursive %}{% endfor %}", "recursive loops"},
      {"{{ f(*args) }}", "*args and **kwargs"},
      {"{{ cycler('a') }}", "'cycler' is not supported"},
      {"{% if x %}never closed", "'endif' is missing"},
      {"{{ x }", "unexpected '}'"},
      {"{% frob %}", "unknown tag 'frob'"},
      {"{% break %}", "'break' outside of a loop"},
      {"{{ 'unterminated }}", "unterminated string"},
      {"{# open comment", "Missing end of comment tag"},
      {"{{ 012 }}", "leading zero"},
  };
  for (const Case& c : cases) {
    auto t = Template::Parse(c.source);
    ASSERT_FALSE(t.ok()) << c.source;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(t.status().message(), HasSubstr(c.expect)) << c.source;
  }
  // Not UTF-8.
  EXPECT_THAT(Template::Parse("ok \xff").status().message(),
              HasSubstr("not valid UTF-8"));
  // Nesting past the parser's depth is refused, not a stack overflow.
  const std::string deep(5000, '('), closing(5000, ')');
  EXPECT_THAT(
      Template::Parse("{{ " + deep + "1" + closing + " }}").status().message(),
      HasSubstr("nested too deeply"));
  std::string deep_ifs;
  for (int i = 0; i < 1000; ++i) deep_ifs += "{% if true %}";
  EXPECT_THAT(Template::Parse(deep_ifs).status().message(),
              HasSubstr("nested too deeply"));
}

TEST(JinjaTest, AHostileTemplateMeetsItsLimits) {
  // 10^10 iterations would run for hours.
  auto loops = Render(
      "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
      "{% endfor %}");
  EXPECT_EQ(loops.status().code(), absl::StatusCode::kResourceExhausted);
  // Unbounded recursion.
  auto recursion =
      Render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_EQ(recursion.status().code(), absl::StatusCode::kResourceExhausted);
  // Output past the limit.
  RenderLimits small;
  small.max_output_bytes = 1000;
  auto big =
      Render("{% for i in range(1000) %}0123456789{% endfor %}", {}, small);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  auto concat = Render(
      "{% set ns = namespace(s='x') %}{% for i in range(60) %}"
      "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
      {}, small);
  EXPECT_EQ(concat.status().code(), absl::StatusCode::kResourceExhausted);
  // The sandbox's range limit.
  EXPECT_THAT(Render("{{ range(1000000) | length }}").status().message(),
              HasSubstr("MAX_RANGE"));
}

TEST(JinjaTest, LongChainsAndDeepValuesAreBounded) {
  // A chain of operators, attributes or filters is a tree as deep as it
  // is long: past the parser's depth it is refused, not recursed into.
  std::string sum = "{{ 1";
  for (int i = 0; i < 30000; ++i) sum += "+1";
  EXPECT_THAT(Template::Parse(sum + " }}").status().message(),
              HasSubstr("nested too deeply"));
  std::string conditions = "{{ 1";
  for (int i = 0; i < 30000; ++i) conditions += " if 1 else 1";
  EXPECT_THAT(Template::Parse(conditions + " }}").status().message(),
              HasSubstr("nested too deeply"));
  std::string filters = "{{ 'x'";
  for (int i = 0; i < 30000; ++i) filters += "|trim";
  EXPECT_THAT(Template::Parse(filters + " }}").status().message(),
              HasSubstr("nested too deeply"));
  // A namespace carries a value across iterations: its nesting is bounded.
  auto deep = Render(
      "{% set ns = namespace(v=[]) %}{% for i in range(100000) %}"
      "{% set ns.v = [ns.v] %}{% endfor %}");
  EXPECT_EQ(deep.status().code(), absl::StatusCode::kResourceExhausted);
  // So is what + and replace build.
  RenderLimits small;
  small.max_output_bytes = 1000;
  EXPECT_EQ(Render("{% set ns = namespace(s='x') %}{% for i in range(64) %}"
                   "{% set ns.s = ns.s + ns.s %}{% endfor %}",
                   {}, small)
                .status()
                .code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Render("{{ ('x' * 1000000).replace('', "
                   "'yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy"
                   "yyyyyyyyyyyyyyyyyyyyyy') | length }}")
                .status()
                .code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(JinjaTest, RuntimeErrorsNameWhereTheyHappened) {
  auto undefined = Render("line one\n{{ messages[0].content }}");
  ASSERT_FALSE(undefined.ok());
  EXPECT_EQ(undefined.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(undefined.status().message(), HasSubstr("line 2"));
  EXPECT_THAT(undefined.status().message(), HasSubstr("undefined"));
  auto raised = Render("{{ raise_exception('roles must alternate') }}");
  EXPECT_EQ(raised.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(raised.status().message(), "roles must alternate");
  EXPECT_THAT(Render("{{ 1 + 'a' }}").status().message(),
              HasSubstr("unsupported operand type(s) for +: 'int' and 'str'"));
  EXPECT_THAT(Render("{{ 9223372036854775807 + 1 }}").status().message(),
              HasSubstr("integer overflow"));
}

TEST(JinjaTest, ValuesPrintAsPythonPrintsThem) {
  Dict context;
  context.Set("v", Value::FromJson(nlohmann::ordered_json::parse(
                       R"({"b": [1, 2.0, null, true, "it's"], "a": 1e-5})")));
  auto out = Render("{{ v }}|{{ v.b[1] }}|{{ v.a }}|{{ 1e16 }}|{{ 123.456 }}",
                    context);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "{'b': [1, 2.0, None, True, \"it's\"], 'a': 1e-05}|2.0|1e-05|"
            "1e+16|123.456");
}

TEST(JinjaTest, ATemplateRendersConcurrentlyWithoutSharedState) {
  auto t = Template::Parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}"
      "{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}");
  ASSERT_TRUE(t.ok());
  Dict a, b;
  a.Set("messages", Value::FromJson(nlohmann::ordered_json::parse("[1,2,3]")));
  b.Set("messages", Value::FromJson(nlohmann::ordered_json::parse("[1]")));
  EXPECT_EQ((*t)->Render(a).value(), "3");
  EXPECT_EQ((*t)->Render(b).value(), "1");
  EXPECT_EQ((*t)->Render(a).value(), "3");
}

}  // namespace
}  // namespace linattn::jinja
