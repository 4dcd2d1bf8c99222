// AlignedBuffer: an owning, 64-byte-aligned, zero-initialised float array.
//
// Used for recurrent state and kernel workspaces, where rows are streamed
// with wide vector loads. Copying is explicit (Copy()) so the cost of
// duplicating a state block is visible at the call site.
#ifndef LINATTN_CORE_UTIL_ALIGNED_BUFFER_H_
#define LINATTN_CORE_UTIL_ALIGNED_BUFFER_H_

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <utility>

namespace linattn {

inline constexpr std::size_t kBufferAlignment = 64;  // one cache line / zmm

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // Allocates `size` floats, all zero. Throws std::bad_alloc on failure.
  explicit AlignedBuffer(std::size_t size) : size_(size) {
    if (size == 0) return;
    Allocate();
    std::memset(data_.get(), 0, RoundUp(size * sizeof(float)));
  }
  // A moved-from buffer is empty (size 0), as a default one.
  AlignedBuffer(AlignedBuffer&& other) noexcept
      : data_(std::move(other.data_)), size_(other.size_) {
    other.size_ = 0;
  }
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept {
    data_ = std::move(other.data_);
    size_ = other.size_;
    if (&other != this) other.size_ = 0;
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  // A deep copy; O(size). Its bytes are written once: the copy's padding
  // (zero, as every buffer's) is copied with the floats.
  AlignedBuffer Copy() const {
    AlignedBuffer out;
    out.size_ = size_;
    if (size_ != 0) {
      out.Allocate();
      std::memcpy(out.data(), data(), RoundUp(size_ * sizeof(float)));
    }
    return out;
  }

  // Grows (never shrinks) to at least `size` floats; contents are not kept.
  void EnsureSize(std::size_t size) {
    if (size > size_) *this = AlignedBuffer(size);
  }

  float* data() { return data_.get(); }
  const float* data() const { return data_.get(); }
  std::size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  // size_ floats (rounded up to the alignment), not yet written.
  void Allocate() {
    void* p =
        std::aligned_alloc(kBufferAlignment, RoundUp(size_ * sizeof(float)));
    if (p == nullptr) throw std::bad_alloc();
    data_.reset(static_cast<float*>(p));
  }
  static std::size_t RoundUp(std::size_t bytes) {
    return (bytes + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;
  }

  std::unique_ptr<float[], Free> data_;
  std::size_t size_ = 0;
};

}  // namespace linattn

#endif  // LINATTN_CORE_UTIL_ALIGNED_BUFFER_H_
