// Snapshots: one versioned, checksummed container for both kinds of
// session, with a layout table in its header (docs/design.md §4,
// "Snapshots").
//
//   offset     size   field (little-endian throughout)
//   0          8      magic "LNATSNAP"
//   8          4      container version (2)
//   12         4      payload kind: 1 attention session, 2 model session
//   16         4      section count n (1–16)
//   20         4      reserved, 0
//   24         24·n   layout table, per section: tag (4 ASCII bytes), flags
//                     u32 (bit 0: required), offset u64 (from byte 0), size
//                     u64; sections follow the table in its order, with no
//                     gaps
//   …          …      the sections
//   end−4      4      CRC-32 (IEEE) of every byte before it
//
// Sections, each a run of fields:
//   SPEC (attention): num_heads u32, key_dim u32, value_dim u32,
//        feature_map u8, unnormalized u8, epsilon f32, decay count u32 and
//        f32 each, feature_dim u32, seed u64, horizon u32
//   MODL (model):     fingerprint u64, name length u32 and bytes, pending
//        token i32 (−1: none)
//   STAT (both):      state count u32 (1, or the model's layers), then per
//        state position u64, float count u64 and the floats (S, z, key
//        scales per head as AttentionState lays them out)
//   SMPL (model, optional): the session's random stream: seed u64, draws
//        u64, set u8 (SamplerPosition)
//   RULE (attention, gated and delta rules only; required): rule u8 (1
//        gated, 2 delta, 3 gated delta), gate u8 (0 head, 1 key),
//        qk_l2norm u8, scale f32 — a linear session's blob has none, as
//        before the rules existed
// A reader skips a section it does not know unless its required bit is set,
// so a later writer can add optional sections old readers still accept.
//
// One status per failure, on both services: DATA_LOSS for a damaged blob
// (too short for its header, or a checksum that does not match);
// INVALID_ARGUMENT for bytes that are not a snapshot, a version this build
// does not read (named), a blob of the other kind, or intact bytes whose
// contents no session can have (a checksum is not a seal);
// FAILED_PRECONDITION for a model snapshot of a model that is not loaded.
// Every message starts "state:", the request field the blob arrives in.
//
// Version 1 (separate LNATSNAP/LNATMSNP layouts without a table) is refused
// with a message naming it: such blobs come from servers before the
// container and are restored by re-running their context.
#ifndef LINATTN_CORE_SESSION_SNAPSHOT_H_
#define LINATTN_CORE_SESSION_SNAPSHOT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/attention/spec.h"
#include "core/attention/state.h"
#include "core/model/model.h"
#include "core/model/sampler.h"

namespace linattn {

inline constexpr uint32_t kSnapshotVersion = 2;

enum class SnapshotKind : uint32_t { kAttentionSession = 1, kModelSession = 2 };

// --- Attention sessions ------------------------------------------------

std::string SerializeSnapshot(const AttentionSpec& spec,
                              const AttentionState& state);
// The size of a snapshot of a session with `spec`, without making one.
uint64_t SnapshotBytes(const AttentionSpec& spec);

struct ParsedSnapshot {
  AttentionSpec spec;
  AttentionState state;
};
absl::StatusOr<ParsedSnapshot> ParseSnapshot(absl::string_view blob);

// A container with the SPEC section alone: how a durable store records a
// new session, whose state is zero, without the state's bytes. ParseSpec
// refuses as ParseSnapshot does.
std::string SerializeSpec(const AttentionSpec& spec);
absl::StatusOr<AttentionSpec> ParseSpec(absl::string_view blob);

// --- Model sessions ----------------------------------------------------

// A model session's context: the state, the token not yet fed and the
// position of its random stream.
std::string SerializeModelSnapshot(const Model& model, const ModelState& state,
                                   std::optional<int32_t> pending,
                                   const SamplerPosition& sampler = {});
// Its bytes for a session at position 0 (a hybrid's keys and values add
// more as the context grows: at `position`, ModelSnapshotBytesAt).
uint64_t ModelSnapshotBytes(const Model& model);
uint64_t ModelSnapshotBytesAt(const Model& model, uint64_t position);

struct ParsedModelSnapshot {
  std::shared_ptr<const Model> model;
  ModelState state;
  std::optional<int32_t> pending;
  SamplerPosition sampler;  // unset when the blob has no SMPL section
};
// Finds the snapshot's model among `models` by name and fingerprint.
absl::StatusOr<ParsedModelSnapshot> ParseModelSnapshot(
    absl::string_view blob,
    std::span<const std::shared_ptr<const Model>> models);

// --- Shared parts --------------------------------------------------------

// Whether a restored state is one a session can have, beyond its checksum
// (which anyone can recompute after an edit): sums finite; FAVOR+ shifts
// finite once keys were seen and −inf before; at position 0 nothing
// accumulated; z ≥ 0 when the features are never negative; the position at
// most kMaxSnapshotPosition and, with a horizon (cosine), at most that.
// INVALID_ARGUMENT naming `what` otherwise.
absl::Status CheckRestoredState(const AttentionState& state,
                                bool nonnegative_features, uint32_t horizon,
                                absl::string_view what);

// CRC-32 (IEEE 802.3, reflected, as zlib computes it), and the same over
// data that comes in pieces: Crc32Extend(Crc32(a), b) == Crc32(a + b).
uint32_t Crc32(absl::string_view data);
uint32_t Crc32Extend(uint32_t crc, absl::string_view more);

// A section of an opened container (for tests and tools that read the
// layout table).
struct SnapshotSection {
  uint32_t tag = 0;
  uint32_t flags = 0;
  uint64_t offset = 0;
  absl::string_view bytes;
};
// The four-character tag as the table stores it.
constexpr uint32_t SnapshotTag(const char (&name)[5]) {
  return uint32_t{static_cast<uint8_t>(name[0])} |
         uint32_t{static_cast<uint8_t>(name[1])} << 8 |
         uint32_t{static_cast<uint8_t>(name[2])} << 16 |
         uint32_t{static_cast<uint8_t>(name[3])} << 24;
}
// Checks magic, version, checksum, kind and table; the sections then lie
// within `blob`, in order, without gaps.
absl::StatusOr<std::vector<SnapshotSection>> OpenSnapshot(
    absl::string_view blob, SnapshotKind kind);

}  // namespace linattn

#endif  // LINATTN_CORE_SESSION_SNAPSHOT_H_
