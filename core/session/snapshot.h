// The snapshot format of an attention session: spec, position and state in
// one versioned, checksummed blob.
//
//   offset  size  field
//   0       8     magic "LNATSNAP"
//   8       4     format version (1), little-endian like every field
//   12      …     spec: num_heads u32, key_dim u32, value_dim u32,
//                 feature_map u8, unnormalized u8, epsilon f32,
//                 decay count u32 + f32 each, feature_dim u32, seed u64,
//                 horizon u32
//   …       8     position u64
//   …       8     state float count u64, then the floats
//   end−4   4     CRC-32 (IEEE) of every byte before it
//
// Parsing checks the magic, version, checksum, spec and sizes, so a
// truncated or altered blob is refused with a clear error and creates
// nothing.
#ifndef LINATTN_CORE_SESSION_SNAPSHOT_H_
#define LINATTN_CORE_SESSION_SNAPSHOT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/attention/spec.h"
#include "core/attention/state.h"

namespace linattn {

inline constexpr uint32_t kSnapshotVersion = 1;

std::string SerializeSnapshot(const AttentionSpec& spec,
                              const AttentionState& state);
// The size of a snapshot of a session with `spec`, without making one.
uint64_t SnapshotBytes(const AttentionSpec& spec);

struct ParsedSnapshot {
  AttentionSpec spec;
  AttentionState state;
};
// INVALID_ARGUMENT (or DATA_LOSS for a checksum mismatch) naming what is
// wrong with `blob`.
absl::StatusOr<ParsedSnapshot> ParseSnapshot(absl::string_view blob);

// Whether a restored state is one a session can have, beyond its checksum
// (which anyone can recompute after an edit): sums finite; FAVOR+ shifts
// finite once keys were seen and −inf before; at position 0 nothing
// accumulated; z ≥ 0 when the features are never negative; the position at
// most kMaxSnapshotPosition and, with a horizon (cosine), at most that.
// INVALID_ARGUMENT naming `what` otherwise.
absl::Status CheckRestoredState(const AttentionState& state,
                                bool nonnegative_features, uint32_t horizon,
                                absl::string_view what);

// CRC-32 (IEEE 802.3, reflected, as zlib computes it).
uint32_t Crc32(absl::string_view data);

}  // namespace linattn

#endif  // LINATTN_CORE_SESSION_SNAPSHOT_H_
