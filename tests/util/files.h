// Whole files in and out, for tests that write and damage files.
#ifndef LINATTN_TESTS_UTIL_FILES_H_
#define LINATTN_TESTS_UTIL_FILES_H_

#include <fstream>
#include <iterator>
#include <string>

namespace linattn::testing {

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
}

inline void WriteFile(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << data;
}

}  // namespace linattn::testing

#endif  // LINATTN_TESTS_UTIL_FILES_H_
