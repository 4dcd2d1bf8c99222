// Reading (and, for tests and tools, writing) the safetensors format:
//
//   8 bytes   little-endian u64 N, the header's length
//   N bytes   JSON: {"name": {"dtype": "F32", "shape": [..],
//                             "data_offsets": [begin, end]}, ...,
//                    "__metadata__": {"key": "value", ...}}
//   rest      the tensors' bytes; offsets are relative to its start
//
// A file is memory-mapped read-only; tensor views point into the mapping,
// so a loaded model's weights cost no copy until they are repacked. Every
// entry is validated against the file (dtype, shape × element size = byte
// range, ranges inside the data and not overlapping), so a truncated or
// corrupt file is refused with a message naming the tensor, never read out
// of bounds.
#ifndef LINATTN_CORE_MODEL_SAFETENSORS_H_
#define LINATTN_CORE_MODEL_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace linattn {

enum class DType { kF32, kF16, kBF16 };
absl::string_view DTypeName(DType dtype);  // "F32", "F16", "BF16"
size_t DTypeBytes(DType dtype);

struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // inside the mapping
  uint64_t bytes = 0;
  // The file that holds it, as named beside its directory
  // ("model.safetensors", or a shard's name): errors about it say where it
  // is.
  std::string file;

  uint64_t numel() const;
  // The values as fp32 (exact for all three dtypes), into out[numel()].
  void ToFloat(float* out) const { ToFloat(out, 0, numel()); }
  // Elements [first, first + count) of them (within numel()), into
  // out[count].
  void ToFloat(float* out, uint64_t first, uint64_t count) const;
};

class SafetensorsFile {
 public:
  // NOT_FOUND if the file cannot be opened; INVALID_ARGUMENT naming the
  // file and tensor for anything malformed.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(
      const std::string& path);
  // A checkpoint split into shards, as transformers saves large models:
  // `index_path` (model.safetensors.index.json) maps every tensor to the
  // shard beside it that holds it ({"weight_map": {"name":
  // "model-00001-of-00002.safetensors", …}}). Each shard is opened as Open()
  // opens a file; the result holds every tensor of every shard, as one file
  // would. NOT_FOUND for a missing index or shard; INVALID_ARGUMENT naming
  // the index or shard for a malformed index (or one over kMaxIndexBytes),
  // a shard name that is not a file name beside the index (at most 255
  // bytes), more than kMaxShards shards, a tensor the map places in a shard
  // that does not hold it, one two shards hold, one the map does not name,
  // or shards whose metadata disagree.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> OpenSharded(
      const std::string& index_path);
  static constexpr size_t kMaxShards = 4096;
  // An index lists names: far less than a header may hold.
  static constexpr uint64_t kMaxIndexBytes = 16 << 20;
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // nullptr if absent.
  const TensorView* Find(absl::string_view name) const;
  // The tensor, which must exist with exactly `shape`; the error names the
  // tensor and both shapes.
  absl::StatusOr<const TensorView*> Get(
      absl::string_view name, const std::vector<int64_t>& shape) const;
  const std::map<std::string, TensorView, std::less<>>& tensors() const {
    return tensors_;
  }
  const std::map<std::string, std::string>& metadata() const {
    return metadata_;
  }

 private:
  SafetensorsFile() = default;

  std::string path_;
  void* mapping_ = nullptr;
  size_t mapped_bytes_ = 0;
  // A sharded checkpoint's shards' mappings (the views point into them).
  std::vector<std::pair<void*, size_t>> shard_mappings_;
  std::map<std::string, TensorView, std::less<>> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A tensor to write: fp32 values stored as `dtype` (rounded to nearest even
// for F16/BF16).
struct TensorToWrite {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
  DType dtype = DType::kF32;
};
// The bytes of a safetensors file holding `tensors` (in the given order).
std::string SerializeSafetensors(
    const std::vector<TensorToWrite>& tensors,
    const std::map<std::string, std::string>& metadata = {});

// Half-precision conversions (round to nearest even; NaN and ±inf kept).
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float BFloat16ToFloat(uint16_t b);
uint16_t FloatToBFloat16(float f);

}  // namespace linattn

#endif  // LINATTN_CORE_MODEL_SAFETENSORS_H_
