#include "core/session/state_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace linattn {

absl::StatusOr<StateDirLock> StateDirLock::Acquire(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("state dir: creating ", dir, ": ", ec.message()));
  }
  const std::string path = (std::filesystem::path(dir) / "lock").string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("state dir: opening ", path, ": ", std::strerror(errno)));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    // The holder wrote its pid there (a hint for the message only).
    char buf[32] = {};
    const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
    ::close(fd);
    if (error != EWOULDBLOCK) {
      return absl::InternalError(absl::StrCat("state dir: locking ", path, ": ",
                                              std::strerror(error)));
    }
    uint64_t pid = 0;
    const bool named =
        n > 0 && absl::SimpleAtoi(absl::StripAsciiWhitespace(
                                      absl::string_view(buf, size_t(n))),
                                  &pid);
    return absl::FailedPreconditionError(absl::StrCat(
        "state dir: ", dir, " is in use by another linattn-server",
        named ? absl::StrCat(" (pid ", pid, ")") : std::string(),
        "; give each server its own --state-dir, or --state-dir none to "
        "keep sessions in memory only"));
  }
  const std::string pid = absl::StrCat(::getpid(), "\n");
  // Best effort: the lock is the flock, the pid only names its holder.
  if (::ftruncate(fd, 0) == 0) {
    [[maybe_unused]] const ssize_t w = ::pwrite(fd, pid.data(), pid.size(), 0);
  }
  return StateDirLock(fd);
}

StateDirLock& StateDirLock::operator=(StateDirLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

StateDirLock::~StateDirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor unlocks
}

}  // namespace linattn
