// Fixed-width fields in byte strings, little-endian as every file and blob
// format of the project stores them (x86-64 and aarch64 hosts are
// little-endian, so the copy is the conversion).
#ifndef LINATTN_CORE_UTIL_LITTLE_ENDIAN_H_
#define LINATTN_CORE_UTIL_LITTLE_ENDIAN_H_

#include <cstring>
#include <string>

namespace linattn {

template <typename T>
void PutLittleEndian(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

template <typename T>
T GetLittleEndian(const char* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

}  // namespace linattn

#endif  // LINATTN_CORE_UTIL_LITTLE_ENDIAN_H_
