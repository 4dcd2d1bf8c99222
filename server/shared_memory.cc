#include "server/shared_memory.h"

#include <fcntl.h>
#include <limits.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace linattn {

namespace {

// A memfd's link in /proc reads "/memfd:NAME (deleted)".
constexpr absl::string_view kMemfdLink = "/memfd:";

// Why a path is refused, without saying what is or is not there (a
// client learns nothing of other processes' files from the answer).
absl::Status NotARegion(absl::string_view field, const std::string& path) {
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": ", path, " is not a memfd named ", kSharedRegionNamePrefix,
      "… that this server can open; name the client's memfd as "
      "/proc/<pid>/fd/<fd>"));
}

// /proc/<pid>/fd/<fd>, with the pid; nothing else is opened at all.
bool ProcFdPath(const std::string& path, uint64_t* pid) {
  constexpr absl::string_view kProc = "/proc/";
  absl::string_view rest(path);
  if (!absl::ConsumePrefix(&rest, kProc)) return false;
  const size_t slash = rest.find('/');
  if (slash == absl::string_view::npos) return false;
  const absl::string_view pid_text = rest.substr(0, slash);
  rest.remove_prefix(slash);
  if (!absl::ConsumePrefix(&rest, "/fd/")) return false;
  auto digits = [](absl::string_view t) {
    return !t.empty() && t.size() <= 10 && t[0] != '0' &&
           std::all_of(t.begin(), t.end(),
                       [](char c) { return c >= '0' && c <= '9'; });
  };
  if (!digits(pid_text) || !(digits(rest) || rest == "0")) return false;
  return absl::SimpleAtoi(pid_text, pid);
}

// Where a link points; false when it cannot be read.
bool LinkTarget(const std::string& link, std::string* target) {
  char buffer[PATH_MAX];
  const ssize_t n = readlink(link.c_str(), buffer, sizeof(buffer));
  if (n < 0) return false;
  target->assign(buffer, static_cast<size_t>(n));
  return true;
}

bool NamedRegion(const std::string& target) {
  return absl::StartsWith(target, kMemfdLink) &&
         absl::StartsWith(absl::string_view(target).substr(kMemfdLink.size()),
                          kSharedRegionNamePrefix);
}

// Closes a descriptor when it goes.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

}  // namespace

absl::StatusOr<SharedRegion> SharedRegion::Open(absl::string_view field,
                                                const std::string& path) {
  uint64_t pid = 0;
  if (!ProcFdPath(path, &pid)) return NotARegion(field, path);
  // A region this server holds open for another call is not the client's
  // to name.
  if (pid == static_cast<uint64_t>(getpid())) return NotARegion(field, path);
  // O_PATH resolves the link without opening the file itself (no device's
  // or FUSE file system's open runs, nothing can block); what it resolved
  // to is checked through the descriptor, and only a memfd is then opened
  // for reading and writing, through that same descriptor.
  Fd located{open(path.c_str(), O_PATH | O_CLOEXEC)};
  if (located.fd < 0) return NotARegion(field, path);
  const std::string self = absl::StrCat("/proc/self/fd/", located.fd);
  std::string target;
  struct stat st;
  if (!LinkTarget(self, &target) || !NamedRegion(target) ||
      fstat(located.fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return NotARegion(field, path);
  }
  const int fd = open(self.c_str(), O_RDWR | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return NotARegion(field, path);
  SharedRegion region(fd, 0);
  struct stat opened;
  struct statfs fs;
  if (fstat(fd, &opened) != 0 || opened.st_dev != st.st_dev ||
      opened.st_ino != st.st_ino || fstatfs(fd, &fs) != 0 ||
      fs.f_type != TMPFS_MAGIC) {
    // (hugetlbfs memfds take no write(2): the outputs could not go back.)
    return NotARegion(field, path);
  }
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
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
  // All of it memory already, allocated by the client (fallocate, or
  // written once): the outputs then go into pages charged to the client,
  // not ones the server's writes would allocate.
  if (static_cast<uint64_t>(opened.st_blocks) * 512 <
      static_cast<uint64_t>(opened.st_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", path,
        " is not all allocated; allocate it once (posix_fallocate, or write "
        "every page) before naming it"));
  }
  region.size_ = static_cast<uint64_t>(opened.st_size);
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

// The kernel copies a memfd's pages one thread at a time (its rate:
// docs/benchmarks.md, "Measured figures behind constants in the code"); a
// large copy goes as two halves on two threads, which nearly halves it
// when a core is free.
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
    helper = std::thread([&]() noexcept {
      try {
        second =
            Transfer(fd, write, offset + first, bytes - first, buffer + first);
      } catch (...) {  // only an error message's allocation can throw
        second = absl::ResourceExhaustedError("out of memory");
      }
    });
  } catch (const std::system_error&) {  // no thread to be had: one goes
    return Transfer(fd, write, offset, bytes, buffer);
  }
  struct Joiner {  // joined whatever happens here
    std::thread& thread;
    ~Joiner() {
      if (thread.joinable()) thread.join();
    }
  } joiner{helper};
  absl::Status status = Transfer(fd, write, offset, first, buffer);
  if (!status.ok()) return status;
  helper.join();  // before `second` is read
  return second;
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
