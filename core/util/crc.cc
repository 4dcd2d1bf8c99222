#include "core/util/crc.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace linattn {
namespace {

using Tables = std::array<std::array<uint32_t, 256>, 8>;

// Table k maps a byte to its contribution k bytes further on, so eight
// bytes cost eight lookups that do not wait for one another.
template <uint32_t kPolynomial>
const Tables& TablesOf() {
  static const Tables tables = [] {
    Tables t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) {
        c = (c & 1) ? kPolynomial ^ (c >> 1) : c >> 1;
      }
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int k = 1; k < 8; ++k) {
        t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xff];
      }
    }
    return t;
  }();
  return tables;
}

// On the inverted register (the caller inverts before and after).
template <uint32_t kPolynomial>
uint32_t Software(uint32_t c, const unsigned char* p, size_t n) {
  const Tables& t = TablesOf<kPolynomial>();
  auto le32 = [](const unsigned char* q) {
    return uint32_t{q[0]} | uint32_t{q[1]} << 8 | uint32_t{q[2]} << 16 |
           uint32_t{q[3]} << 24;
  };
  for (; n >= 8; p += 8, n -= 8) {
    const uint32_t lo = le32(p) ^ c;
    const uint32_t hi = le32(p + 4);
    c = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^
        t[4][lo >> 24] ^ t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^
        t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
  }
  for (; n > 0; ++p, --n) c = t[0][(c ^ *p) & 0xff] ^ (c >> 8);
  return c;
}

constexpr uint32_t kIeee = 0xedb88320u;
constexpr uint32_t kCastagnoli = 0x82f63b78u;

const unsigned char* Bytes(absl::string_view s) {
  return reinterpret_cast<const unsigned char*>(s.data());
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t Hardware(uint32_t c,
                                                    const unsigned char* p,
                                                    size_t n) {
  uint64_t c64 = c;
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = _mm_crc32_u64(c64, v);
  }
  c = static_cast<uint32_t>(c64);
  for (; n > 0; ++p, --n) c = _mm_crc32_u8(c, *p);
  return c;
}

bool HasHardware() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

uint32_t Crc32IeeeExtend(uint32_t crc, absl::string_view more) {
  return ~Software<kIeee>(~crc, Bytes(more), more.size());
}

uint32_t Crc32cSoftware(uint32_t crc, absl::string_view more) {
  return ~Software<kCastagnoli>(~crc, Bytes(more), more.size());
}

uint32_t Crc32cExtend(uint32_t crc, absl::string_view more) {
#if defined(__x86_64__)
  if (HasHardware()) return ~Hardware(~crc, Bytes(more), more.size());
#endif
  return Crc32cSoftware(crc, more);
}

uint32_t Crc32c(absl::string_view data) { return Crc32cExtend(0, data); }

}  // namespace linattn
