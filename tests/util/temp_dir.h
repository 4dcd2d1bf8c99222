// A fresh directory for the running test, removed when the object goes away:
// /tmp/linattn_<pid>_<suite>_<test>, so parallel ctest runs never collide.
#ifndef LINATTN_TESTS_UTIL_TEMP_DIR_H_
#define LINATTN_TESTS_UTIL_TEMP_DIR_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace linattn::testing {

class TempDir {
 public:
  TempDir() {
    const ::testing::TestInfo* info =
        ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            ("linattn_" + std::to_string(::getpid()) + "_" +
             info->test_suite_name() + "_" + info->name());
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // The path of `name` inside the directory.
  std::string Path(const std::string& name) const {
    return (path_ / name).string();
  }

 private:
  std::filesystem::path path_;
};

}  // namespace linattn::testing

#endif  // LINATTN_TESTS_UTIL_TEMP_DIR_H_
