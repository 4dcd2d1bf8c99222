#include "core/session/snapshot_container.h"

#include <algorithm>

namespace linattn {

namespace snapshot_internal {

std::string TagName(uint32_t tag) {
  std::string name;
  for (int i = 0; i < 4; ++i) {
    const char c = static_cast<char>((tag >> (8 * i)) & 0xff);
    name += (c >= 0x20 && c < 0x7f) ? c : '?';
  }
  return name;
}

absl::Status Malformed(absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("state: snapshot ", why));
}
uint64_t StateSectionBytes(uint64_t states, uint64_t state_bytes) {
  return 4 + 16 * states + state_bytes;
}

// Reads the STAT section into `states`, whose shapes are already set (from
// the spec or the model).
absl::Status ReadStates(absl::string_view section,
                        std::span<AttentionState> states) {
  SectionReader r(section, "STAT");
  uint32_t count = 0;
  LINATTN_RETURN_IF_ERROR(r.Get(&count, "state count"));
  if (count != states.size()) {
    return Malformed(
        absl::StrCat("holds ", count, " states; ", states.size(), " expected"));
  }
  for (size_t i = 0; i < states.size(); ++i) {
    AttentionState& state = states[i];
    uint64_t position = 0, floats = 0;
    LINATTN_RETURN_IF_ERROR(r.Get(&position, "position"));
    LINATTN_RETURN_IF_ERROR(r.Get(&floats, "float count"));
    if (floats != state.size()) {
      return Malformed(absl::StrCat("state ", i, " holds ", floats,
                                    " floats; its shape needs ", state.size()));
    }
    LINATTN_ASSIGN_OR_RETURN(absl::string_view bytes,
                             r.Bytes(floats * sizeof(float), "floats"));
    std::memcpy(state.data(), bytes.data(), bytes.size());
    state.set_position(position);
  }
  return r.Done();
}

// The sections `wanted` of an opened container, in that order; a required
// section this reader does not know refuses the blob.
absl::StatusOr<std::vector<absl::string_view>> FindSections(
    const std::vector<SnapshotSection>& sections,
    std::initializer_list<uint32_t> wanted) {
  std::vector<absl::string_view> found(wanted.size());
  std::vector<bool> seen(wanted.size(), false);
  for (const SnapshotSection& s : sections) {
    size_t i = 0;
    for (uint32_t tag : wanted) {
      if (tag == s.tag) break;
      ++i;
    }
    if (i == wanted.size()) {
      if (s.flags & kRequired) {
        return Malformed(absl::StrCat("needs section ", TagName(s.tag),
                                      ", which this server does not read"));
      }
      continue;
    }
    if (seen[i]) {
      return Malformed(
          absl::StrCat("holds section ", TagName(s.tag), " twice"));
    }
    seen[i] = true;
    found[i] = s.bytes;
  }
  size_t i = 0;
  for (uint32_t tag : wanted) {
    if (!seen[i++]) {
      return Malformed(absl::StrCat("has no section ", TagName(tag)));
    }
  }
  return found;
}

absl::string_view KindName(uint32_t kind) {
  switch (kind) {
    case static_cast<uint32_t>(SnapshotKind::kAttentionSession):
      return "an attention session (AttentionService.Restore)";
    case static_cast<uint32_t>(SnapshotKind::kModelSession):
      return "a model session (GenerationService.Restore)";
  }
  return "an unknown kind of session";
}

uint64_t ContainerBytes(uint64_t sections, uint64_t payload) {
  return kHeaderBytes + kTableEntryBytes * sections + payload + 4;
}

}  // namespace snapshot_internal

using namespace snapshot_internal;  // NOLINT: this file's own parts

uint32_t Crc32Extend(uint32_t crc, absl::string_view more) {
  return Crc32IeeeExtend(crc, more);
}

uint32_t Crc32(absl::string_view data) { return Crc32Extend(0, data); }

absl::StatusOr<std::vector<SnapshotSection>> OpenSnapshot(
    absl::string_view blob, SnapshotKind kind) {
  if (blob.size() >= 8 &&
      std::memcmp(blob.data(), kModelMagicV1, sizeof(kModelMagicV1)) == 0) {
    return absl::InvalidArgumentError(
        "state: a version 1 model-session snapshot, which this server does not "
        "read (it reads version 2); restore the session by sending its "
        "context again");
  }
  if (blob.size() < 8 || std::memcmp(blob.data(), kMagic, sizeof(kMagic))) {
    return absl::InvalidArgumentError(
        "state: not a linattn snapshot (bad magic)");
  }
  if (blob.size() < kHeaderBytes + 4) {
    return absl::DataLossError(
        absl::StrCat("state: snapshot is truncated (", blob.size(), " bytes)"));
  }
  auto u32 = [&](uint64_t at) {
    uint32_t v;
    std::memcpy(&v, blob.data() + at, 4);
    return v;
  };
  auto u64 = [&](uint64_t at) {
    uint64_t v;
    std::memcpy(&v, blob.data() + at, 8);
    return v;
  };
  const uint32_t version = u32(8);
  if (version != kSnapshotVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state: snapshot format version ", version,
        " is not supported (this server reads version ", kSnapshotVersion,
        version == 1 ? "; restore the session by sending its context again)"
                     : ")"));
  }
  const absl::string_view body = blob.substr(0, blob.size() - 4);
  if (Crc32(body) != u32(blob.size() - 4)) {
    return absl::DataLossError(
        "state: snapshot checksum mismatch (truncated or altered)");
  }
  if (u32(12) != static_cast<uint32_t>(kind)) {
    return absl::InvalidArgumentError(
        absl::StrCat("state: this is a snapshot of ", KindName(u32(12)),
                     ", not of ", KindName(static_cast<uint32_t>(kind))));
  }
  const uint32_t count = u32(16);
  if (count == 0 || count > kMaxSections || u32(20) != 0 ||
      kHeaderBytes + kTableEntryBytes * count > body.size()) {
    return Malformed(
        "header is inconsistent (section count or reserved "
        "field)");
  }
  std::vector<SnapshotSection> sections(count);
  uint64_t next = kHeaderBytes + kTableEntryBytes * count;
  for (uint32_t i = 0; i < count; ++i) {
    const uint64_t entry = kHeaderBytes + kTableEntryBytes * i;
    SnapshotSection& s = sections[i];
    s.tag = u32(entry);
    s.flags = u32(entry + 4);
    s.offset = u64(entry + 8);
    const uint64_t size = u64(entry + 16);
    if (s.offset != next || size > body.size() - next) {
      return Malformed(absl::StrCat("layout table entry ", i, " (",
                                    TagName(s.tag),
                                    ") does not follow the one before it"));
    }
    s.bytes = body.substr(s.offset, size);
    next += size;
  }
  if (next != body.size()) {
    return Malformed(absl::StrCat("has ", body.size() - next,
                                  " bytes after its last section"));
  }
  return sections;
}
}  // namespace linattn
