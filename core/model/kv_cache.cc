#include "core/model/kv_cache.h"

#include <algorithm>
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

void KvCache::Reserve(uint64_t end) {
  const uint64_t want = BlocksFor(end);
  const uint64_t floats = row_ * kKvBlockTokens;
  while (keys_.size() < want) {
    keys_.push_back(std::make_unique<float[]>(floats));
    values_.push_back(std::make_unique<float[]>(floats));
  }
}

KvCache KvCache::Copy() const {
  KvCache out;
  out.row_ = row_;
  out.window_ = window_;
  out.ring_ = ring_;
  const uint64_t floats = row_ * kKvBlockTokens;
  for (size_t b = 0; b < keys_.size(); ++b) {
    out.keys_.push_back(std::make_unique<float[]>(floats));
    out.values_.push_back(std::make_unique<float[]>(floats));
    std::memcpy(out.keys_[b].get(), keys_[b].get(), floats * sizeof(float));
    std::memcpy(out.values_[b].get(), values_[b].get(), floats * sizeof(float));
  }
  return out;
}

}  // namespace linattn
