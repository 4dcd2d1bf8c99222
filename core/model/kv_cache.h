// KvCache: one softmax-attention layer's keys and values of one session
// (a hybrid model's, config.h SoftmaxAttention), kept in fixed-size blocks
// of kKvBlockTokens positions.
//
// Position p lives in slot p (full attention: the cache grows by a block
// every kKvBlockTokens positions) or, with a window of w, in slot
// p mod R, R = w rounded up to whole blocks: a ring that never holds more
// than R positions, so a windowed layer's memory stays fixed at any context
// length. Each slot holds the position's key, rotary applied, and its value
// for every key/value head (num_kv_heads × head_dim floats each).
#ifndef LINATTN_CORE_MODEL_KV_CACHE_H_
#define LINATTN_CORE_MODEL_KV_CACHE_H_

#include <cstdint>
#include <memory>
#include <vector>

namespace linattn {

inline constexpr uint32_t kKvBlockTokens = 64;

class KvCache {
 public:
  KvCache() = default;
  // `window` 0 = full attention.
  KvCache(uint32_t kv_heads, uint32_t head_dim, uint32_t window);
  KvCache(KvCache&&) noexcept = default;
  KvCache& operator=(KvCache&&) noexcept = default;

  KvCache Copy() const;

  uint32_t window() const { return window_; }
  // Floats of one position's key (and of its value).
  uint64_t row_floats() const { return row_; }
  // Bytes of one block (keys and values).
  uint64_t block_bytes() const { return 2 * row_ * kKvBlockTokens * 4; }
  // Blocks a cache holding positions [0, end) needs.
  uint64_t BlocksFor(uint64_t end) const;
  // Allocates the blocks positions [0, end) need (end may only grow).
  void Reserve(uint64_t end);
  uint64_t blocks() const { return keys_.size(); }
  uint64_t bytes() const { return blocks() * block_bytes(); }

  // Position p's key and value rows; p's block must be reserved, and with a
  // window only the last R positions written are there.
  float* key(uint64_t p) { return Row(keys_, p); }
  float* value(uint64_t p) { return Row(values_, p); }
  const float* key(uint64_t p) const { return Row(keys_, p); }
  const float* value(uint64_t p) const { return Row(values_, p); }

 private:
  uint64_t Slot(uint64_t p) const { return ring_ == 0 ? p : p % ring_; }
  float* Row(const std::vector<std::unique_ptr<float[]>>& blocks,
             uint64_t p) const {
    const uint64_t s = Slot(p);
    return blocks[s / kKvBlockTokens].get() + (s % kKvBlockTokens) * row_;
  }

  uint64_t row_ = 0;
  uint32_t window_ = 0;
  uint64_t ring_ = 0;  // R, or 0 for full attention
  std::vector<std::unique_ptr<float[]>> keys_, values_;
};

}  // namespace linattn

#endif  // LINATTN_CORE_MODEL_KV_CACHE_H_
