// The two CRC-32s the project writes, both reflected, both computed with
// eight tables (slicing-by-8):
//   - CRC-32 (IEEE 802.3, polynomial 0xedb88320, as zlib computes it): the
//     snapshot container's checksum (core/session/snapshot.h);
//   - CRC-32C (Castagnoli, 0x82f63b78): the durable store's journal records
//     and session files. x86-64 CPUs with SSE4.2 compute it with the crc32
//     instruction (chosen at run time); the table loop gives the same
//     values elsewhere.
// Extend(Crc(a), b) == Crc(a + b) for both.
#ifndef LINATTN_CORE_UTIL_CRC_H_
#define LINATTN_CORE_UTIL_CRC_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace linattn {

uint32_t Crc32IeeeExtend(uint32_t crc, absl::string_view more);

uint32_t Crc32c(absl::string_view data);
uint32_t Crc32cExtend(uint32_t crc, absl::string_view more);
// The table loop alone (for tests of the two paths).
uint32_t Crc32cSoftware(uint32_t crc, absl::string_view more);

}  // namespace linattn

#endif  // LINATTN_CORE_UTIL_CRC_H_
