#include "core/util/byte_size.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace linattn {
namespace {

TEST(ByteSizeTest, UnitsAsOperatorsWriteThem) {
  struct Case {
    const char* text;
    uint64_t bytes;
  };
  const Case cases[] = {
      {"0", 0},
      {"1073741824", 1073741824},
      {"100B", 100},
      {"4G", 4ull << 30},
      {"4g", 4ull << 30},
      {"4Gi", 4ull << 30},
      {"4GiB", 4ull << 30},
      {"4 GiB", 4ull << 30},
      {"4GB", 4000000000ull},
      {"512MiB", 512ull << 20},
      {"512M", 512ull << 20},
      {"512mb", 512000000ull},
      {"1.5K", 1536},
      {"2KiB", 2048},
      {"1T", 1ull << 40},
      {"0.5GiB", 512ull << 20},
      {" 64 MiB ", 64ull << 20},
  };
  for (const Case& c : cases) {
    auto got = ParseByteSize(c.text);
    ASSERT_TRUE(got.ok()) << c.text << ": " << got.status();
    EXPECT_EQ(*got, c.bytes) << c.text;
  }
}

TEST(ByteSizeTest, NonsenseIsRefusedSayingWhy) {
  for (const char* text : {"", "G", "-1G", "4X", "4 G B", "1e9", "inf", "nan",
                           "4.5.6M", "4EiB", "99999999999T"}) {
    auto got = ParseByteSize(text);
    EXPECT_FALSE(got.ok()) << text;
    EXPECT_THAT(std::string(got.status().message()),
                ::testing::HasSubstr("not a byte size"))
        << text;
  }
  EXPECT_THAT(std::string(ParseByteSize("99999999999T").status().message()),
              ::testing::HasSubstr("2^64"));
}

TEST(ByteSizeTest, FormatsInBinaryUnits) {
  EXPECT_EQ(FormatByteSize(100), "100 B");
  EXPECT_EQ(FormatByteSize(1536), "1.5 KiB");
  EXPECT_EQ(FormatByteSize(4ull << 30), "4 GiB");
  EXPECT_EQ(FormatByteSize(266240), "260 KiB");
}

}  // namespace
}  // namespace linattn
