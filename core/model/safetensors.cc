#include "core/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace linattn {

namespace {

constexpr uint64_t kMaxHeaderBytes = 100 << 20;  // the format's own limit

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// A name from a file, at most 200 bytes of it, for an error message.
std::string Shortened(absl::string_view name) {
  return name.size() <= 200
             ? std::string(name)
             : absl::StrCat(name.substr(0, 200), "… (", name.size(), " bytes)");
}

absl::StatusOr<DType> ParseDType(const std::string& name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  return absl::InvalidArgumentError(
      absl::StrCat("dtype '", name, "' is not supported (F32, F16 or BF16)"));
}

}  // namespace

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
  }
  return "?";
}

size_t DTypeBytes(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1f;
  const uint32_t mantissa = h & 0x3ff;
  if (exponent == 0x1f) {  // inf / NaN
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  }
  if (exponent == 0) {  // zero or subnormal: mantissa · 2^-24, exact in fp32
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) |
                              (mantissa << 13));
}

uint16_t FloatToHalf(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint16_t sign = (bits >> 16) & 0x8000;
  const float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00;
  if (a >= 65520.0f) return sign | 0x7c00;  // rounds to inf
  if (a < 0x1.0p-14f) {  // subnormal half: multiples of 2^-24
    return sign | static_cast<uint16_t>(std::nearbyint(a * 0x1.0p24f));
  }
  // Normal: round the 23-bit mantissa to 10 bits, nearest even.
  uint32_t m = std::bit_cast<uint32_t>(a);
  const uint32_t round = 0xfff + ((m >> 13) & 1);
  m += round;
  const uint32_t exponent = (m >> 23) - 112;
  return sign | static_cast<uint16_t>((exponent << 10) | ((m >> 13) & 0x3ff));
}

float BFloat16ToFloat(uint16_t b) {
  return std::bit_cast<float>(uint32_t(b) << 16);
}

uint16_t FloatToBFloat16(float f) {
  uint32_t bits = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fff + ((bits >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}

uint64_t TensorView::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

void TensorView::ToFloat(float* out, uint64_t first, uint64_t count) const {
  const uint8_t* at = data + first * DTypeBytes(dtype);
  switch (dtype) {
    case DType::kF32:
      std::memcpy(out, at, count * 4);
      return;
    case DType::kF16:
      for (uint64_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, at + 2 * i, 2);
        out[i] = HalfToFloat(h);
      }
      return;
    case DType::kBF16:
      for (uint64_t i = 0; i < count; ++i) {
        uint16_t b;
        std::memcpy(&b, at + 2 * i, 2);
        out[i] = BFloat16ToFloat(b);
      }
      return;
  }
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(
    const std::string& path) {
  // Non-blocking: a FIFO in a file's place must not stall the load.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return absl::NotFoundError(absl::StrCat(path, ": cannot stat"));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a regular file"));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  auto bad = [&path](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
  };
  if (size < 8) {
    ::close(fd);
    return bad("too short for a safetensors file (no header length)");
  }
  void* mapping = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (mapping == MAP_FAILED)
    return absl::InternalError(absl::StrCat(path, ": mmap failed"));
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->mapping_ = mapping;
  file->mapped_bytes_ = size;
  const uint8_t* bytes = static_cast<const uint8_t*>(mapping);

  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes, 8);
  if (header_len > kMaxHeaderBytes || header_len > size - 8) {
    return bad(absl::StrCat("header length ", header_len, " exceeds the file (",
                            size, " bytes): truncated or not safetensors"));
  }
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes + 8, bytes + 8 + header_len);
  } catch (const nlohmann::json::exception& e) {
    return bad(absl::StrCat("header is not valid JSON: ", e.what()));
  }
  if (!header.is_object()) return bad("header is not a JSON object");
  const uint8_t* data = bytes + 8 + header_len;
  const uint64_t data_bytes = size - 8 - header_len;

  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) return bad("__metadata__ is not an object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        // The format's metadata is a map of strings to strings.
        if (!m.value().is_string()) {
          return bad(absl::StrCat("__metadata__: the value of '", m.key(),
                                  "' is not a string"));
        }
        file->metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string& name = it.key();
    const nlohmann::json& e = it.value();
    auto bad_tensor = [&](absl::string_view what) {
      return bad(absl::StrCat("tensor '", name, "': ", what));
    };
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") ||
        !e.contains("data_offsets") || !e["dtype"].is_string() ||
        !e["shape"].is_array() || !e["data_offsets"].is_array() ||
        e["data_offsets"].size() != 2) {
      return bad_tensor("needs dtype, shape and two data_offsets");
    }
    TensorView view;
    view.name = name;
    view.file = path.substr(path.rfind('/') + 1);
    auto dtype = ParseDType(e["dtype"].get<std::string>());
    if (!dtype.ok()) return bad_tensor(dtype.status().message());
    view.dtype = *dtype;
    uint64_t numel = 1;
    for (const nlohmann::json& d : e["shape"]) {
      if (!d.is_number_unsigned())
        return bad_tensor("shape must hold non-negative integers");
      const uint64_t dim = d.get<uint64_t>();
      if (dim != 0 && numel > (uint64_t{1} << 48) / dim)
        return bad_tensor("shape is too large");
      numel *= dim;
      view.shape.push_back(static_cast<int64_t>(dim));
    }
    if (!e["data_offsets"][0].is_number_unsigned() ||
        !e["data_offsets"][1].is_number_unsigned()) {
      return bad_tensor("data_offsets must be non-negative integers");
    }
    const uint64_t begin = e["data_offsets"][0].get<uint64_t>();
    const uint64_t end = e["data_offsets"][1].get<uint64_t>();
    if (begin > end || end > data_bytes) {
      return bad_tensor(absl::StrCat("data_offsets [", begin, ", ", end,
                                     ") fall outside the ", data_bytes,
                                     " bytes of data (truncated file?)"));
    }
    if (end - begin != numel * DTypeBytes(view.dtype)) {
      return bad_tensor(absl::StrCat(
          "shape ", ShapeText(view.shape), " of ", DTypeName(view.dtype),
          " needs ", numel * DTypeBytes(view.dtype),
          " bytes, data_offsets give ", end - begin));
    }
    view.data = data + begin;
    view.bytes = end - begin;
    ranges.emplace_back(begin, end);
    file->tensors_.emplace(name, std::move(view));
  }
  // As the format's reference implementation requires: the tensors, in
  // offset order, tile the data exactly, with no byte left over or shared.
  std::sort(ranges.begin(), ranges.end());
  uint64_t covered = 0;
  for (const auto& [begin, end] : ranges) {
    if (begin < covered) return bad("tensors' data ranges overlap");
    if (begin > covered) {
      return bad(absl::StrCat("data bytes [", covered, ", ", begin,
                              ") belong to no tensor"));
    }
    covered = end;
  }
  if (covered != data_bytes) {
    return bad(absl::StrCat("data bytes [", covered, ", ", data_bytes,
                            ") after the last tensor belong to no tensor"));
  }
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapped_bytes_);
  for (const auto& [mapping, bytes] : shard_mappings_) ::munmap(mapping, bytes);
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::OpenSharded(
    const std::string& index_path) {
  auto bad = [&index_path](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": ", what));
  };
  std::ifstream in(index_path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(index_path, ": cannot open"));
  }
  std::string text;
  {
    in.seekg(0, std::ios::end);
    const std::streamoff size = in.tellg();
    if (size < 0) return bad("cannot be read (not a regular file?)");
    if (static_cast<uint64_t>(size) > kMaxIndexBytes) {
      return bad(absl::StrCat("larger than ", kMaxIndexBytes, " bytes"));
    }
    text.resize(static_cast<size_t>(size));
    in.seekg(0);
    if (!in.read(text.data(), size)) return bad("cannot be read");
  }
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return bad(absl::StrCat("not valid JSON: ", e.what()));
  }
  if (!index.is_object() || !index.contains("weight_map") ||
      !index["weight_map"].is_object()) {
    return bad("weight_map: must be an object of tensor names to shards");
  }
  // Every entry's shard: a plain file name beside the index.
  std::map<std::string, std::string, std::less<>> shard_of;
  std::map<std::string, size_t> shards;  // name → tensors the map gives it
  for (const auto& [name, shard] : index["weight_map"].items()) {
    if (!shard.is_string()) {
      return bad(absl::StrCat("weight_map.", Shortened(name),
                              ": must be a file name"));
    }
    const std::string file = shard.get<std::string>();
    if (file.empty() || file == "." || file == ".." || file.size() > 255 ||
        file.find('/') != std::string::npos ||
        file.find('\0') != std::string::npos) {
      return bad(absl::StrCat(
          "weight_map.", Shortened(name), ": '", Shortened(file),
          "' is not a file name beside the index (at most 255 bytes)"));
    }
    shard_of[name] = file;
    ++shards[file];
    if (shards.size() > kMaxShards) {
      return bad(absl::StrCat("names more than ", kMaxShards, " shards"));
    }
  }
  const size_t slash = index_path.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "." : index_path.substr(0, slash);
  std::unique_ptr<SafetensorsFile> out(new SafetensorsFile());
  out->path_ = index_path;
  for (const auto& [file, count] : shards) {
    LINATTN_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> shard,
                             Open(dir + "/" + file));
    out->shard_mappings_.emplace_back(shard->mapping_, shard->mapped_bytes_);
    shard->mapping_ = nullptr;  // now unmapped by `out`
    for (auto& [name, view] : shard->tensors_) {
      auto it = shard_of.find(name);
      if (it == shard_of.end() || it->second != file) {
        return bad(absl::StrCat(
            file, " holds tensor '", Shortened(name), "', which weight_map ",
            it == shard_of.end() ? "does not name"
                                 : absl::StrCat("places in ", it->second)));
      }
      out->tensors_.emplace(name, std::move(view));
    }
    if (shard->tensors_.size() != count) {
      for (const auto& [name, in_shard] : shard_of) {
        if (in_shard == file && !out->tensors_.count(name)) {
          return bad(absl::StrCat("weight_map places tensor '", Shortened(name),
                                  "' in ", file, ", which does not hold it"));
        }
      }
    }
    for (const auto& [key, value] : shard->metadata_) {
      auto [at, added] = out->metadata_.emplace(key, value);
      if (!added && at->second != value) {
        return bad(absl::StrCat(file, ": metadata '", Shortened(key),
                                "' differs from another shard's"));
      }
    }
  }
  return out;
}

const TensorView* SafetensorsFile::Find(absl::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::StatusOr<const TensorView*> SafetensorsFile::Get(
    absl::string_view name, const std::vector<int64_t>& shape) const {
  const TensorView* view = Find(name);
  if (view == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": tensor '", name, "' is missing"));
  }
  if (view->shape != shape) {
    return absl::InvalidArgumentError(
        absl::StrCat(shard_mappings_.empty() ? path_ : view->file, ": tensor '",
                     name, "' has shape ", ShapeText(view->shape),
                     ", the config needs ", ShapeText(shape)));
  }
  return view;
}

std::string SerializeSafetensors(
    const std::vector<TensorToWrite>& tensors,
    const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string data;
  for (const TensorToWrite& t : tensors) {
    const uint64_t begin = data.size();
    for (float v : t.values) {
      if (t.dtype == DType::kF32) {
        data.append(reinterpret_cast<const char*>(&v), 4);
      } else {
        const uint16_t h =
            t.dtype == DType::kF16 ? FloatToHalf(v) : FloatToBFloat16(v);
        data.append(reinterpret_cast<const char*>(&h), 2);
      }
    }
    header[t.name] = {{"dtype", std::string(DTypeName(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {begin, data.size()}}};
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8,
              ' ');  // data 8-byte aligned, as writers do
  const uint64_t n = text.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  out += text;
  out += data;
  return out;
}

}  // namespace linattn
