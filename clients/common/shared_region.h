#ifndef LINATTN_CLIENTS_COMMON_SHARED_REGION_H_
#define LINATTN_CLIENTS_COMMON_SHARED_REGION_H_

// A client's side of shared-memory tensors (PrefillRequest.shared_memory;
// docs/design.md, "Shared-memory tensors"): a memfd named "linattn…",
// sized and allocated once and sealed against shrinking and growing,
// mapped here. The
// client writes a Prefill's inputs into it and reads the outputs the server
// wrote after the call; the server opens it as path().

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace linattn {

class ClientSharedRegion {
 public:
  // `name` must begin with "linattn" (the server refuses other memfds).
  static absl::StatusOr<ClientSharedRegion> Create(const std::string& name,
                                                   uint64_t bytes);

  ClientSharedRegion(ClientSharedRegion&& other) noexcept;
  ClientSharedRegion& operator=(ClientSharedRegion&& other) noexcept;
  ClientSharedRegion(const ClientSharedRegion&) = delete;
  ClientSharedRegion& operator=(const ClientSharedRegion&) = delete;
  ~ClientSharedRegion();

  uint64_t size() const { return size_; }
  // The floats from byte `offset` on (a multiple of 4).
  float* floats(uint64_t offset) const {
    return reinterpret_cast<float*>(static_cast<char*>(base_) + offset);
  }
  // What the server opens: /proc/<this process>/fd/<the memfd>.
  std::string path() const;

 private:
  ClientSharedRegion(int fd, void* base, uint64_t size)
      : fd_(fd), base_(base), size_(size) {}
  void Release();
  int fd_ = -1;
  void* base_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace linattn

#endif  // LINATTN_CLIENTS_COMMON_SHARED_REGION_H_
