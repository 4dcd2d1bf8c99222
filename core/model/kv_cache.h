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
//
// Blocks are shared copy-on-write: Copy() (a fork, a backup before a
// request, a step into another state) shares every block, and the first
// write to a shared block gives the writer its own copy of that block
// alone, so a copy costs O(blocks), not O(context). Copies may be read from
// different threads at once, and caches sharing blocks written from
// different threads at once; one cache is written by one thread at a time.
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

  // A cache sharing every block with this one.
  KvCache Copy() const { return KvCache(*this); }

  uint32_t window() const { return window_; }
  // Floats of one position's key (and of its value).
  uint64_t row_floats() const { return row_; }
  // Bytes of one block (keys and values).
  uint64_t block_bytes() const { return 2 * row_ * kKvBlockTokens * 4; }
  // Blocks a cache holding positions [0, end) needs.
  uint64_t BlocksFor(uint64_t end) const;
  // The positions of [0, end) a cache at `end` still holds: [first, end).
  uint64_t FirstHeld(uint64_t end) const;
  // Allocates the blocks positions [0, end) need (end may only grow).
  void Reserve(uint64_t end);
  uint64_t blocks() const { return blocks_.size(); }
  uint64_t bytes() const { return blocks() * block_bytes(); }
  // Blocks this cache shares with another.
  uint64_t shared_blocks() const;

  // Position p's key and value rows, to read; p's block must be reserved,
  // and with a window only the last R positions written are there.
  const float* key(uint64_t p) const { return Row(p); }
  const float* value(uint64_t p) const { return Row(p) + kValues * row_; }
  // Writes position p's key and value (row_floats() each), first copying
  // its block if another cache shares it.
  void Write(uint64_t p, const float* key, const float* value);

 private:
  // Copies share blocks: only through Copy(), so that no copy is implicit.
  KvCache(const KvCache&) = default;
  // A block: kKvBlockTokens keys, then kKvBlockTokens values.
  static constexpr uint64_t kValues = kKvBlockTokens;
  uint64_t Slot(uint64_t p) const { return ring_ == 0 ? p : p % ring_; }
  const float* Row(uint64_t p) const {
    const uint64_t s = Slot(p);
    return blocks_[s / kKvBlockTokens].get() + (s % kKvBlockTokens) * row_;
  }

  uint64_t row_ = 0;
  uint32_t window_ = 0;
  uint64_t ring_ = 0;  // R, or 0 for full attention
  std::vector<std::shared_ptr<float[]>> blocks_;
};

}  // namespace linattn

#endif  // LINATTN_CORE_MODEL_KV_CACHE_H_
