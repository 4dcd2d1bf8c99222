// The table of model types (core/model/model_types.h): every type is found
// by its config.json name and knows its own, the refusal of an unknown
// name lists the table, and each names as its reference a mixer that the
// reference's own table (tools/linattn_ref.py, MODEL_TYPES) lists under the
// same name — so a type added on one side only fails here.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>

#include "core/model/model_types.h"

namespace linattn {
namespace {

using ::testing::HasSubstr;

std::string ReferenceSource() {
  std::ifstream in(std::string(LINATTN_SOURCE_DIR) + "/tools/linattn_ref.py");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(ModelTypeTable, EveryTypeIsFoundByItsNameInModelTypeOrder) {
  ASSERT_EQ(ModelTypes().size(), 10u);
  for (size_t i = 0; i < ModelTypes().size(); ++i) {
    const ModelTypeDef& def = *ModelTypes()[i];
    EXPECT_EQ(static_cast<size_t>(def.type()), i) << def.name();
    EXPECT_EQ(&ModelTypeOf(def.type()), &def);
    EXPECT_EQ(FindModelType(def.name()), &def);
    EXPECT_EQ(ModelTypeName(def.type()), def.name());
  }
  EXPECT_EQ(FindModelType("rwkv5"), nullptr);
}

TEST(ModelTypeTable, AnUnknownTypeIsRefusedListingTheTable) {
  auto c = ParseModelConfig(R"({"model_type": "rwkv5"})");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("model_type: must be one of linear_attn, retnet, gla, "
                        "delta_net, gated_deltanet, mamba2, rwkv7, rwkv6, "
                        "granitemoehybrid, qwen3_next; got "
                        "\"rwkv5\""));
}

TEST(ModelTypeTable, TheReferencesTableHasTheSameTypesAndMixers) {
  const std::string source = ReferenceSource();
  ASSERT_FALSE(source.empty());
  // Each entry: "name": ModelType(Config._reader, Mixer, LM, heads),
  std::map<std::string, std::string> reference;
  const std::string marker = "\": ModelType(Config._";
  for (size_t at = source.find(marker); at != std::string::npos;
       at = source.find(marker, at + 1)) {
    const size_t open = source.rfind('"', at - 1);
    const size_t comma = source.find(", ", at);
    const size_t end = source.find(',', comma + 2);
    ASSERT_NE(open, std::string::npos);
    ASSERT_NE(end, std::string::npos);
    reference[source.substr(open + 1, at - open - 1)] =
        source.substr(comma + 2, end - comma - 2);
  }
  EXPECT_EQ(reference.size(), ModelTypes().size());
  for (const ModelTypeDef* def : ModelTypes()) {
    const std::string name(def->name());
    ASSERT_TRUE(reference.count(name)) << name << " is not in MODEL_TYPES";
    EXPECT_EQ(reference[name], def->reference()) << name;
    EXPECT_THAT(source,
                HasSubstr("class " + std::string(def->reference()) + "("));
  }
}

}  // namespace
}  // namespace linattn
