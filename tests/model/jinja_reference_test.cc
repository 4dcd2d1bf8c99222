// linattn's Jinja engine against the reference engine: every template of
// tests/chat/templates rendered over every context of
// tests/chat/contexts.json, by python3-jinja2 (tests/chat/
// render_reference.py, a ctest fixture) and by linattn, byte for byte.
// Where the reference fails, linattn must fail too: with the template's
// own message for raise_exception, with any error otherwise.
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "core/model/jinja/template.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace linattn::jinja {
namespace {

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(JinjaReferenceTest, EveryTemplateOverEveryContextRendersAsJinja2Does) {
  const char* expected_path = std::getenv("LINATTN_JINJA_REFERENCE");
  ASSERT_NE(expected_path, nullptr) << "run through ctest (the fixture)";
  const auto records = nlohmann::ordered_json::parse(ReadText(expected_path));
  const auto contexts = nlohmann::ordered_json::parse(
      ReadText(std::string(LINATTN_SOURCE_DIR) + "/tests/chat/contexts.json"));
  std::map<std::string, nlohmann::ordered_json> context_by_name;
  for (const auto& c : contexts) context_by_name[c["name"]] = c["values"];

  std::map<std::string, std::shared_ptr<const Template>> templates;
  int compared = 0, errors = 0;
  for (const auto& r : records) {
    const std::string name = r["template"];
    SCOPED_TRACE(name + " over " + r["context"].get<std::string>());
    if (!templates.count(name)) {
      auto t = Template::Parse(ReadText(std::string(LINATTN_SOURCE_DIR) +
                                        "/tests/chat/templates/" + name));
      ASSERT_TRUE(t.ok()) << t.status();
      templates[name] = *t;
    }
    // The context as render_jinja_template passes it: tools and documents
    // None unless given, add_generation_prompt False unless given.
    Dict context;
    context.Set("tools", Value::None());
    context.Set("documents", Value::None());
    context.Set("add_generation_prompt", Value::Bool(false));
    for (const auto& [key, value] : context_by_name.at(r["context"]).items()) {
      context.Set(key, Value::FromJson(value));
    }
    auto out = templates[name]->Render(context);
    if (r.contains("output")) {
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_EQ(*out, r["output"].get<std::string>());
      ++compared;
    } else {
      ASSERT_FALSE(out.ok())
          << "jinja2 failed with: " << r["error"] << "\nlinattn wrote:\n"
          << *out;
      if (r["raised"].get<bool>()) {
        EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition);
        EXPECT_EQ(out.status().message(), r["error"].get<std::string>());
      }
      ++errors;
    }
  }
  // The matrix is what the test claims it is.
  EXPECT_GE(compared, 50);
  EXPECT_GE(errors, 10);
}

}  // namespace
}  // namespace linattn::jinja
