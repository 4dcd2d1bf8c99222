// Byte sizes as operators write them on command lines and in environment
// variables: "1073741824", "512MiB", "4G", "1.5GB".
//
//   no unit, B           bytes
//   K, M, G, T           binary: 2^10, 2^20, 2^30, 2^40 (as docker --memory,
//   Ki, Mi, Gi, Ti       java -Xmx and sort -S read them; Kubernetes spells
//   KiB, MiB, GiB, TiB   them Ki, Mi, Gi)
//   KB, MB, GB, TB       decimal: 10^3, 10^6, 10^9, 10^12
//
// Units are case-insensitive and may follow a space. The number may have a
// fraction; the result is rounded down to whole bytes.
#ifndef LINATTN_CORE_UTIL_BYTE_SIZE_H_
#define LINATTN_CORE_UTIL_BYTE_SIZE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace linattn {

// INVALID_ARGUMENT saying what is wrong (not a number, unknown unit,
// negative, more than 2^64 − 1 bytes).
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text);

// 4294967296 → "4 GiB", 1536 → "1.5 KiB", 100 → "100 B".
std::string FormatByteSize(uint64_t bytes);

}  // namespace linattn

#endif  // LINATTN_CORE_UTIL_BYTE_SIZE_H_
