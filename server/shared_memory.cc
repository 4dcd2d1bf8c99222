#include "server/shared_memory.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace linattn {

namespace {

// A memfd's link in /proc reads "/memfd:NAME (deleted)".
constexpr absl::string_view kMemfdLink = "/memfd:";

absl::Status Errno(absl::string_view field, const std::string& path,
                   absl::string_view what, int err) {
  const std::string message =
      absl::StrCat(field, ": ", path, ": ", what, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    default:
      return absl::InvalidArgumentError(message);
  }
}

// Where a link points; false with errno set.
bool LinkTarget(const std::string& link, std::string* target) {
  char buffer[PATH_MAX];
  const ssize_t n = readlink(link.c_str(), buffer, sizeof(buffer));
  if (n < 0) return false;
  target->assign(buffer, static_cast<size_t>(n));
  return true;
}

absl::Status CheckName(absl::string_view field, const std::string& path,
                       const std::string& target) {
  if (!absl::StartsWith(target, kMemfdLink) ||
      !absl::StartsWith(absl::string_view(target).substr(kMemfdLink.size()),
                        kSharedRegionNamePrefix)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", path, " is ", target, ", not a memfd named ",
                     kSharedRegionNamePrefix,
                     "… (open the client's memfd as /proc/<pid>/fd/<fd>)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SharedRegion> SharedRegion::Open(absl::string_view field,
                                                const std::string& path) {
  if (path.empty() || path.size() >= PATH_MAX ||
      path.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        field,
        ": expected the path of the client's memfd (/proc/<pid>/fd/<fd>)"));
  }
  // The name first, so that nothing but a memfd is ever opened (opening a
  // device can have effects of its own).
  std::string target;
  if (!LinkTarget(path, &target)) {
    return Errno(field, path, "not a link to a memfd", errno);
  }
  if (absl::Status s = CheckName(field, path, target); !s.ok()) return s;
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return Errno(field, path, "cannot open it", errno);
  SharedRegion region(fd, 0);
  // And again on what was opened: the client's fd may have changed since.
  if (!LinkTarget(absl::StrCat("/proc/self/fd/", fd), &target)) {
    return Errno(field, path, "cannot read what it opened", errno);
  }
  if (absl::Status s = CheckName(field, path, target); !s.ok()) return s;
  struct stat st;
  if (fstat(fd, &st) != 0) return Errno(field, path, "fstat", errno);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", path, " is not a memfd"));
  }
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) return Errno(field, path, "F_GET_SEALS", errno);
  if ((seals & F_SEAL_SHRINK) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", path,
        " is not sealed against shrinking: create it with MFD_ALLOW_SEALING, "
        "size it, then add F_SEAL_SHRINK (a region that could shrink while "
        "the server reads it is refused)"));
  }
  int write_seals = F_SEAL_WRITE;
#ifdef F_SEAL_FUTURE_WRITE
  write_seals |= F_SEAL_FUTURE_WRITE;
#endif
  if ((seals & write_seals) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", path,
                     " is sealed against writes; the outputs are written "
                     "into the region"));
  }
  region.size_ = static_cast<uint64_t>(st.st_size);
  return region;
}

SharedRegion::SharedRegion(SharedRegion&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), size_(other.size_) {}

SharedRegion& SharedRegion::operator=(SharedRegion&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
  }
  return *this;
}

SharedRegion::~SharedRegion() {
  if (fd_ >= 0) close(fd_);
}

absl::Status SharedRegion::CheckRange(absl::string_view field, uint64_t offset,
                                      uint64_t bytes) const {
  if (offset % sizeof(float) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", offset, " is not a multiple of 4 (float32 values)"));
  }
  if (offset > size_ || bytes > size_ - offset) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", bytes, " bytes from offset ", offset,
                     " pass the region's end (", size_, " bytes)"));
  }
  return absl::OkStatus();
}

namespace {

// One thread's part of a copy between the region and a buffer: pread or
// pwrite until done.
absl::Status Transfer(int fd, bool write, uint64_t offset, uint64_t bytes,
                      char* buffer) {
  while (bytes > 0) {
    const ssize_t n =
        write ? pwrite(fd, buffer, bytes, static_cast<off_t>(offset))
              : pread(fd, buffer, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::InternalError(absl::StrCat(
          write ? "writing" : "reading", " the shared-memory region: ",
          n == 0 ? "it ended early" : std::strerror(errno)));
    }
    buffer += n;
    offset += static_cast<uint64_t>(n);
    bytes -= static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

// The kernel copies a memfd's pages one thread at a time (about 3.5 GB/s
// on the 2-core VM the project measures on); a large copy goes as two
// halves on two threads, which nearly halves it when a core is free.
constexpr uint64_t kSplitBytes = uint64_t{4} << 20;

absl::Status Copy(int fd, bool write, uint64_t offset, uint64_t bytes,
                  char* buffer) {
  if (bytes < kSplitBytes || std::thread::hardware_concurrency() < 2) {
    return Transfer(fd, write, offset, bytes, buffer);
  }
  const uint64_t first = (bytes / 2) & ~uint64_t{4095};
  absl::Status second;
  std::thread helper;
  try {
    helper = std::thread([&] {
      second =
          Transfer(fd, write, offset + first, bytes - first, buffer + first);
    });
  } catch (const std::system_error&) {  // no thread to be had: one goes
    return Transfer(fd, write, offset, bytes, buffer);
  }
  absl::Status status = Transfer(fd, write, offset, first, buffer);
  helper.join();
  return status.ok() ? second : status;
}

}  // namespace

absl::Status SharedRegion::Read(uint64_t offset, uint64_t bytes,
                                void* to) const {
  return Copy(fd_, /*write=*/false, offset, bytes, static_cast<char*>(to));
}

absl::Status SharedRegion::Write(uint64_t offset, uint64_t bytes,
                                 const void* from) const {
  // pwrite only reads the buffer.
  return Copy(fd_, /*write=*/true, offset, bytes,
              const_cast<char*>(static_cast<const char*>(from)));
}

}  // namespace linattn
