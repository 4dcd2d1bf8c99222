// What linattn-load sends, as a deterministic function of (seed, session,
// token) so that the verifier (clients/load/verify.h) rebuilds the same
// inputs: the input pool, the Prefill and Decode messages built from it,
// and each session's record of what the run did.
#ifndef LINATTN_CLIENTS_LOAD_INPUTS_H_
#define LINATTN_CLIENTS_LOAD_INPUTS_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "clients/common/shared_region.h"
#include "clients/load/options.h"
#include "core/attention/spec.h"
#include "linattn/v1/attention.pb.h"

namespace linattn {

// The inputs of every (session, token): rows of a pool of random tokens
// (uniform in [-1, 1], from the seed), row chosen by a hash of (session,
// token). The verifier rebuilds the same pool; filling a message is a copy,
// so the load generator spends its share of the cores on gRPC, not on
// random numbers.
class InputPool {
 public:
  static constexpr uint64_t kRows = 4096;

  // Rows of q, k (qk floats each), v (vv), and for the gated, delta and
  // RWKV rules gg log-gates in [−0.1, 0] (rwkv7: [−0.6065, 0]) and bb β in
  // [0, 1]; for rwkv7, a
  // and b (ab floats each) in RWKV-7's own form, a = −κ̂ and b = κ̂ ⊙ λ per
  // head with κ̂ a unit vector and λ in [0, 1] per channel.
  InputPool(uint64_t seed, const AttentionSpec& spec)
      : heads_(spec.num_heads),
        qk_(uint64_t{spec.num_heads} * spec.key_dim),
        vv_(uint64_t{spec.num_heads} * spec.value_dim),
        gg_(uint64_t{spec.num_heads} * GatesPerHead(spec)),
        bb_(HasBeta(spec.rule) ? spec.num_heads : 0),
        ab_(HasLowRank(spec.rule) ? qk_ : 0),
        row_(2 * qk_ + vv_ + gg_ + bb_ + 2 * ab_),
        data_(kRows * row_) {
    uint64_t x = seed * 0x9e3779b97f4a7c15ull;
    for (float& f : data_) {
      f = static_cast<float>(
          static_cast<double>(SplitMix(x) >> 40) / double(1ull << 23) - 1.0);
    }
    const uint64_t d = spec.key_dim;
    // RWKV-7's log-decays span −0.6065·σ(·) (fla's RWKV7Attention), wider
    // than the other rules' [−0.1, 0].
    const float gate_span = ab_ != 0 ? 0.5f * 0.6065307f : 0.05f;
    for (uint64_t r = 0; r < kRows; ++r) {
      float* row = data_.data() + r * row_ + 2 * qk_ + vv_;
      for (uint64_t i = 0; i < gg_; ++i) row[i] = -gate_span * (row[i] + 1.0f);
      for (uint64_t i = gg_; i < gg_ + bb_; ++i)
        row[i] = 0.5f * (row[i] + 1.0f);
      float* a = row + gg_ + bb_;
      float* b = a + ab_;
      for (uint64_t h = 0; h < (ab_ == 0 ? 0 : heads_); ++h) {
        double norm2 = 0;
        for (uint64_t c = 0; c < d; ++c)
          norm2 += double(a[h * d + c]) * a[h * d + c];
        const float inv = static_cast<float>(1.0 / std::sqrt(norm2));
        for (uint64_t c = 0; c < d; ++c) {
          const float kappa = a[h * d + c] * inv;
          a[h * d + c] = -kappa;
          b[h * d + c] = kappa * 0.5f * (b[h * d + c] + 1.0f);
        }
      }
    }
  }

  // Token `token` of session `session`: q, k (qk floats each), v (vv), and
  // its gates (gg), β (bb), a and b (ab each) where the rule takes them.
  void Token(uint32_t session, uint64_t token, float* q, float* k, float* v,
             float* g = nullptr, float* beta = nullptr, float* a = nullptr,
             float* b = nullptr) const {
    uint64_t x = (uint64_t(session) << 40) ^ token;
    const float* row = data_.data() + (SplitMix(x) % kRows) * row_;
    std::memcpy(q, row, qk_ * sizeof(float));
    std::memcpy(k, row + qk_, qk_ * sizeof(float));
    std::memcpy(v, row + 2 * qk_, vv_ * sizeof(float));
    const float* rest = row + 2 * qk_ + vv_;
    if (g != nullptr) std::memcpy(g, rest, gg_ * sizeof(float));
    if (beta != nullptr) std::memcpy(beta, rest + gg_, bb_ * sizeof(float));
    if (a != nullptr) std::memcpy(a, rest + gg_ + bb_, ab_ * sizeof(float));
    if (b != nullptr) {
      std::memcpy(b, rest + gg_ + bb_ + ab_, ab_ * sizeof(float));
    }
  }
  uint64_t heads() const { return heads_; }
  uint64_t qk() const { return qk_; }
  uint64_t vv() const { return vv_; }
  uint64_t gg() const { return gg_; }
  uint64_t bb() const { return bb_; }
  uint64_t ab() const { return ab_; }

 private:
  static uint64_t SplitMix(uint64_t& x) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

  const uint64_t heads_, qk_, vv_, gg_, bb_, ab_, row_;
  std::vector<float> data_;
};

// Room for `n` floats of one tensor in the form `bytes` says: the
// "<name>_bytes" string (packed little-endian float32) or the repeated
// field, sized once.
float* TensorRoom(bool bytes, uint64_t n,
                  google::protobuf::RepeatedField<float>* floats,
                  std::string* packed);

// A response tensor in whichever form it came: the repeated field, or the
// bytes (packed little-endian float32) beside it.
std::span<const float> TensorOf(
    const google::protobuf::RepeatedField<float>& floats,
    const std::string& packed);

// Where a Prefill's tensors sit in a unit's shared-memory region: q, k, v,
// g, beta, a, b, output, denominator one after another (bytes).
struct SharedLayout {
  uint64_t q, k, v, g, beta, a, b, output, denominator, end;
};
SharedLayout SharedLayoutOf(const InputPool& pool, uint64_t T);

// The Prefill request of session s's first `tokens` inputs; with `region`,
// the tensors go there (shared_memory) instead of into the message.
void BuildPrefill(const LoadOptions& o, const InputPool& pool, uint32_t s,
                  const std::string& id, const ClientSharedRegion* region,
                  v1::PrefillRequest* request);

// Fills a DecodeRequest with token `token` of session s.
// With `expect`, the step names the position it follows (token), so a
// step resent after a failover is never applied twice.
void FillStep(const InputPool& pool, uint32_t s, const std::string& id,
              uint64_t token, bool expect, bool bytes,
              v1::DecodeRequest* request);

// One session of a run: written by the driver (clients/load/driver.h),
// read by the verifier and the ledger.
struct SessionRecord {
  std::string id;
  uint32_t index = 0;  // whose inputs it gets (InputPool's session)
  // Its position when the run began (resumed sessions), plus the steps a
  // failover found applied without their answer.
  uint64_t start = 0;
  uint64_t steps_done = 0;
  // Failover: a step landed without its answer, so its output is missing
  // from `outputs` (the state is still checked, with --check).
  bool gap = false;
  bool prefilled = false;
  std::vector<float> outputs;  // steps_done × H × d_v (sampled sessions only)
};

}  // namespace linattn

#endif  // LINATTN_CLIENTS_LOAD_INPUTS_H_
