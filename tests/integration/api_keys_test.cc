// The API keys file (server/api_keys.h): what it accepts, what it refuses
// (naming the entry and field), and how a request's authorization header
// maps to a tenant.
#include "server/api_keys.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "nlohmann/json.hpp"

namespace linattn {
namespace {

using ::testing::HasSubstr;

TEST(ApiKeys, HashesAreSha256) {
  // FIPS 180-2's example.
  EXPECT_EQ(Sha256Hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(ApiKeys, ParsesTenantsQuotasAndAdmins) {
  const nlohmann::json doc = {
      {"keys",
       {{{"sha256", Sha256Hex("k1")},
         {"tenant", "acme"},
         {"max_sessions", 10},
         {"max_state_bytes", "1MiB"},
         {"tokens_per_second", 50.5}},
        {{"sha256", Sha256Hex("k2")},
         {"tenant", "acme"},
         {"max_sessions", 10},
         {"max_state_bytes", 1048576},
         {"tokens_per_second", 50.5}},
        {{"sha256", Sha256Hex("root")}, {"tenant", "ops"}, {"admin", true}}}}};
  auto keys = ApiKeySet::Parse(doc.dump(), "f");
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ((*keys)->key_count(), 3u);
  EXPECT_EQ((*keys)->tenants().size(), 2u);
  const TenantEntry* acme = (*keys)->Find("k2");
  ASSERT_NE(acme, nullptr);
  EXPECT_EQ(acme->name, "acme");
  EXPECT_EQ(acme->quota.max_sessions, 10u);
  EXPECT_EQ(acme->quota.max_state_bytes, 1u << 20);
  EXPECT_EQ(acme->tokens_per_second, 50.5);
  EXPECT_FALSE(acme->admin);
  EXPECT_TRUE((*keys)->Find("root")->admin);
  EXPECT_EQ((*keys)->Find("k3"), nullptr);
  EXPECT_EQ((*keys)->Find(""), nullptr);
}

TEST(ApiKeys, RefusesWhatIsNotAKeyFileNamingTheField) {
  const std::string h = Sha256Hex("k");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[]", "not a JSON object"},
      {"{\"keys\": []}", "keys: must be a non-empty array"},
      {"{\"keys\": [{\"tenant\": \"a\"}]}", "keys[0].sha256"},
      {"{\"keys\": [{\"sha256\": \"abc\", \"tenant\": \"a\"}]}",
       "keys[0].sha256"},
      {"{\"keys\": [{\"sha256\": \"" + h + "\", \"tenant\": \"a b\"}]}",
       "keys[0].tenant"},
      {"{\"keys\": [{\"sha256\": \"" + h +
           "\", \"tenant\": \"a\", \"max_sessions\": -1}]}",
       "keys[0].max_sessions"},
      {"{\"keys\": [{\"sha256\": \"" + h +
           "\", \"tenant\": \"a\", \"admin\": \"yes\"}]}",
       "keys[0].admin"},
      {"{\"keys\": [{\"sha256\": \"" + h +
           "\", \"tenant\": \"a\", \"key\": \"k\"}]}",
       "keys[0].key: unknown field"},
      {"{\"keys\": [{\"sha256\": \"" + h + "\", \"tenant\": \"a\"}, " +
           "{\"sha256\": \"" + Sha256Hex("j") +
           "\", \"tenant\": \"a\", \"admin\": true}]}",
       "keys[1].tenant"},
      {"{\"keys\": [{\"sha256\": \"" + h + "\", \"tenant\": \"a\"}, " +
           "{\"sha256\": \"" + h + "\", \"tenant\": \"b\"}]}",
       "listed twice"},
  };
  for (const auto& [text, expected] : cases) {
    auto keys = ApiKeySet::Parse(text, "keys.json");
    ASSERT_FALSE(keys.ok()) << text;
    EXPECT_EQ(keys.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(keys.status().message(), HasSubstr(expected)) << text;
    EXPECT_THAT(keys.status().message(), HasSubstr("keys.json")) << text;
  }
}

TEST(ApiKeys, AuthorizationHeadersMapToTenants) {
  ApiKeys none;
  auto anonymous = none.Authenticate("");
  ASSERT_TRUE(anonymous.ok());
  EXPECT_EQ(anonymous->name(), "");

  const std::string path = ::testing::TempDir() + "/linattn_api_keys.json";
  {
    std::ofstream out(path);
    out << nlohmann::json{{"keys",
                           {{{"sha256", Sha256Hex("secret")},
                             {"tenant", "acme"},
                             {"max_sessions", 2}}}}}
               .dump();
  }
  auto keys = ApiKeys::Load(path);
  ASSERT_TRUE(keys.ok()) << keys.status();
  for (const std::string header : {"Bearer secret", "bearer secret",
                                   "BEARER  secret ", "Bearer secret\t"}) {
    auto t = (*keys)->Authenticate(header);
    ASSERT_TRUE(t.ok()) << header;
    EXPECT_EQ(t->name(), "acme");
    EXPECT_EQ(t->quota().max_sessions, 2u);
    EXPECT_FALSE(t->admin());
  }
  for (const std::string header :
       {"", "secret", "Basic c2VjcmV0", "Bearer", "Bearer other"}) {
    EXPECT_EQ((*keys)->Authenticate(header).status().code(),
              absl::StatusCode::kUnauthenticated)
        << header;
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace linattn
