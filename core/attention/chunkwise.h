// The chunkwise evaluation order (prefill): many tokens of many sessions in
// a few large batched matmuls on oneDNN (docs/design.md §1). The gated and
// delta rules have their own forms (chunkwise_rules.cc), the rwkv7 rule its
// WY form (chunkwise_rwkv7.cc) or, as ChunkwiseOptions::rwkv7_order says,
// its recurrent kernel token by token (RunStepGroup); for the linear rule, per
// head, a chunk of L ≤ C rows with previous state S⁺ = [S | z]:
//   O⁺ = diag(γ^{i+1}) Q S⁺_prev + (Q Kᵀ ⊙ D) V⁺,   D_ij = γ^{i−j}[i ≥ j]
//   S⁺ ← γ^L S⁺_prev + (diag(γ^{L−1−j}) K)ᵀ V⁺
// with Q = φ(Q_chunk), K = φ(K_chunk), V⁺ = [V | 1]. The ones column is
// never materialised: its products are row sums.
//
// Every (session, head, chunk) of a round is one batch element, so the four
// products Q·Kᵀ, Kᵀ·V, Q·S_prev and A·V each run as one batched primitive
// over all sessions and heads. Only the state scan between chunks is
// sequential (O(d_φ·d_v) per chunk). A round runs as named passes: gather
// and map (the input read once: rows, φ, finiteness), intra-chunk products
// (A masked, ΔS), scan, inter-chunk terms (Q·S_prev, Q·z_prev), the
// intra-chunk values (A·V) and the read-out. With two gather units (an
// item's chunk, all heads) or more per thread, a round is one parallel
// region: each thread takes a unit from its gather through A, ΔS and A·V
// with the unit's keys, values and scores in its own scratch (a slice of
// the round's K, V and A buffers: the workspace is that of the passes),
// then after the scan through Q·S_prev and the read-out; oneDNN runs those
// batched products on the calling thread.
//
// With PrefillPrecision::kBf16 the linear rule's four products take
// bfloat16 operands (φ(Q), φ(K), V, the masked scores and S before the
// chunk, each rounded to nearest once) and accumulate in fp32; the state S/z,
// the denominators' dot products, φ, the mask and the read-out stay fp32.
// Its error bound is derived in docs/design.md §1 and held in
// tests/attention/evaluation_orders_test.cc. The gated and delta rules keep
// fp32 products (their chunks invert I + M, which would amplify bf16's
// rounding).
//
// A ChunkwiseRunner owns reusable workspaces: use one per thread.
#ifndef LINATTN_CORE_ATTENTION_CHUNKWISE_H_
#define LINATTN_CORE_ATTENTION_CHUNKWISE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/attention/attention.h"
#include "core/onednn/matmul.h"
#include "core/util/aligned_buffer.h"

namespace linattn {

// The gated rule with a gate per key channel scores a chunk in row blocks of
// at least kGateSubChunk rows. A block runs as one product through the
// cumulative log-gate of the row before it when every channel's gates span
// at most kGateSubChunkSpan inside it (factors up to e^8), and its diagonal
// block term by term with e^{b_i − b_j} otherwise (chunkwise_rules.cc).
inline constexpr uint32_t kGateSubChunk = 16;
inline constexpr float kGateSubChunkSpan = 8.0f;

// The operands of the linear rule's chunkwise products.
enum class PrefillPrecision { kF32, kBf16 };
// "f32" / "bf16".
const char* PrefillPrecisionName(PrefillPrecision precision);
// Parses "f32" or "bf16"; INVALID_ARGUMENT naming prefill_precision.
absl::StatusOr<PrefillPrecision> ParsePrefillPrecision(std::string_view name);
// OK when this CPU runs `precision`'s products natively (bf16: AVX512_BF16
// or AMX, as oneDNN sees it); FAILED_PRECONDITION saying what is missing.
absl::Status PrefillPrecisionSupported(PrefillPrecision precision);

// How a prefill evaluates the rwkv7 rule: its chunkwise WY form, its
// recurrent step token by token (both held to the same reference), or
// (kAuto) the chunkwise form from kRwkv7ChunkwiseKeyDim key channels up and
// the step below: at d_k = 64, RWKV-7's head size, the step's state stays
// in L1 and its prefill ran 1.4–1.6× faster than the WY form's extra products
// (docs/benchmarks.md, "RWKV-7").
enum class Rwkv7Order { kAuto, kChunkwise, kRecurrent };
inline constexpr uint32_t kRwkv7ChunkwiseKeyDim = 128;

struct ChunkwiseOptions {
  uint32_t chunk_size = 64;    // C, rows per chunk
  uint32_t round_chunks = 16;  // chunks per head per round (bounds workspace)
  PrefillPrecision precision = PrefillPrecision::kF32;
  Rwkv7Order rwkv7_order = Rwkv7Order::kAuto;

  // Whether an rwkv7 prefill of this spec runs the chunkwise form.
  bool Rwkv7Chunkwise(const AttentionSpec& spec) const {
    return rwkv7_order == Rwkv7Order::kChunkwise ||
           (rwkv7_order == Rwkv7Order::kAuto &&
            spec.key_dim >= kRwkv7ChunkwiseKeyDim);
  }
};

// One session's part of a prefill batch.
struct PrefillItem {
  const Attention* attention = nullptr;
  AttentionState* state = nullptr;
  SequenceInput in;
  SequenceOutput out;
};

// How a prefill's states change: all at once after every product succeeded
// (on error nothing has changed), or in place, for a caller that prefills
// its own working copies and drops them on error.
enum class PrefillCommit { kAllOrNothing, kInPlace };

class ChunkwiseRunner {
 public:
  explicit ChunkwiseRunner(ChunkwiseOptions options = {});
  ~ChunkwiseRunner();
  ChunkwiseRunner(ChunkwiseRunner&&) noexcept;
  ChunkwiseRunner& operator=(ChunkwiseRunner&&) noexcept;

  // Prefills every item and advances its position. Items may differ in spec
  // and length; those with equal (d_φ, d_v) share batched matmuls. Shapes
  // are validated before any state changes, values as the gather reads them
  // (the one pass over the input), and (kAllOrNothing) states are replaced
  // only after every product succeeded: on error nothing has changed. An
  // item whose input is not finite (INVALID_ARGUMENT naming items[i] and
  // the value) or whose state would leave fp32's range (OUT_OF_RANGE) fails
  // the Run; in place, `refused` (one status per item) instead receives its
  // status, its working state is garbage for the caller to drop, and the
  // other items complete. With PrefillPrecision::kBf16 on a CPU without
  // native bf16 products every Run fails (FAILED_PRECONDITION, see
  // PrefillPrecisionSupported), whatever its items' rules.
  absl::Status Run(std::span<const PrefillItem> items,
                   PrefillCommit mode = PrefillCommit::kAllOrNothing,
                   std::span<absl::Status> refused = {});
  absl::Status Run(const Attention& attention, AttentionState& state,
                   const SequenceInput& in, const SequenceOutput& out);

  // Workspace one (session, head, chunk) job of a round holds with these
  // widths; a round runs at most round_chunks jobs per (session, head), and
  // the workspace is kept for the next Run (it only grows).
  // bf16 operands add their own copies (2 bytes each) of φ(Q), φ(K), the
  // decayed keys, V, the scores and S before the chunk.
  uint64_t WorkspaceBytesPerJob(uint32_t d_phi, uint32_t d_v) const {
    const uint64_t C = options_.chunk_size;
    const uint64_t per_job_f32 =
        sizeof(float) * (C * (3 * uint64_t{d_phi} + 2 * uint64_t{d_v} + C + 2) +
                         uint64_t{d_phi} * d_v + d_phi);
    if (options_.precision != PrefillPrecision::kBf16) return per_job_f32;
    return per_job_f32 +
           sizeof(uint16_t) *
               (C * (3 * uint64_t{d_phi} + d_v + C) + uint64_t{d_phi} * d_v);
  }
  // The same for the gated and delta rules (chunkwise_rules.cc) and the
  // rwkv7 rule (chunkwise_rwkv7.cc), whose rounds hold more per job; and
  // for whichever rule `spec` has.
  uint64_t RuleWorkspaceBytesPerJob(uint32_t d_k, uint32_t d_v) const;
  uint64_t Rwkv7WorkspaceBytesPerJob(uint32_t d_k, uint32_t d_v) const;
  uint64_t WorkspaceBytesPerJob(const AttentionSpec& spec) const {
    switch (spec.rule) {
      case UpdateRule::kLinear:
        return WorkspaceBytesPerJob(FeatureDim(spec), spec.value_dim);
      case UpdateRule::kRwkv7:  // the recurrent order holds none
        return options_.Rwkv7Chunkwise(spec)
                   ? Rwkv7WorkspaceBytesPerJob(spec.key_dim, spec.value_dim)
                   : 0;
      default:
        return RuleWorkspaceBytesPerJob(spec.key_dim, spec.value_dim);
    }
  }
  // Workspace bytes held for the linear rule's rounds.
  uint64_t workspace_bytes() const {
    return sizeof(float) *
           (q_.size() + k_.size() + kd_.size() + v_.size() + a_.size() +
            o_.size() + s_.size() + z_.size() + den_.size() + qlog_.size() +
            q16_.size() + k16_.size() + kd16_.size() + v16_.size() +
            a16_.size() + s16_.size());
  }

  // Matmul FLOPs executed by the last Run (for benchmarks).
  double last_matmul_flops() const { return last_flops_; }
  // Rounds of the last Run that ran as one parallel region (FusedRound),
  // and all its rounds (for tests and benchmarks).
  uint64_t last_fused_rounds() const { return last_fused_rounds_; }
  uint64_t last_rounds() const { return last_rounds_; }
  const ChunkwiseOptions& options() const { return options_; }

 private:
  struct Stream;
  struct Job;
  struct Round;
  // One group (items of equal d_φ, d_v) in rounds of at most round_chunks
  // chunks per head. Sets non_finite[i] for an item whose input holds NaN
  // or Inf (it runs no further rounds; its state is garbage), and with
  // `stop_at_non_finite` returns at once.
  absl::Status RunGroup(std::span<const PrefillItem> items,
                        std::span<AttentionState* const> work,
                        const std::vector<uint32_t>& members,
                        std::span<uint8_t> non_finite, bool stop_at_non_finite);
  // One group of gated or delta-rule items (equal rule, gate shape, d_k and
  // d_v), chunk by chunk (chunkwise_rules.cc); the same contract as
  // RunGroup.
  struct RuleWorkspace;
  absl::Status RunRuleGroup(std::span<const PrefillItem> items,
                            std::span<AttentionState* const> work,
                            const std::vector<uint32_t>& members,
                            std::span<uint8_t> non_finite,
                            bool stop_at_non_finite);
  // One group of rwkv7 items (equal d_k, d_v, head count, preparation of
  // q and k) in its chunkwise WY form (chunkwise_rwkv7.cc); the same
  // contract as RunGroup.
  struct Rwkv7Workspace;
  absl::Status RunRwkv7Group(std::span<const PrefillItem> items,
                             std::span<AttentionState* const> work,
                             const std::vector<uint32_t>& members,
                             std::span<uint8_t> non_finite,
                             bool stop_at_non_finite);
  // One group of rwkv7 items, token by token through the recurrent kernel
  // (StepSequence) on the working states; the same contract as RunGroup,
  // and an item refused for another reason (its state would overflow) is
  // reported in `failed` instead.
  absl::Status RunStepGroup(std::span<const PrefillItem> items,
                            std::span<AttentionState* const> work,
                            const std::vector<uint32_t>& members,
                            std::span<uint8_t> non_finite,
                            std::span<absl::Status> failed,
                            bool stop_at_non_finite);
  // A round's passes (the formulas are in the file comment). A unit is one
  // item's chunk with all its heads (consecutive jobs): gathered together,
  // and in a fused round (FusedRound: one parallel region, a unit or more
  // per thread) multiplied by the thread that gathered it.
  void PlanStreams(Round& r, const std::vector<uint32_t>& members) const;
  bool PlanChunks(Round& r, std::span<const uint8_t> non_finite) const;
  void MapWorkspaces(Round& r);
  struct UnitBlocks;  // a unit's keys, values and scores
  absl::Status FusedRound(Round& r, int threads, bool stop_at_non_finite);
  UnitBlocks RoundBlocks(const Round& r, uint32_t first_job) const;
  void GatherUnit(Round& r, int64_t unit, const UnitBlocks& b);
  void MarkNonFinite(const Round& r, std::span<uint8_t> non_finite) const;
  void FinishKeys(const Round& r, uint32_t job, const float* k,
                  float* kd) const;
  void ShiftFavorKeys(Round& r);
  void FavorKeys(const Round& r, uint32_t job) const;
  absl::Status IntraChunkProducts(Round& r);
  absl::Status UnitFront(const Round& r, int64_t unit,
                         const UnitBlocks& b) const;
  void MaskScores(const Round& r, uint32_t job, float* a) const;
  void ScanStream(const Round& r, int64_t stream) const;
  absl::Status InterChunk(Round& r);
  void InterChunkTerms(const Round& r, uint32_t job) const;
  absl::Status AddIntraChunkValues(Round& r);
  absl::Status UnitBack(const Round& r, int64_t unit,
                        const UnitBlocks& b) const;
  void ReadOutUnit(const Round& r, int64_t unit) const;
  // `batch` products of `shape` (its batch field ignored) on packed
  // buffers, run as primitives of power-of-two batch so that the number of
  // cached shapes stays small.
  template <typename In>
  absl::Status Gemm(MatmulShape shape, int64_t batch, const In* a, const In* b,
                    float* c);
  // bf16 rounds, pass by pass: a job's operands rounded to bf16.
  void RoundInputs(const Round& r, uint32_t job) const;

  ChunkwiseOptions options_;
  double last_flops_ = 0;
  uint64_t last_fused_rounds_ = 0;
  uint64_t last_rounds_ = 0;
  // Round workspaces, (jobs, ...) each; grown on demand, reused.
  AlignedBuffer q_;  // (jobs, C, d_φ)  φ(Q) rows
  AlignedBuffer k_;  // (jobs, C, d_φ)  φ(K) rows
  AlignedBuffer kd_;  // (jobs, C, d_φ)  diag(γ^{L−1−j})·φ(K) (decay only)
  AlignedBuffer v_;     // (jobs, C, d_v)
  AlignedBuffer a_;     // (jobs, C, C)    masked Q·Kᵀ
  AlignedBuffer o_;     // (jobs, C, d_v)  numerators
  AlignedBuffer s_;     // (jobs, d_φ, d_v) ΔS, then S before the chunk
  AlignedBuffer z_;     // (jobs, d_φ)      Δz, then z before the chunk
  AlignedBuffer den_;   // (jobs, C)       denominators
  AlignedBuffer qlog_;  // (jobs, C)       FAVOR+ query log-scales
  // bf16 rounds: the products' operands, 2 bytes each (sizes in floats).
  AlignedBuffer q16_;   // (jobs, C, d_φ)   φ(Q) (fused: thread scratch)
  AlignedBuffer k16_;   // (jobs, C, d_φ)   φ(K)
  AlignedBuffer kd16_;  // (jobs, C, d_φ)   decayed φ(K) (decay only)
  AlignedBuffer v16_;   // (jobs, C, d_v)
  AlignedBuffer a16_;   // (jobs, C, C)     masked scores
  AlignedBuffer s16_;   // (jobs, d_φ, d_v) S before the chunk
  std::vector<uint8_t> unit_bad_;         // per gather unit: a non-finite input
  std::unique_ptr<RuleWorkspace> rules_;  // the gated and delta rules'
  std::unique_ptr<Rwkv7Workspace> rwkv7_;  // the rwkv7 rule's
};

}  // namespace linattn

#endif  // LINATTN_CORE_ATTENTION_CHUNKWISE_H_
