// TensorReader: a model's tensors by name out of model.safetensors (or its
// shards), each
// shape checked against the config before anything is allocated for it (so
// sizes in config.json cannot make the loader allocate more than the file
// holds), converted to fp32, checked finite, and recorded as used: a file
// with a tensor the model does not use is refused (CheckAllUsed).
#ifndef LINATTN_CORE_MODEL_TENSOR_READER_H_
#define LINATTN_CORE_MODEL_TENSOR_READER_H_

#include <cstdint>
#include <initializer_list>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/attention/attention.h"  // AllFinite
#include "core/model/safetensors.h"
#include "core/util/aligned_buffer.h"
#include "core/util/status_macros.h"

namespace linattn {

// Loads tensors by name, checks shapes, and records what was used. Every
// buffer is allocated only after the file has shown a tensor of its shape,
// so sizes in config.json cannot make the loader allocate more than the
// file holds.
class TensorReader {
 public:
  explicit TensorReader(const SafetensorsFile& file) : file_(file) {}

  absl::Status Check(const std::string& name,
                     const std::vector<int64_t>& shape) const {
    return file_.Get(name, shape).status();
  }
  absl::Status Read(const std::string& name, std::vector<int64_t> shape,
                    float* out) {
    LINATTN_ASSIGN_OR_RETURN(const TensorView* t, file_.Get(name, shape));
    t->ToFloat(out);
    used_.insert(name);
    if (!AllFinite(out, t->numel())) {
      return absl::InvalidArgumentError(
          absl::StrCat(t->file, ": ", name, ": has NaN or Inf values"));
    }
    count_ += t->numel();
    return absl::OkStatus();
  }
  // Part `index` of a tensor of `shape` cut along its first dimension
  // (numel / shape[0] floats into `out`): one expert of a stacked (E, …)
  // tensor without converting the others. The tensor counts as used, and
  // its elements once every part has been read.
  absl::Status ReadPart(const std::string& name,
                        const std::vector<int64_t>& shape, int64_t index,
                        float* out) {
    LINATTN_ASSIGN_OR_RETURN(const TensorView* t, file_.Get(name, shape));
    if (shape.empty() || index < 0 || index >= shape[0]) {
      return absl::InvalidArgumentError(
          absl::StrCat(t->file, ": ", name, ": no part ", index, " in ",
                       shape.empty() ? 0 : shape[0]));
    }
    const uint64_t part = t->numel() / static_cast<uint64_t>(shape[0]);
    t->ToFloat(out, static_cast<uint64_t>(index) * part, part);
    used_.insert(name);
    if (!AllFinite(out, part)) {
      return absl::InvalidArgumentError(
          absl::StrCat(t->file, ": ", name, ": has NaN or Inf values (part ",
                       index, " of ", shape[0], ")"));
    }
    count_ += part;
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<float>> Vector(const std::string& name,
                                            int64_t n) {
    LINATTN_RETURN_IF_ERROR(Check(name, {n}));
    std::vector<float> v(n);
    LINATTN_RETURN_IF_ERROR(Read(name, {n}, v.data()));
    return v;
  }
  absl::StatusOr<AlignedBuffer> Matrix(const std::string& name, int64_t rows,
                                       int64_t cols) {
    LINATTN_RETURN_IF_ERROR(Check(name, {rows, cols}));
    AlignedBuffer m(rows * cols);
    LINATTN_RETURN_IF_ERROR(Read(name, {rows, cols}, m.data()));
    return m;
  }
  // Rows of several (rows_i × cols) tensors stacked into one matrix.
  absl::StatusOr<AlignedBuffer> Stacked(
      const std::vector<std::pair<std::string, int64_t>>& parts, int64_t cols) {
    int64_t rows = 0;
    for (const auto& [name, r] : parts) {
      LINATTN_RETURN_IF_ERROR(Check(name, {r, cols}));
      rows += r;
    }
    AlignedBuffer m(rows * cols);
    float* at = m.data();
    for (const auto& [name, r] : parts) {
      LINATTN_RETURN_IF_ERROR(Read(name, {r, cols}, at));
      at += r * cols;
    }
    return m;
  }
  void Skip(const std::string& name) { used_.insert(name); }
  // Every tensor whose name starts with `prefix`; how many there are.
  size_t SkipPrefix(const std::string& prefix) {
    size_t n = 0;
    for (const auto& [name, view] : file_.tensors()) {
      if (name.rfind(prefix, 0) == 0) {
        used_.insert(name);
        ++n;
      }
    }
    return n;
  }
  bool Has(const std::string& name) const {
    return file_.Find(name) != nullptr;
  }

  // Every tensor in the file must belong to the model.
  absl::Status CheckAllUsed() const {
    for (const auto& [name, view] : file_.tensors()) {
      if (!used_.count(name)) {
        return absl::InvalidArgumentError(absl::StrCat(
            view.file, ": unexpected tensor '", name,
            "' (not part of the model this config.json describes)"));
      }
    }
    return absl::OkStatus();
  }
  uint64_t count() const { return count_; }

 private:
  const SafetensorsFile& file_;
  std::set<std::string> used_;
  uint64_t count_ = 0;
};

// A depthwise Conv1d weight (channels, 1, W) into `conv` time-major
// (W × total): tap j of channel `first + c` at j·total + first + c.
inline absl::Status ReadConv(TensorReader& r, const std::string& name,
                             int64_t channels, int64_t width, int64_t first,
                             int64_t total, AlignedBuffer& conv) {
  LINATTN_RETURN_IF_ERROR(r.Check(name, {channels, 1, width}));
  std::vector<float> w(channels * width);
  LINATTN_RETURN_IF_ERROR(r.Read(name, {channels, 1, width}, w.data()));
  for (int64_t ch = 0; ch < channels; ++ch) {
    for (int64_t j = 0; j < width; ++j) {
      conv.data()[j * total + first + ch] = w[ch * width + j];
    }
  }
  return absl::OkStatus();
}

// The first of `names` the file holds (the newest spelling when none).
inline std::string Either(const TensorReader& r,
                          std::initializer_list<std::string> names) {
  for (const std::string& n : names) {
    if (r.Has(n)) return n;
  }
  return *names.begin();
}

}  // namespace linattn

#endif  // LINATTN_CORE_MODEL_TENSOR_READER_H_
