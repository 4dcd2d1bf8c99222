#include "core/attention/chunkwise.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/attention/chunkwise_round.h"
#include "core/attention/kernels.h"
#include "core/attention/recurrent.h"
#include "core/util/row_view.h"
#include "core/util/status_macros.h"

namespace linattn {

namespace {
constexpr uint32_t kMaxChunk = 4096;
}  // namespace

const char* PrefillPrecisionName(PrefillPrecision precision) {
  return precision == PrefillPrecision::kBf16 ? "bf16" : "f32";
}

absl::StatusOr<PrefillPrecision> ParsePrefillPrecision(std::string_view name) {
  if (name == "f32") return PrefillPrecision::kF32;
  if (name == "bf16") return PrefillPrecision::kBf16;
  return absl::InvalidArgumentError(
      absl::StrCat("prefill_precision: must be f32 or bf16, got \"",
                   std::string(name), "\""));
}

absl::Status PrefillPrecisionSupported(PrefillPrecision precision) {
  if (precision == PrefillPrecision::kF32 || NativeBf16Products()) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      "prefill_precision: bf16 needs a CPU with AVX512_BF16 or AMX (oneDNN's "
      "effective ISA here has neither); use f32");
}

absl::Status ChunkwiseRunner::Run(const Attention& attention,
                                  AttentionState& state,
                                  const SequenceInput& in,
                                  const SequenceOutput& out) {
  PrefillItem item{&attention, &state, in, out};
  return Run({&item, 1});
}

template <typename In>
absl::Status ChunkwiseRunner::Gemm(MatmulShape shape, int64_t batch,
                                   const In* a, const In* b, float* c) {
  LINATTN_RETURN_IF_ERROR(BatchedPieces(shape, batch, a, b, c));
  shape.batch = batch;
  last_flops_ += shape.Flops();
  return absl::OkStatus();
}
// (chunkwise_rules.cc runs fp32 products through it too.)
template absl::Status ChunkwiseRunner::Gemm<float>(MatmulShape, int64_t,
                                                   const float*, const float*,
                                                   float*);
template absl::Status ChunkwiseRunner::Gemm<uint16_t>(MatmulShape, int64_t,
                                                      const uint16_t*,
                                                      const uint16_t*, float*);

absl::Status ChunkwiseRunner::Run(std::span<const PrefillItem> items,
                                  PrefillCommit mode,
                                  std::span<absl::Status> refused) {
  last_flops_ = 0;
  last_fused_rounds_ = 0;
  last_rounds_ = 0;
  if (options_.chunk_size == 0 || options_.chunk_size > kMaxChunk) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_size: must be in [1, ", kMaxChunk, "], got ",
                     options_.chunk_size));
  }
  if (options_.round_chunks == 0) {
    return absl::InvalidArgumentError("round_chunks: must be at least 1");
  }
  LINATTN_RETURN_IF_ERROR(PrefillPrecisionSupported(options_.precision));
  std::vector<const AttentionState*> seen;
  for (size_t i = 0; i < items.size(); ++i) {
    const PrefillItem& item = items[i];
    if (item.attention == nullptr || item.state == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("items[", i, "]: attention and state are required"));
    }
    // Finiteness is checked row by row in the gather pass (the input is read
    // there anyway); no state is committed before it has passed.
    absl::Status s = item.attention->ValidateInput(*item.state, item.in,
                                                   /*check_values=*/false);
    if (s.ok() && item.in.tokens != 0 &&
        (item.out.output == nullptr || item.out.denominator == nullptr ||
         item.out.available == nullptr)) {
      s = absl::InvalidArgumentError("out: output buffers missing");
    }
    if (!s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("items[", i, "].", s.message()));
    }
    seen.push_back(item.state);
  }
  std::sort(seen.begin(), seen.end());
  if (std::adjacent_find(seen.begin(), seen.end()) != seen.end()) {
    return absl::InvalidArgumentError(
        "items: the same state appears twice in one prefill batch");
  }

  // Work on copies; commit only once every product has succeeded. In place,
  // the caller holds the copies (and drops them on error).
  std::vector<AttentionState> copies;
  std::vector<AttentionState*> work;
  work.reserve(items.size());
  try {
    if (mode == PrefillCommit::kAllOrNothing) {
      copies.reserve(items.size());
      for (const PrefillItem& item : items) {
        copies.push_back(item.state->Copy());
      }
      for (AttentionState& copy : copies) work.push_back(&copy);
    } else {
      for (const PrefillItem& item : items) work.push_back(item.state);
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        "memory: allocating the working copies of a prefill failed");
  }

  // Items share products when their rule, gate shape and widths agree; the
  // gated and delta rules' rounds also take one head count and one
  // preparation of q and k (L2 norm, scale) for the whole group, while the
  // linear rule's carry each item's own spec per stream.
  std::map<std::tuple<UpdateRule, GateShape, uint32_t, uint32_t, uint32_t, bool,
                      float>,
           std::vector<uint32_t>>
      groups;
  for (uint32_t i = 0; i < items.size(); ++i) {
    if (items[i].in.tokens == 0) continue;
    const AttentionSpec& spec = items[i].attention->spec();
    const bool linear = spec.rule == UpdateRule::kLinear;
    groups[{spec.rule, spec.gate, items[i].attention->feature_dim(),
            items[i].attention->value_dim(), linear ? 0 : spec.num_heads,
            linear ? false : spec.qk_l2norm, linear ? 0.0f : spec.scale}]
        .push_back(i);
  }
  // In place with `refused`, an item with a value that is not finite is
  // refused alone: its rows only ever meet its own rows in the batched
  // products, so the others complete.
  const bool refuse_alone =
      mode == PrefillCommit::kInPlace && refused.size() == items.size();
  std::vector<uint8_t> non_finite(items.size(), 0);
  std::vector<absl::Status> failed(items.size());
  try {
    for (const auto& [key, members] : groups) {
      if (std::get<0>(key) == UpdateRule::kLinear) {
        LINATTN_RETURN_IF_ERROR(
            RunGroup(items, work, members, non_finite, !refuse_alone));
      } else if (std::get<0>(key) == UpdateRule::kRwkv7 &&
                 !options_.Rwkv7Chunkwise(
                     items[members[0]].attention->spec())) {
        LINATTN_RETURN_IF_ERROR(RunStepGroup(items, work, members, non_finite,
                                             failed, !refuse_alone));
      } else if (std::get<0>(key) == UpdateRule::kRwkv7) {
        LINATTN_RETURN_IF_ERROR(
            RunRwkv7Group(items, work, members, non_finite, !refuse_alone));
      } else {
        LINATTN_RETURN_IF_ERROR(
            RunRuleGroup(items, work, members, non_finite, !refuse_alone));
      }
      // Failing as a whole, the Run stops at the first bad value.
      if (!refuse_alone && std::find(non_finite.begin(), non_finite.end(), 1) !=
                               non_finite.end()) {
        break;
      }
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory in chunkwise prefill");
  }
  for (size_t i = 0; i < items.size(); ++i) {
    if (!non_finite[i]) continue;
    // Named from the input (the slow path runs only for a bad item).
    absl::Status s =
        items[i].attention->ValidateInput(*items[i].state, items[i].in);
    if (s.ok()) s = absl::InternalError("a non-finite value went unnamed");
    s = absl::Status(s.code(), absl::StrCat("items[", i, "].", s.message()));
    if (!refuse_alone) return s;
    refused[i] = std::move(s);
  }
  // A state that left fp32's range is refused, and nothing commits (in
  // place with `refused`: that item is reported there and the others go
  // on); the measurement is also the state's new magnitude bound
  // (kStateMagnitudeLimit).
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].in.tokens == 0 || non_finite[i]) continue;
    if (!failed[i].ok()) {
      absl::Status s =
          absl::Status(failed[i].code(),
                       absl::StrCat("items[", i, "].", failed[i].message()));
      if (!refuse_alone) return s;
      refused[i] = std::move(s);
      continue;
    }
    if (!std::isfinite(work[i]->MeasureMagnitude())) {
      absl::Status overflow = absl::OutOfRangeError(absl::StrCat(
          "items[", i,
          "].k, v: these values would overflow the session's state (an entry "
          "of S or z would pass fp32's largest value, 3.4e38); nothing "
          "changed"));
      if (!refuse_alone) return overflow;
      refused[i] = std::move(overflow);
    }
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const uint64_t position = items[i].state->position() + items[i].in.tokens;
    if (mode == PrefillCommit::kAllOrNothing)
      *items[i].state = std::move(copies[i]);
    items[i].state->set_position(position);
  }
  return absl::OkStatus();
}

absl::Status ChunkwiseRunner::RunStepGroup(
    std::span<const PrefillItem> items, std::span<AttentionState* const> work,
    const std::vector<uint32_t>& members, std::span<uint8_t> non_finite,
    std::span<absl::Status> failed, bool stop_at_non_finite) {
  for (uint32_t i : members) {
    const PrefillItem& item = items[i];
    // Run advances every committed item's position itself.
    const uint64_t position = work[i]->position();
    absl::Status s = StepSequence(*item.attention, *work[i], item.in, item.out);
    work[i]->set_position(position);
    if (s.ok()) continue;
    // Shapes and the per-token inputs passed ValidateInput in Run: what is
    // left to refuse is a value that is not finite (named there), a state
    // that would overflow, or memory.
    if (s.code() == absl::StatusCode::kInvalidArgument) {
      non_finite[i] = 1;
      if (stop_at_non_finite) return absl::OkStatus();
    } else if (s.code() == absl::StatusCode::kOutOfRange) {
      failed[i] = std::move(s);
    } else {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace linattn
