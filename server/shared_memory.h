#ifndef LINATTN_SERVER_SHARED_MEMORY_H_
#define LINATTN_SERVER_SHARED_MEMORY_H_

// A co-located client's memfd, opened for one Prefill whose tensors it
// holds (docs/design.md, "Shared-memory tensors"). The server reads the
// inputs out of it and writes the outputs into it with pread/pwrite, so
// nothing of the client's mapping is mapped here: what the client changes
// during the call cannot reach a check already made, and the region cannot
// shrink under the server (it is sealed against that).

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace linattn {

// What a region's memfd must be called: "linattn" and anything after.
inline constexpr absl::string_view kSharedRegionNamePrefix = "linattn";

class SharedRegion {
 public:
  // Opens `path`, which must read /proc/<pid>/fd/<fd> with a pid other
  // than this process's, and checks it: a memfd on tmpfs whose name begins
  // with kSharedRegionNamePrefix, all of it allocated, sealed with
  // F_SEAL_SHRINK and without F_SEAL_WRITE / F_SEAL_FUTURE_WRITE. The link is
  // resolved with O_PATH and checked through that descriptor before anything is
  // opened for reading or writing. Errors name `field` (the request's path
  // field) and say nothing of what the path holds when it is not such a memfd.
  static absl::StatusOr<SharedRegion> Open(absl::string_view field,
                                           const std::string& path);

  SharedRegion(SharedRegion&& other) noexcept;
  SharedRegion& operator=(SharedRegion&& other) noexcept;
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;
  ~SharedRegion();

  uint64_t size() const { return size_; }

  // [offset, offset + bytes) lies inside the region and offset is a
  // multiple of 4 (float32); errors name `field`.
  absl::Status CheckRange(absl::string_view field, uint64_t offset,
                          uint64_t bytes) const;
  // Copies a checked range out of the region, or into it (large ones on
  // two threads).
  absl::Status Read(uint64_t offset, uint64_t bytes, void* to) const;
  absl::Status Write(uint64_t offset, uint64_t bytes, const void* from) const;

 private:
  SharedRegion(int fd, uint64_t size) : fd_(fd), size_(size) {}
  int fd_ = -1;
  uint64_t size_ = 0;
};

}  // namespace linattn

#endif  // LINATTN_SERVER_SHARED_MEMORY_H_
