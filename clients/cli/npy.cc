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

// The header of a .npy file: a Python dict literal with exactly the keys
// 'descr' (a string), 'fortran_order' (True/False) and 'shape' (a tuple of
// non-negative integers), as numpy writes it and as its reader (through
// ast.literal_eval) accepts it; whitespace padding after the closing brace.
struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

class HeaderParser {
 public:
  HeaderParser(absl::string_view text, absl::string_view name)
      : text_(text), name_(name) {}

  absl::StatusOr<NpyHeader> Parse() {
    NpyHeader out;
    bool has_descr = false, has_order = false, has_shape = false;
    SkipSpace();
    if (!Consume('{')) return Error("the header is not a dict");
    for (;;) {
      SkipSpace();
      if (Consume('}')) break;
      std::string key;
      if (!String(&key)) return Error("expected a quoted key");
      SkipSpace();
      if (!Consume(':')) return Error("expected ':' after a key");
      SkipSpace();
      bool* seen = key == "descr"           ? &has_descr
                   : key == "fortran_order" ? &has_order
                   : key == "shape"         ? &has_shape
                                            : nullptr;
      if (seen == nullptr)
        return Error(absl::StrCat("unknown key '", key, "'"));
      if (*seen) return Error(absl::StrCat("key '", key, "' appears twice"));
      *seen = true;
      const bool ok = key == "descr"           ? String(&out.descr)
                      : key == "fortran_order" ? Bool(&out.fortran_order)
                                               : Tuple(&out.shape);
      if (!ok) return Error(absl::StrCat("malformed value of '", key, "'"));
      SkipSpace();
      if (Consume(',')) continue;
      SkipSpace();
      if (Consume('}')) break;
      return Error("expected ',' or '}' after a value");
    }
    SkipSpace();
    if (at_ != text_.size()) return Error("bytes after the closing brace");
    if (!has_descr || !has_order || !has_shape) {
      return Error("it needs 'descr', 'fortran_order' and 'shape'");
    }
    return out;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return Bad(name_, absl::StrCat("malformed header (", what, " at byte ", at_,
                                   "): ", text_));
  }
  void SkipSpace() {
    while (at_ < text_.size() && absl::ascii_isspace(text_[at_])) ++at_;
  }
  bool Consume(char c) {
    if (at_ < text_.size() && text_[at_] == c) {
      ++at_;
      return true;
    }
    return false;
  }
  bool String(std::string* out) {
    if (at_ >= text_.size() || (text_[at_] != '\'' && text_[at_] != '"')) {
      return false;
    }
    const char quote = text_[at_++];
    const size_t close = text_.find(quote, at_);
    if (close == absl::string_view::npos) return false;
    *out = std::string(text_.substr(at_, close - at_));
    if (out->find('\\') != std::string::npos) return false;  // no escapes
    at_ = close + 1;
    return true;
  }
  bool Bool(bool* out) {
    for (const auto& [word, value] :
         {std::pair<absl::string_view, bool>{"True", true}, {"False", false}}) {
      if (text_.substr(at_, word.size()) == word) {
        at_ += word.size();
        *out = value;
        return true;
      }
    }
    return false;
  }
  // (), (n,), (n, m), (n, m,): a trailing comma is allowed, an empty element
  // is not, and a single element needs its comma (else it is no tuple).
  bool Tuple(std::vector<int64_t>* out) {
    if (!Consume('(')) return false;
    SkipSpace();
    if (Consume(')')) return true;
    bool trailing_comma = false;
    for (;;) {
      SkipSpace();
      const size_t start = at_;
      while (at_ < text_.size() && absl::ascii_isdigit(text_[at_])) ++at_;
      int64_t dim = 0;
      if (at_ == start || at_ - start > 18 ||
          !absl::SimpleAtoi(text_.substr(start, at_ - start), &dim)) {
        return false;
      }
      out->push_back(dim);
      SkipSpace();
      trailing_comma = Consume(',');
      SkipSpace();
      if (Consume(')')) break;
      if (!trailing_comma) return false;
    }
    return out->size() > 1 || trailing_comma;
  }

  absl::string_view text_;
  absl::string_view name_;
  size_t at_ = 0;
};

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
  auto header = HeaderParser(dict, name).Parse();
  if (!header.ok()) return header.status();
  if (header->descr != "<f4") {
    return Bad(name, absl::StrCat("dtype '", header->descr,
                                  "' is not float32 ('<f4'); save it with "
                                  "x.astype(numpy.float32)"));
  }
  if (header->fortran_order) {
    return Bad(name,
               "Fortran-ordered arrays are not supported; save a "
               "C-ordered copy (numpy.ascontiguousarray)");
  }
  const std::string shape_text =
      absl::StrCat("(", absl::StrJoin(header->shape, ", "), ")");
  NpyArray array;
  uint64_t count = 1;
  for (int64_t dim : header->shape) {
    if (dim != 0 &&
        count > std::numeric_limits<uint64_t>::max() / 4 / uint64_t(dim)) {
      return Bad(name, absl::StrCat("shape ", shape_text, " is too large"));
    }
    count *= uint64_t(dim);
    array.shape.push_back(dim);
  }
  const uint64_t data_start = header_start + header_len;
  const uint64_t have = bytes.size() - data_start;
  if (have != count * sizeof(float)) {
    return Bad(name, absl::StrCat(
                         "shape ", shape_text, " needs ", count * sizeof(float),
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
