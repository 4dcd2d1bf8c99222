#include "core/model/kv_cache.h"

#include <algorithm>
#include <atomic>
#include <cstring>

namespace linattn {

KvCache::KvCache(uint32_t kv_heads, uint32_t head_dim, uint32_t window)
    : row_(uint64_t{kv_heads} * head_dim),
      window_(window),
      ring_(window == 0 ? 0
                        : (uint64_t{window} + kKvBlockTokens - 1) /
                              kKvBlockTokens * kKvBlockTokens) {}

uint64_t KvCache::BlocksFor(uint64_t end) const {
  const uint64_t slots = ring_ == 0 ? end : std::min(end, ring_);
  return (slots + kKvBlockTokens - 1) / kKvBlockTokens;
}

uint64_t KvCache::FirstHeld(uint64_t end) const {
  return ring_ == 0 || end <= ring_ ? 0 : end - ring_;
}

void KvCache::Reserve(uint64_t end) {
  const uint64_t want = BlocksFor(end);
  const uint64_t floats = 2 * row_ * kKvBlockTokens;
  while (blocks_.size() < want) {
    blocks_.push_back(std::make_shared<float[]>(floats));
  }
}

uint64_t KvCache::shared_blocks() const {
  uint64_t n = 0;
  for (const auto& b : blocks_) n += b.use_count() > 1 ? 1 : 0;
  return n;
}

void KvCache::Write(uint64_t p, const float* key, const float* value) {
  const uint64_t s = Slot(p);
  std::shared_ptr<float[]>& block = blocks_[s / kKvBlockTokens];
  const bool shared = block.use_count() > 1;
  // use_count() is a relaxed load: a count of 1 left by another cache that
  // has just copied the block away must also order that copy's reads
  // before the writes below (caches sharing blocks may be written from
  // different threads at once, each by its own). GCC's ThreadSanitizer
  // refuses fences; `make test-tsan` runs the forward on one thread
  // (OMP_NUM_THREADS=1), so no two groups write at once there.
#ifndef __SANITIZE_THREAD__
  std::atomic_thread_fence(std::memory_order_acquire);
#endif
  if (shared) {
    // Shared with another cache: this one's own copy from now on.
    const uint64_t floats = 2 * row_ * kKvBlockTokens;
    std::shared_ptr<float[]> own(new float[floats]);
    std::memcpy(own.get(), block.get(), floats * sizeof(float));
    block = std::move(own);
  }
  float* at = block.get() + (s % kKvBlockTokens) * row_;
  std::memcpy(at, key, row_ * sizeof(float));
  std::memcpy(at + kValues * row_, value, row_ * sizeof(float));
}

}  // namespace linattn
