#include "clients/common/shared_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace linattn {

absl::StatusOr<ClientSharedRegion> ClientSharedRegion::Create(
    const std::string& name, uint64_t bytes) {
  if (bytes == 0) {
    return absl::InvalidArgumentError("a shared-memory region of 0 bytes");
  }
  const int fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("memfd_create: ", std::strerror(errno)));
  }
  ClientSharedRegion region(fd, nullptr, bytes);
  // Every page allocated now (the server writes outputs only into memory
  // the client already has), then sealed at that size.
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
      posix_fallocate(fd, 0, static_cast<off_t>(bytes)) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    return absl::InternalError(
        absl::StrCat("sizing and sealing the memfd: ", std::strerror(errno)));
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("mapping the memfd: ", std::strerror(errno)));
  }
  region.base_ = base;
  return region;
}

ClientSharedRegion::ClientSharedRegion(ClientSharedRegion&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      base_(std::exchange(other.base_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

ClientSharedRegion& ClientSharedRegion::operator=(
    ClientSharedRegion&& other) noexcept {
  if (this != &other) {
    Release();
    fd_ = std::exchange(other.fd_, -1);
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

ClientSharedRegion::~ClientSharedRegion() { Release(); }

void ClientSharedRegion::Release() {
  if (base_ != nullptr) munmap(base_, size_);
  if (fd_ >= 0) close(fd_);
  base_ = nullptr;
  fd_ = -1;
}

std::string ClientSharedRegion::path() const {
  return absl::StrCat("/proc/", getpid(), "/fd/", fd_);
}

}  // namespace linattn
