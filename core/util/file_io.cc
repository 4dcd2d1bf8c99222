#include "core/util/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

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
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return absl::InternalError(absl::StrCat(who, ": cannot read ", path));
  std::string data((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  if (in.bad()) {
    return absl::InternalError(absl::StrCat(who, ": cannot read ", path));
  }
  return data;
}

}  // namespace linattn
