#include "core/util/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace linattn {

absl::Status ErrnoStatus(absl::string_view who, absl::string_view what,
                         const std::string& path, int err) {
  const std::string message =
      absl::StrCat(who, ": ", what, " ", path, ": ", std::strerror(err));
  if (err == ENOSPC || err == EDQUOT || err == EFBIG) {
    return absl::ResourceExhaustedError(message);
  }
  return absl::InternalError(message);
}

absl::Status WriteAll(absl::string_view who, int fd, absl::string_view data,
                      const std::string& path) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(who, "writing", path, errno);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::Status SyncDirectory(absl::string_view who, const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(who, "opening directory", dir, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoStatus(who, "syncing directory", dir, err);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadWholeFile(absl::string_view who,
                                          const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(who, "opening", path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus(who, "reading", path, err);
  }
  std::string data;
  // The size is a hint (the file may change while it is read): read until
  // the end, growing as needed.
  data.resize(static_cast<size_t>(std::max<off_t>(st.st_size, 0)) + 1);
  size_t have = 0;
  for (;;) {
    if (have == data.size()) data.resize(data.size() * 2);
    const ssize_t n = ::read(fd, data.data() + have, data.size() - have);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return ErrnoStatus(who, "reading", path, err);
    }
    if (n == 0) break;
    have += static_cast<size_t>(n);
  }
  ::close(fd);
  data.resize(have);
  return data;
}

}  // namespace linattn
