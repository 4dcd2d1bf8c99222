#include "core/attention/recurrent.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/attention/kernels.h"
#include "core/util/aligned_buffer.h"
#include "core/util/parallel_for.h"
#include "core/util/status_macros.h"

namespace linattn {

namespace {

// Above this many floats of state per batch, a step's heads are spread over
// threads; below it a fork/join costs more than it saves (one session of 8
// heads of 64×64 steps faster on one thread, at 128×128 two threads win:
// docs/benchmarks.md, "Measured figures behind constants in the code").
constexpr uint64_t kParallelStateFloats = 64 * 1024;
// A sequence walks each head through all its tokens: threads pay off from
// far less state.
constexpr uint64_t kParallelSequenceStateFloats = 4 * 1024;

// φ(q), φ(k) of one head; reused across calls on the same thread.
float* FeatureScratch(uint32_t d_phi) {
  thread_local AlignedBuffer scratch;
  scratch.EnsureSize(2 * uint64_t{d_phi});
  return scratch.data();
}

// Token `t`, head `h` of `in` under a gated, delta, rwkv7 or rwkv6 rule: q and
// k prepared (L2 norm, scale), the fused update and the read-out.
void RuleStepHead(const VectorKernels& kernels, const AttentionSpec& spec,
                  const AttentionState& state, AttentionState& to,
                  const SequenceInput& in, const SequenceOutput& out,
                  uint64_t t, uint32_t h) {
  const uint32_t H = spec.num_heads, d_k = spec.key_dim, d_v = spec.value_dim;
  const uint64_t row = t * H + h;
  thread_local AlignedBuffer scratch;
  scratch.EnsureSize(3 * uint64_t{d_k} + 2 * uint64_t{d_v});
  float* q = scratch.data();
  float* k = q + d_k;
  float* alpha = k + d_k;
  float* delta_scratch = alpha + d_k;
  PrepareQueryKey(spec, kernels, in.q + row * d_k, in.k + row * d_k, q, k);
  float* y = out.output + row * d_v;
  if (spec.rule == UpdateRule::kGated) {
    const uint32_t G = GatesPerHead(spec);
    if (G == 1) {
      alpha[0] = std::exp(in.g[row]);
    } else {  // g ≤ 0: the vectorised exp of the feature maps
      std::copy_n(in.g + row * G, G, alpha);
      kernels.exp_shifted(G, 0.0f, 1.0f, alpha);
    }
    kernels.gated_step_head(alpha, G == 1 ? 0 : 1, q, k, in.v + row * d_v, d_k,
                            d_v, state.s(h), to.s(h), y);
  } else if (spec.rule == UpdateRule::kRwkv6) {
    // g ≤ 0 per key channel, as above.
    std::copy_n(in.g + row * d_k, d_k, alpha);
    kernels.exp_shifted(d_k, 0.0f, 1.0f, alpha);
    kernels.rwkv6_step_head(alpha, spec.bonus.data() + uint64_t{h} * d_k, q, k,
                            in.v + row * d_v, d_k, d_v, state.s(h), to.s(h), y);
  } else if (spec.rule == UpdateRule::kRwkv7) {
    // g ≤ 0 per key channel: the vectorised exp, as the gated rule's.
    std::copy_n(in.g + row * d_k, d_k, alpha);
    kernels.exp_shifted(d_k, 0.0f, 1.0f, alpha);
    kernels.rwkv7_step_head(alpha, in.a + row * d_k, in.b + row * d_k, q, k,
                            in.v + row * d_v, d_k, d_v, state.s(h), to.s(h), y,
                            delta_scratch);
  } else {
    const float a =
        spec.rule == UpdateRule::kGatedDelta ? std::exp(in.g[row]) : 1.0f;
    kernels.delta_step_head(a, in.beta[row], q, k, in.v + row * d_v, d_k, d_v,
                            state.s(h), to.s(h), y, delta_scratch);
  }
  ReadOut(spec, 0.0f, 0.0f, d_v, y, out.denominator + row, out.available + row);
}

// Token `t`, head `h` of `in`: features, fused state update and read-out,
// from head h of `from` into head h of `state` (the same state in place).
void StepHead(const VectorKernels& kernels, const Attention& attention,
              const AttentionState& from, AttentionState& state,
              const SequenceInput& in, const SequenceOutput& out, uint64_t t,
              uint32_t h) {
  const AttentionSpec& spec = attention.spec();
  if (spec.rule != UpdateRule::kLinear) {
    return RuleStepHead(kernels, spec, from, state, in, out, t, h);
  }
  const FeatureMap& fm = attention.feature_map();
  const uint32_t H = spec.num_heads, d_k = spec.key_dim, d_v = spec.value_dim;
  const uint32_t d_phi = fm.dim();
  if (&from != &state) {
    // The linear rule's kernel works in place: the head's S, z and key
    // shift first.
    std::memcpy(state.s(h), from.s(h), uint64_t{d_phi} * d_v * sizeof(float));
    if (state.has_z()) {
      std::memcpy(state.z(h), from.z(h), uint64_t{d_phi} * sizeof(float));
    }
    if (state.has_key_shift()) state.key_shift(h) = from.key_shift(h);
  }
  const uint64_t row = t * H + h;
  const uint64_t position = from.position() + t;

  float* phi_q = FeatureScratch(d_phi);
  float* phi_k = phi_q + d_phi;
  float log_scale = fm.Apply(in.q + row * d_k, position, phi_q);
  float g = HeadDecay(spec, h);
  if (fm.is_favor()) {
    // Keys share one running log-scale per head; when a key raises it, S and
    // z move to the new scale in the same pass (g absorbs e^{old−new}).
    const float old_shift = state.key_shift(h);
    const float shift =
        std::max(old_shift, fm.Exponents(in.k + row * d_k, phi_k));
    fm.FavorExp(phi_k, shift);
    if (shift > old_shift) g *= std::exp(old_shift - shift);
    state.key_shift(h) = shift;
    log_scale += shift;
  } else {
    fm.Apply(in.k + row * d_k, position, phi_k);
  }
  float* y = out.output + row * d_v;
  float den = 0.0f;
  kernels.step_head(g, phi_q, phi_k, in.v + row * d_v, d_phi, d_v, state.s(h),
                    state.z(h), y, &den);
  ReadOut(spec, log_scale, den, d_v, y, out.denominator + row,
          out.available + row);
}

// Whether consuming `in` keeps every entry of `state` finite (see
// kStateMagnitudeLimit); *grown receives the state's bound afterwards.
// OUT_OF_RANGE when it would not; nothing of the state changes but its
// bound, which may tighten.
absl::Status CheckGrowth(const VectorKernels& kernels,
                         const Attention& attention, AttentionState& state,
                         const SequenceInput& in,
                         const InputMagnitude& magnitude, double* grown) {
  const AttentionSpec& spec = attention.spec();
  *grown =
      GrownMagnitudeBound(spec, state.magnitude_bound(), in.tokens, magnitude);
  if (*grown < kStateMagnitudeLimit) return absl::OkStatus();
  *grown =
      GrownMagnitudeBound(spec, state.MeasureMagnitude(), in.tokens, magnitude);
  if (*grown < kStateMagnitudeLimit) return absl::OkStatus();
  // The exact magnitude leaves too little room for the bound: run the tokens
  // on a copy. The real run repeats the same operations, bit for bit.
  const uint32_t H = attention.num_heads(), d_v = attention.value_dim();
  double after = INFINITY;
  try {
    AttentionState trial = state.Copy();
    std::vector<float> y(uint64_t{H} * d_v), den(H);
    std::vector<uint8_t> available(H);
    const SequenceOutput out{y.data(), den.data(), available.data()};
    for (uint64_t t = 0; t < in.tokens; ++t) {
      const SequenceInput token = TokenOf(spec, in, t);
      for (uint32_t h = 0; h < H; ++h) {
        StepHead(kernels, attention, trial, trial, token, out, 0, h);
      }
      trial.set_position(trial.position() + 1);
    }
    after = trial.MeasureMagnitude();
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("memory: allocating ", state.bytes(),
                     " bytes to try a step near fp32's range failed"));
  }
  if (!std::isfinite(after)) {
    return absl::OutOfRangeError(
        "k, v: these values would overflow the session's state (an entry of "
        "S or z would pass fp32's largest value, 3.4e38); nothing changed");
  }
  *grown = after;
  return absl::OkStatus();
}

absl::Status CheckOutput(const SequenceOutput& out, uint64_t tokens) {
  if (tokens != 0 && (out.output == nullptr || out.denominator == nullptr ||
                      out.available == nullptr)) {
    return absl::InvalidArgumentError("out: output buffers missing");
  }
  return absl::OkStatus();
}

// StepBatch's checks of one item, alone; *grown receives its state's bound
// after the step.
absl::Status CheckItem(const VectorKernels& kernels, const StepItem& item,
                       double* grown) {
  if (item.attention == nullptr || item.state == nullptr) {
    return absl::InvalidArgumentError("attention and state are required");
  }
  if (item.token.tokens != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokens: a step takes exactly 1 token, got ", item.token.tokens));
  }
  if (item.into != nullptr && (item.into == item.state ||
                               !item.into->Matches(item.attention->spec()))) {
    return absl::InvalidArgumentError(
        "into: not a separate state of the item's spec");
  }
  InputMagnitude magnitude;
  LINATTN_RETURN_IF_ERROR(
      item.attention->ValidateInput(*item.state, item.token, true, &magnitude));
  LINATTN_RETURN_IF_ERROR(CheckGrowth(kernels, *item.attention, *item.state,
                                      item.token, magnitude, grown));
  return CheckOutput(item.out, 1);
}

// The first refusal of a checked batch, as StepBatch reports it.
absl::Status FirstRefusal(std::span<const absl::Status> results) {
  for (size_t i = 0; i < results.size(); ++i) {
    if (results[i].ok()) continue;
    // One state in two items races with itself: said of the batch.
    if (absl::StartsWith(results[i].message(), "items:")) return results[i];
    return absl::Status(results[i].code(),
                        absl::StrCat("items[", i, "].", results[i].message()));
  }
  return absl::OkStatus();
}

}  // namespace

void CheckSteps(std::span<const StepItem> items,
                std::span<absl::Status> results, std::span<double> grown) {
  const VectorKernels& kernels = ActiveKernels();
  // (Bound to a reference: see RunCheckedSteps.) Each state or `into` with
  // the item that holds it, sorted: a state an earlier item holds too
  // refuses the later item.
  thread_local std::vector<std::pair<const AttentionState*, size_t>>
      states_scratch;
  std::vector<std::pair<const AttentionState*, size_t>>& states =
      states_scratch;
  states.clear();
  for (size_t i = 0; i < items.size(); ++i) {
    grown[i] = 0.0;
    results[i] = CheckItem(kernels, items[i], &grown[i]);
    if (!results[i].ok()) continue;
    states.emplace_back(items[i].state, i);
    if (items[i].into != nullptr) states.emplace_back(items[i].into, i);
  }
  std::sort(states.begin(), states.end());
  for (size_t n = 1; n < states.size(); ++n) {
    if (states[n].first != states[n - 1].first) continue;
    const size_t later = std::max(states[n].second, states[n - 1].second);
    if (states[n].second == states[n - 1].second) continue;  // its own into
    results[later] = absl::InvalidArgumentError(
        "items: the same state appears twice in one batch");
  }
}

void RunCheckedSteps(std::span<const StepItem> items,
                     std::span<const absl::Status> results,
                     std::span<const double> grown) {
  // The scratch vector keeps its capacity, so steady-state decode
  // allocates nothing. (Bound to a reference: inside the OpenMP region
  // below, the name of a thread_local would denote each worker's own
  // copy.)
  thread_local std::vector<std::pair<uint32_t, uint32_t>> work_scratch;
  std::vector<std::pair<uint32_t, uint32_t>>& work = work_scratch;
  work.clear();
  const VectorKernels& kernels = ActiveKernels();
  uint64_t state_floats = 0;
  // Flatten (item, head) so that a single session's heads also spread over
  // threads. Heads of one item touch disjoint parts of its state, except
  // the position, which is advanced after the parallel region.
  for (uint32_t i = 0; i < items.size(); ++i) {
    if (!results[i].ok()) continue;
    state_floats += items[i].state->size();
    for (uint32_t h = 0; h < items[i].attention->num_heads(); ++h) {
      work.emplace_back(i, h);
    }
  }
  ParallelFor(work.size(), state_floats >= kParallelStateFloats,
              [&](uint64_t w) {
                const StepItem& item = items[work[w].first];
                StepHead(kernels, *item.attention, *item.state,
                         item.into != nullptr ? *item.into : *item.state,
                         item.token, item.out, 0, work[w].second);
              });
  for (size_t i = 0; i < items.size(); ++i) {
    if (!results[i].ok()) continue;
    AttentionState& to =
        items[i].into != nullptr ? *items[i].into : *items[i].state;
    to.set_position(items[i].state->position() + 1);
    to.set_magnitude_bound(grown[i]);
  }
}

namespace {

// Every item's checks, into this thread's scratch (which keeps its
// capacity: steady-state decode allocates nothing).
struct ScratchChecks {
  std::vector<absl::Status>& results;
  std::vector<double>& grown;
};
ScratchChecks CheckIntoScratch(std::span<const StepItem> items) {
  thread_local std::vector<absl::Status> results;
  thread_local std::vector<double> grown;
  results.resize(items.size());
  grown.resize(items.size());
  CheckSteps(items, results, grown);
  return {results, grown};
}

}  // namespace

absl::Status CheckStepBatch(std::span<const StepItem> items) {
  return FirstRefusal(CheckIntoScratch(items).results);
}

absl::Status Step(const Attention& attention, AttentionState& state,
                  const SequenceInput& token, const SequenceOutput& out) {
  StepItem item{&attention, &state, token, out};
  return StepBatch({&item, 1});
}

absl::Status StepBatch(std::span<const StepItem> items) {
  // Everything is checked first: a failed batch changes nothing.
  const ScratchChecks checked = CheckIntoScratch(items);
  LINATTN_RETURN_IF_ERROR(FirstRefusal(checked.results));
  RunCheckedSteps(items, checked.results, checked.grown);
  return absl::OkStatus();
}

absl::Status StepSequence(const Attention& attention, AttentionState& state,
                          const SequenceInput& in, const SequenceOutput& out) {
  InputMagnitude magnitude;
  LINATTN_RETURN_IF_ERROR(attention.ValidateInput(state, in, true, &magnitude));
  LINATTN_RETURN_IF_ERROR(CheckOutput(out, in.tokens));
  const VectorKernels& kernels = ActiveKernels();
  double grown = 0.0;
  LINATTN_RETURN_IF_ERROR(
      CheckGrowth(kernels, attention, state, in, magnitude, &grown));
  const uint32_t H = attention.num_heads();
  // Heads are independent streams: each thread walks its heads through all
  // tokens, so a head's S stays in that core's cache.
  const bool parallel = state.size() >= kParallelSequenceStateFloats && H > 1;
  ParallelFor(H, parallel, [&](uint64_t h) {
    for (uint64_t t = 0; t < in.tokens; ++t) {
      StepHead(kernels, attention, state, state, in, out, t,
               static_cast<uint32_t>(h));
    }
  });
  state.set_position(state.position() + in.tokens);
  state.set_magnitude_bound(grown);
  return absl::OkStatus();
}

}  // namespace linattn
