// Command-line checks shared by linattn, linattn-server and linattn-load
// (CLI11 validators). CLI11's own range checks print their bounds in full,
// which for "≥ 0" is a 300-digit number; these say what is meant.
#ifndef LINATTN_CORE_UTIL_FLAG_CHECKS_H_
#define LINATTN_CORE_UTIL_FLAG_CHECKS_H_

#include <cmath>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/util/byte_size.h"

namespace linattn {

// A finite number ≥ `min` (and ≤ `max` when given).
inline CLI::Validator NumberAtLeast(double min, double max = INFINITY) {
  std::string range = std::isinf(max)
                          ? absl::StrCat("≥ ", min)
                          : absl::StrCat("in [", min, ", ", max, "]");
  return CLI::Validator(
      [min, max, range](std::string& text) -> std::string {
        double value = 0;
        if (!absl::SimpleAtod(text, &value) || !std::isfinite(value)) {
          return absl::StrCat("'", text, "' is not a number");
        }
        if (value < min || value > max) {
          return absl::StrCat("must be ", range, ", got ", text);
        }
        return "";
      },
      range);
}

// A byte size as ParseByteSize reads it (4G, 512MiB, 1073741824 …).
inline CLI::Validator ByteSize() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        auto bytes = ParseByteSize(text);
        return bytes.ok() ? "" : std::string(bytes.status().message());
      },
      "SIZE");
}

}  // namespace linattn

#endif  // LINATTN_CORE_UTIL_FLAG_CHECKS_H_
