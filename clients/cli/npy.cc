#include "clients/cli/npy.h"

#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace linattn {

namespace {

constexpr absl::string_view kMagic = "\x93NUMPY";

absl::Status Bad(absl::string_view name, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(name, ": ", what));
}

// The value of 'key' in the header dict literal, e.g. "'<f4'" or "(2, 3)".
absl::StatusOr<absl::string_view> DictValue(absl::string_view dict,
                                            absl::string_view key,
                                            absl::string_view name) {
  const std::string quoted = absl::StrCat("'", key, "'");
  size_t at = dict.find(quoted);
  if (at == absl::string_view::npos) {
    return Bad(name, absl::StrCat("header has no ", quoted, " entry"));
  }
  absl::string_view rest = dict.substr(at + quoted.size());
  rest = absl::StripLeadingAsciiWhitespace(rest);
  if (!absl::ConsumePrefix(&rest, ":")) {
    return Bad(name, absl::StrCat("malformed header near ", quoted));
  }
  rest = absl::StripLeadingAsciiWhitespace(rest);
  if (rest.empty())
    return Bad(name, absl::StrCat("malformed header near ", quoted));
  size_t end =
      rest.front() == '(' ? rest.find(')') + 1 : rest.find_first_of(",}");
  if (end == absl::string_view::npos || end == 0) {
    return Bad(name, absl::StrCat("malformed header near ", quoted));
  }
  return absl::StripAsciiWhitespace(rest.substr(0, end));
}

}  // namespace

absl::StatusOr<NpyArray> ParseNpy(absl::string_view bytes,
                                  absl::string_view name) {
  if (bytes.size() < 10 || bytes.substr(0, 6) != kMagic) {
    return Bad(name, "not a .npy file (missing the \\x93NUMPY magic)");
  }
  const uint8_t major = static_cast<uint8_t>(bytes[6]);
  uint64_t header_len = 0;
  size_t header_start = 0;
  if (major == 1) {
    header_len = uint8_t(bytes[8]) | uint64_t(uint8_t(bytes[9])) << 8;
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return Bad(name, "truncated header");
    for (int i = 0; i < 4; ++i)
      header_len |= uint64_t(uint8_t(bytes[8 + i])) << (8 * i);
    header_start = 12;
  } else {
    return Bad(name, absl::StrCat("unsupported .npy format version ", major));
  }
  if (header_start + header_len > bytes.size()) {
    return Bad(name, "truncated header");
  }
  absl::string_view dict = bytes.substr(header_start, header_len);
  auto descr = DictValue(dict, "descr", name);
  if (!descr.ok()) return descr.status();
  if (*descr != "'<f4'") {
    return Bad(name, absl::StrCat("dtype ", *descr,
                                  " is not float32 ('<f4'); save it with "
                                  "x.astype(numpy.float32)"));
  }
  auto fortran = DictValue(dict, "fortran_order", name);
  if (!fortran.ok()) return fortran.status();
  if (*fortran != "False") {
    return Bad(name,
               "Fortran-ordered arrays are not supported; save a "
               "C-ordered copy (numpy.ascontiguousarray)");
  }
  auto shape_text = DictValue(dict, "shape", name);
  if (!shape_text.ok()) return shape_text.status();
  absl::string_view inner = *shape_text;
  if (!absl::ConsumePrefix(&inner, "(") || !absl::ConsumeSuffix(&inner, ")")) {
    return Bad(name, absl::StrCat("malformed shape ", *shape_text));
  }
  NpyArray array;
  uint64_t count = 1;
  for (absl::string_view part :
       absl::StrSplit(inner, ',', absl::SkipWhitespace())) {
    int64_t dim = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &dim) || dim < 0) {
      return Bad(name, absl::StrCat("malformed shape ", *shape_text));
    }
    if (dim != 0 &&
        count > std::numeric_limits<uint64_t>::max() / 4 / uint64_t(dim)) {
      return Bad(name, absl::StrCat("shape ", *shape_text, " is too large"));
    }
    count *= uint64_t(dim);
    array.shape.push_back(dim);
  }
  const uint64_t data_start = header_start + header_len;
  const uint64_t have = bytes.size() - data_start;
  if (have != count * sizeof(float)) {
    return Bad(
        name,
        absl::StrCat("shape ", *shape_text, " needs ", count * sizeof(float),
                     " bytes of data, the file has ", have,
                     have < count * sizeof(float) ? " (truncated)" : ""));
  }
  array.data.resize(count);
  if (count != 0)
    std::memcpy(array.data.data(), bytes.data() + data_start, have);
  return array;
}

absl::StatusOr<NpyArray> ReadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return ParseNpy(buffer.str(), path);
}

std::string SerializeNpy(const std::vector<int64_t>& shape, const float* data) {
  uint64_t count = 1;
  for (int64_t d : shape) count *= uint64_t(d);
  std::string shape_text = absl::StrJoin(shape, ", ");
  if (shape.size() == 1) shape_text += ",";
  std::string dict =
      absl::StrCat("{'descr': '<f4', 'fortran_order': False, 'shape': (",
                   shape_text, "), }");
  // Pad with spaces so the data starts on a 64-byte boundary; end with \n.
  size_t total = 10 + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict.push_back('\n');
  std::string out(kMagic);
  out.push_back('\x01');
  out.push_back('\x00');
  out.push_back(static_cast<char>(dict.size() & 0xff));
  out.push_back(static_cast<char>(dict.size() >> 8));
  out += dict;
  out.append(reinterpret_cast<const char*>(data), count * sizeof(float));
  return out;
}

absl::Status WriteNpy(const std::string& path,
                      const std::vector<int64_t>& shape, const float* data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out)
    return absl::PermissionDeniedError(absl::StrCat(path, ": cannot write"));
  const std::string bytes = SerializeNpy(shape, data);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

}  // namespace linattn
