#include "core/model/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "core/model/tensor_reader.h"
#include "tests/util/temp_dir.h"

namespace linattn {
namespace {

using ::testing::HasSubstr;

class SafetensorsTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_.Path(name);
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  absl::Status OpenStatus(const std::string& bytes) {
    return SafetensorsFile::Open(Write("x.safetensors", bytes)).status();
  }
  testing::TempDir dir_;
};

TEST_F(SafetensorsTest, RoundTripsEveryDtype) {
  const std::vector<float> values = {1.0f, -2.5f, 0.1f, 65504.0f, 1e-7f, 0.0f};
  const std::string bytes =
      SerializeSafetensors({{"a.weight", {2, 3}, values, DType::kF32},
                            {"b", {3, 2}, values, DType::kF16},
                            {"c", {6}, values, DType::kBF16},
                            {"empty", {0, 4}, {}, DType::kF32}},
                           {{"format", "pt"}});
  auto file = SafetensorsFile::Open(Write("m.safetensors", bytes));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  EXPECT_EQ((*file)->tensors().size(), 4u);
  std::vector<float> out(6);
  (*file)->Find("a.weight")->ToFloat(out.data());
  EXPECT_EQ(out, values);
  (*file)->Find("b")->ToFloat(out.data());
  for (size_t i = 0; i < 6; ++i)
    EXPECT_EQ(out[i], HalfToFloat(FloatToHalf(values[i])));
  EXPECT_EQ(out[3], 65504.0f);  // the largest half
  (*file)->Find("c")->ToFloat(out.data());
  for (size_t i = 0; i < 6; ++i)
    EXPECT_EQ(out[i], BFloat16ToFloat(FloatToBFloat16(values[i])));
  EXPECT_EQ((*file)->Find("empty")->numel(), 0u);
  auto shaped = (*file)->Get("a.weight", {2, 3});
  EXPECT_TRUE(shaped.ok());
  auto wrong = (*file)->Get("a.weight", {3, 2});
  EXPECT_THAT(std::string(wrong.status().message()),
              HasSubstr("has shape [2, 3], the config needs [3, 2]"));
  EXPECT_THAT(std::string((*file)->Get("missing", {1}).status().message()),
              HasSubstr("tensor 'missing' is missing"));
}

// Every half and bfloat16 bit pattern survives to fp32 and back, and
// conversions from fp32 round to nearest even.
TEST(HalfPrecision, ExactAndRoundToNearestEven) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToHalf(f), h) << std::hex << h;
    const float g = BFloat16ToFloat(static_cast<uint16_t>(h));
    if (!std::isnan(g)) {
      ASSERT_EQ(FloatToBFloat16(g), h) << std::hex << h;
    }
  }
  EXPECT_EQ(HalfToFloat(FloatToHalf(1.0f + 0x1.0p-11f)), 1.0f);  // tie → even
  EXPECT_EQ(HalfToFloat(FloatToHalf(1.0f + 3 * 0x1.0p-11f)), 1.0f + 0x1.0p-9f);
  EXPECT_EQ(HalfToFloat(0x0001), 0x1.0p-24f);  // smallest subnormal
  EXPECT_TRUE(std::isinf(HalfToFloat(FloatToHalf(70000.0f))));
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.0f + 0x1.0p-8f)),
            1.0f);  // tie → even
}

TEST_F(SafetensorsTest, RefusesDamagedFilesNamingTheProblem) {
  const std::string good =
      SerializeSafetensors({{"w", {4}, {1, 2, 3, 4}, DType::kF32}});
  // Every truncation fails cleanly.
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_FALSE(OpenStatus(good.substr(0, n)).ok()) << "truncated to " << n;
  }
  EXPECT_THAT(
      std::string(OpenStatus(good.substr(0, good.size() - 1)).message()),
      HasSubstr("outside the"));
  std::string huge = good;
  huge[6] = 0x7f;  // header length beyond the file
  EXPECT_THAT(std::string(OpenStatus(huge).message()),
              HasSubstr("header length"));
  auto with_header = [](const std::string& json, size_t data_bytes) {
    const uint64_t n = json.size();
    return std::string(reinterpret_cast<const char*>(&n), 8) + json +
           std::string(data_bytes, '\0');
  };
  EXPECT_THAT(std::string(OpenStatus(with_header("{not json", 0)).message()),
              HasSubstr("JSON"));
  EXPECT_THAT(
      std::string(
          OpenStatus(
              with_header(
                  R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})",
                  8))
              .message()),
      HasSubstr("tensor 'w': dtype 'F64' is not supported"));
  EXPECT_THAT(
      std::string(
          OpenStatus(
              with_header(
                  R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
                  8))
              .message()),
      HasSubstr("needs 12 bytes"));
  EXPECT_THAT(
      std::string(
          OpenStatus(
              with_header(
                  R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                  12))
              .message()),
      HasSubstr("overlap"));
  EXPECT_THAT(
      std::string(
          OpenStatus(
              with_header(
                  R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})",
                  4))
              .message()),
      HasSubstr("non-negative"));
  EXPECT_EQ(
      SafetensorsFile::Open(dir_.Path("none.safetensors")).status().code(),
      absl::StatusCode::kNotFound);
}

// What the format's reference implementation refuses, this reader refuses:
// data bytes that no tensor covers (after the last, or between two), and
// metadata values that are not strings.
TEST_F(SafetensorsTest, EveryDataByteBelongsToATensorAndMetadataIsStrings) {
  auto with_header = [](const std::string& json, size_t data_bytes) {
    const uint64_t n = json.size();
    return std::string(reinterpret_cast<const char*>(&n), 8) + json +
           std::string(data_bytes, '\0');
  };
  const std::string one = R"({"w":{"dtype":"F32","shape":[2],)"
                          R"("data_offsets":[0,8]}})";
  EXPECT_TRUE(OpenStatus(with_header(one, 8)).ok());
  EXPECT_THAT(std::string(OpenStatus(with_header(one, 9)).message()),
              HasSubstr("[8, 9) after the last tensor belong to no tensor"));
  EXPECT_THAT(
      std::string(
          OpenStatus(
              with_header(
                  R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                  R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                  12))
              .message()),
      HasSubstr("[4, 8) belong to no tensor"));
  EXPECT_THAT(
      std::string(
          OpenStatus(
              with_header(
                  R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                  8))
              .message()),
      HasSubstr("[0, 4) belong to no tensor"));
  for (const char* value : {"1", "null", "[\"pt\"]", "{\"a\":\"b\"}"}) {
    const std::string json =
        std::string(R"({"__metadata__":{"format":)") + value +
        R"(},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
    EXPECT_THAT(
        std::string(OpenStatus(with_header(json, 8)).message()),
        HasSubstr("__metadata__: the value of 'format' is not a string"))
        << value;
  }
}

}  // namespace
}  // namespace linattn

namespace linattn {
namespace {

// transformers' sharded checkpoints: an index maps each tensor to the shard
// beside it that holds it; every tensor of every shard reads as one file's,
// and an index that does not describe its shards exactly is refused.
class ShardedSafetensorsTest : public ::testing::Test {
 protected:
  void WriteShards() {
    const std::vector<float> a = {1, 2, 3, 4}, b = {5, 6}, c = {7};
    Write("s-1.safetensors",
          SerializeSafetensors(
              {{"a", {2, 2}, a, DType::kF32}, {"b", {2}, b, DType::kBF16}},
              {{"format", "pt"}}));
    Write("s-2.safetensors",
          SerializeSafetensors({{"c", {1}, c, DType::kF16}}));
  }
  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_.Path(name);
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> OpenIndex(
      const std::string& weight_map) {
    return SafetensorsFile::OpenSharded(
        Write("model.safetensors.index.json",
              R"({"metadata": {"total_size": 28}, "weight_map": )" +
                  weight_map + "}"));
  }
  testing::TempDir dir_;
};

TEST_F(ShardedSafetensorsTest, EveryShardsTensorsReadAsOneFiles) {
  WriteShards();
  auto file = OpenIndex(R"({"a": "s-1.safetensors", "b": "s-1.safetensors",
                    "c": "s-2.safetensors"})");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->tensors().size(), 3u);
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  std::vector<float> out(4);
  (*file)->Find("a")->ToFloat(out.data());
  EXPECT_EQ(out, (std::vector<float>{1, 2, 3, 4}));
  (*file)->Find("c")->ToFloat(out.data());
  EXPECT_EQ(out[0], 7.0f);
  EXPECT_TRUE((*file)->Get("b", {2}).ok());
}

TEST_F(ShardedSafetensorsTest, AnIndexThatDoesNotDescribeItsShardsIsRefused) {
  WriteShards();
  auto refused = [&](const std::string& weight_map, const std::string& what,
                     absl::StatusCode code =
                         absl::StatusCode::kInvalidArgument) {
    auto file = OpenIndex(weight_map);
    ASSERT_FALSE(file.ok()) << weight_map;
    EXPECT_EQ(file.status().code(), code) << file.status();
    EXPECT_THAT(std::string(file.status().message()), HasSubstr(what))
        << weight_map;
  };
  // A tensor the map does not name, or places elsewhere.
  refused(R"({"a": "s-1.safetensors", "c": "s-2.safetensors"})",
          "s-1.safetensors holds tensor 'b', which weight_map does not name");
  refused(R"({"a": "s-1.safetensors", "b": "s-2.safetensors",
              "c": "s-2.safetensors"})",
          "holds tensor 'b', which weight_map places in s-2.safetensors");
  // A tensor the shard does not hold.
  refused(R"({"a": "s-1.safetensors", "b": "s-1.safetensors",
              "c": "s-2.safetensors", "d": "s-2.safetensors"})",
          "weight_map places tensor 'd' in s-2.safetensors, which does not "
          "hold it");
  // Names outside the index's directory, and shards that are not there.
  refused(R"({"a": "../s-1.safetensors"})", "is not a file name beside");
  refused(R"({"a": "/etc/passwd"})", "is not a file name beside");
  refused(R"({"a": ".."})", "is not a file name beside");
  refused(R"({"a": 3})", "weight_map.a: must be a file name");
  refused(R"({"a": "s-9.safetensors"})", "s-9.safetensors: cannot open",
          absl::StatusCode::kNotFound);
  refused(R"([1, 2])", "weight_map: must be an object");
  refused(R"({"a": ""})", "is not a file name beside");
  refused(absl::StrCat(R"({"a": ")", std::string(300, 'x'), R"("})"),
          "(at most 255 bytes)");
  // A tensor two shards hold: the map places it in one of them.
  Write("s-3.safetensors",
        SerializeSafetensors({{"a", {1}, {9}, DType::kF32}}));
  refused(R"({"a": "s-1.safetensors", "b": "s-1.safetensors",
              "c": "s-3.safetensors"})",
          "s-3.safetensors holds tensor 'a', which weight_map places in "
          "s-1.safetensors");
  // Shards whose metadata disagree, and a shard that is not a file.
  Write("s-4.safetensors", SerializeSafetensors({{"c", {1}, {7}, DType::kF32}},
                                                {{"format", "np"}}));
  refused(R"({"a": "s-1.safetensors", "b": "s-1.safetensors",
              "c": "s-4.safetensors"})",
          "metadata 'format' differs from another shard's");
  std::filesystem::create_directories(dir_.Path("d.safetensors"));
  refused(R"({"a": "d.safetensors"})", "d.safetensors: not a regular file");
  auto file = SafetensorsFile::OpenSharded(Write("bad.json", "{"));
  EXPECT_THAT(std::string(file.status().message()),
              HasSubstr("not valid JSON"));
}

// One part of a stacked tensor (an expert of (E, …)), checked against the
// first dimension.
TEST_F(ShardedSafetensorsTest, PartsOfAStackedTensorAreReadAlone) {
  WriteShards();
  auto file = SafetensorsFile::Open(dir_.Path("s-1.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  TensorReader r(**file);
  std::vector<float> part(2);
  ASSERT_TRUE(r.ReadPart("a", {2, 2}, 1, part.data()).ok());
  EXPECT_EQ(part, (std::vector<float>{3, 4}));
  EXPECT_EQ(r.count(), 2u);
  for (int64_t bad : {int64_t{-1}, int64_t{2}}) {
    const absl::Status s = r.ReadPart("a", {2, 2}, bad, part.data());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("s-1.safetensors: a: no part"));
  }
  EXPECT_FALSE(r.ReadPart("a", {4}, 0, part.data()).ok());  // wrong shape
}

}  // namespace
}  // namespace linattn
