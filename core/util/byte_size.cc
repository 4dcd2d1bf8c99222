#include "core/util/byte_size.h"

#include <cmath>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace linattn {

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text) {
  const std::string s(absl::StripAsciiWhitespace(text));
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a byte size: '", text, "' (", why,
                     "; e.g. 1073741824, 512MiB, 4G, 1.5GB)"));
  };
  // The number: digits with at most one point (no sign, exponent, inf).
  size_t i = 0;
  bool digits = false, point = false;
  for (; i < s.size(); ++i) {
    if (absl::ascii_isdigit(s[i])) {
      digits = true;
    } else if (s[i] == '.' && !point) {
      point = true;
    } else {
      break;
    }
  }
  if (!digits) return bad("no number");
  const double value = std::strtod(s.substr(0, i).c_str(), nullptr);
  const std::string unit =
      absl::AsciiStrToLower(absl::StripAsciiWhitespace(s.substr(i)));
  struct Unit {
    const char* name;
    double scale;
  };
  static constexpr Unit kUnits[] = {
      {"", 1},         {"b", 1},    {"k", 0x1p10}, {"ki", 0x1p10},
      {"kib", 0x1p10}, {"kb", 1e3}, {"m", 0x1p20}, {"mi", 0x1p20},
      {"mib", 0x1p20}, {"mb", 1e6}, {"g", 0x1p30}, {"gi", 0x1p30},
      {"gib", 0x1p30}, {"gb", 1e9}, {"t", 0x1p40}, {"ti", 0x1p40},
      {"tib", 0x1p40}, {"tb", 1e12}};
  for (const Unit& u : kUnits) {
    if (unit != u.name) continue;
    const double bytes = std::floor(value * u.scale);
    if (!(bytes < 0x1p64)) return bad("more than 2^64 - 1 bytes");
    return static_cast<uint64_t>(bytes);
  }
  return bad(absl::StrCat("unknown unit '", s.substr(i), "'"));
}

std::string FormatByteSize(uint64_t bytes) {
  static constexpr const char* kNames[] = {"B",   "KiB", "MiB", "GiB",
                                           "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 6) {
    value /= 1024;
    ++unit;
  }
  if (unit == 0) return absl::StrCat(bytes, " B");
  std::string number = absl::StrFormat("%.2f", value);
  while (number.back() == '0') number.pop_back();
  if (number.back() == '.') number.pop_back();
  return absl::StrCat(number, " ", kNames[unit]);
}

}  // namespace linattn
