#include "clients/cli/npy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace linattn {
namespace {

using ::testing::HasSubstr;

TEST(Npy, RoundTripsAndAlignsData) {
  const float data[6] = {1, -2, 3.5f, 0, 1e-30f, 7};
  const std::string bytes = SerializeNpy({2, 1, 3}, data);
  EXPECT_EQ(bytes.size() % 64,
            24u % 64 == 0 ? 0u : bytes.size() % 64);  // data follows the header
  EXPECT_EQ((bytes.size() - 24) % 64, 0u);  // header is padded to 64 bytes
  auto parsed = ParseNpy(bytes, "x.npy");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->shape, (std::vector<int64_t>{2, 1, 3}));
  EXPECT_EQ(parsed->data, std::vector<float>(data, data + 6));
}

// Bytes numpy itself writes for np.arange(3, dtype=np.float32).
TEST(Npy, ReadsNumpyWrittenHeader) {
  std::string header =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }";
  header.append(128 - 10 - header.size() - 1, ' ');
  header += '\n';
  std::string bytes = std::string("\x93NUMPY\x01\x00", 8);
  bytes += char(header.size() & 0xff);
  bytes += char(header.size() >> 8);
  bytes += header;
  const float values[3] = {0, 1, 2};
  bytes.append(reinterpret_cast<const char*>(values), sizeof(values));
  auto parsed = ParseNpy(bytes, "arange.npy");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->shape, std::vector<int64_t>{3});
  EXPECT_EQ(parsed->data[2], 2.0f);
}

TEST(Npy, RejectsBadFilesClearly) {
  const float data[4] = {1, 2, 3, 4};
  const std::string good = SerializeNpy({2, 2}, data);
  auto truncated = ParseNpy(good.substr(0, good.size() - 3), "t.npy");
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(truncated.status().message()), HasSubstr("t.npy"));
  EXPECT_THAT(std::string(truncated.status().message()),
              HasSubstr("truncated"));

  std::string f64 = good;
  f64.replace(f64.find("<f4"), 3, "<f8");
  EXPECT_THAT(std::string(ParseNpy(f64, "d.npy").status().message()),
              HasSubstr("not float32"));

  std::string fortran = good;
  fortran.replace(fortran.find("False"), 5, "True ");
  EXPECT_THAT(std::string(ParseNpy(fortran, "f.npy").status().message()),
              HasSubstr("Fortran"));

  EXPECT_THAT(std::string(ParseNpy("hello world", "h.npy").status().message()),
              HasSubstr("not a .npy file"));
  std::string bad_shape = good;
  bad_shape.replace(bad_shape.find("(2, 2)"), 6, "(2, x)");
  EXPECT_THAT(std::string(ParseNpy(bad_shape, "s.npy").status().message()),
              HasSubstr("shape"));
  EXPECT_EQ(ReadNpy("/nonexistent/q.npy").status().code(),
            absl::StatusCode::kNotFound);
}

// The header is read as the dict literal numpy writes, not searched for
// substrings: what numpy's own reader refuses is refused here too.
TEST(Npy, HeadersAreParsedNotSearched) {
  auto with_header = [](const std::string& dict, size_t floats) {
    std::string header = dict;
    header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
    header += '\n';
    std::string bytes = std::string("\x93NUMPY\x01\x00", 8);
    bytes += char(header.size() & 0xff);
    bytes += char(header.size() >> 8);
    bytes += header;
    bytes.append(floats * 4, '\0');
    return bytes;
  };
  struct Case {
    const char* dict;
    size_t floats;
    bool ok;
  };
  const Case cases[] = {
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (4, 2, 3), }", 24,
       true},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (4, 2, 3,)}", 24,
       true},
      {"{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": ()}", 1,
       true},
      // An empty element: (4,,2,3) is not a tuple.
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (4,,2,3), }", 24,
       false},
      // A one-element shape needs its comma.
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (4), }", 4, false},
      // 'descr' inside another key's value is not the descr entry.
      {"{'fortran_order': False, 'shape': (2,), 'x': \"'descr': '<f4'\"}", 2,
       false},
      // Keys other than the three, twice, or missing.
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'y': 1}", 2,
       false},
      {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, "
       "'shape': (2,)}",
       2, false},
      {"{'descr': '<f4', 'shape': (2,)}", 2, false},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}", 2, false},
      {"{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,)}", 2, false},
  };
  for (const Case& c : cases) {
    auto parsed = ParseNpy(with_header(c.dict, c.floats), "h.npy");
    EXPECT_EQ(parsed.ok(), c.ok) << c.dict << ": " << parsed.status();
    if (!c.ok) {
      EXPECT_THAT(std::string(parsed.status().message()),
                  HasSubstr("malformed header"))
          << c.dict;
    }
  }
}

}  // namespace
}  // namespace linattn
