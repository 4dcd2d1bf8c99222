// The snapshot container's parts (core/session/snapshot.h has the format):
// its constants, its writer and section reader, and the sections both kinds
// of session share (STAT). For snapshot.cc (attention sessions),
// model_snapshot.cc (model sessions) and snapshot_container.cc; not for
// other users.
#ifndef LINATTN_CORE_SESSION_SNAPSHOT_CONTAINER_H_
#define LINATTN_CORE_SESSION_SNAPSHOT_CONTAINER_H_

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/attention/state.h"
#include "core/session/snapshot.h"
#include "core/util/crc.h"
#include "core/util/little_endian.h"
#include "core/util/status_macros.h"

namespace linattn::snapshot_internal {

inline constexpr char kMagic[8] = {'L', 'N', 'A', 'T', 'S', 'N', 'A', 'P'};
// Version 1's model-session magic, recognised only to name it.
inline constexpr char kModelMagicV1[8] = {'L', 'N', 'A', 'T',
                                          'M', 'S', 'N', 'P'};
inline constexpr uint64_t kHeaderBytes = 24;
inline constexpr uint64_t kTableEntryBytes = 24;
inline constexpr uint32_t kMaxSections = 16;
inline constexpr uint32_t kRequired = 1;
inline constexpr uint32_t kSpecTag = SnapshotTag("SPEC");
inline constexpr uint32_t kModelTag = SnapshotTag("MODL");
inline constexpr uint32_t kStateTag = SnapshotTag("STAT");
inline constexpr uint32_t kSamplerTag = SnapshotTag("SMPL");
inline constexpr uint32_t kConvTag = SnapshotTag("CONV");
// KVCA (hybrid models' sessions; required): per softmax-attention layer in
// layer order, its index u32, the first position it holds u64 and the
// positions held u64, then their keys and their values, row_floats f32
// each (core/model/kv_cache.h).
inline constexpr uint32_t kKvTag = SnapshotTag("KVCA");
// RULE (attention sessions of the gated, delta, rwkv7 and rwkv6 rules;
// required, so a reader that does not know it refuses the blob rather than
// misread it): rule u8, gate u8, qk_l2norm u8, scale f32; rwkv6 then its
// bonus u, num_heads·key_dim f32.
inline constexpr uint32_t kRuleTag = SnapshotTag("RULE");
inline constexpr uint64_t kRuleSectionBytes = 1 + 1 + 1 + 4;
// SMPL: seed u64, draws u64, set u8.
inline constexpr uint64_t kSamplerSectionBytes = 8 + 8 + 1;

// "SPEC", or "?" for bytes that are not printable.
std::string TagName(uint32_t tag);
// INVALID_ARGUMENT "state: snapshot <why>".
absl::Status Malformed(absl::string_view why);
// A STAT section's bytes for `states` states of `state_bytes` in all.
uint64_t StateSectionBytes(uint64_t states, uint64_t state_bytes);
// A container's bytes with `sections` sections of `payload` bytes in all.
uint64_t ContainerBytes(uint64_t sections, uint64_t payload);
// Reads the STAT section into `states`, whose shapes are already set (from
// the spec or the model).
absl::Status ReadStates(absl::string_view section,
                        std::span<AttentionState> states);
// The sections `wanted` of an opened container, in that order; a required
// section this reader does not know refuses the blob.
absl::StatusOr<std::vector<absl::string_view>> FindSections(
    const std::vector<SnapshotSection>& sections,
    std::initializer_list<uint32_t> wanted);
// What a snapshot of `kind` restores into, for errors.
absl::string_view KindName(uint32_t kind);

// Writes a container whose section sizes are known up front: the header and
// table first, then each section's fields in order, the checksum last.
// Finish() checks that every section got exactly its declared size.
class SnapshotWriter {
 public:
  struct Section {
    uint32_t tag;
    uint64_t size;
    bool required = true;
  };
  SnapshotWriter(SnapshotKind kind, std::span<const Section> sections)
      : sections_(sections.begin(), sections.end()) {
    uint64_t total = kHeaderBytes + kTableEntryBytes * sections.size() + 4;
    for (const Section& s : sections) total += s.size;
    out_.reserve(total);
    out_.append(kMagic, sizeof(kMagic));
    Put<uint32_t>(kSnapshotVersion);
    Put<uint32_t>(static_cast<uint32_t>(kind));
    Put<uint32_t>(static_cast<uint32_t>(sections.size()));
    Put<uint32_t>(0);
    uint64_t offset = kHeaderBytes + kTableEntryBytes * sections.size();
    for (const Section& s : sections) {
      Put<uint32_t>(s.tag);
      Put<uint32_t>(s.required ? kRequired : 0);
      Put<uint64_t>(offset);
      Put<uint64_t>(s.size);
      offset += s.size;
    }
    end_ = offset + 4;
  }
  template <typename T>
  void Put(T value) {
    char bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));  // x86-64 and aarch64: little-endian
    out_.append(bytes, sizeof(T));
  }
  void PutBytes(const void* data, size_t n) {
    out_.append(static_cast<const char*>(data), n);
  }
  void PutState(const AttentionState& state) {
    Put<uint64_t>(state.position());
    Put<uint64_t>(state.size());
    PutBytes(state.data(), state.size() * sizeof(float));
  }
  std::string Finish() {
    Put<uint32_t>(Crc32(out_));
    if (out_.size() != end_) {
      // A size function and its writer disagree: a defect, not input.
      std::abort();
    }
    return std::move(out_);
  }

 private:
  std::vector<Section> sections_;
  std::string out_;
  uint64_t end_ = 0;
};

// Reads one section's fields; running past its end is a malformed blob (the
// checksum matched, so the bytes are as written: the table lies).
class SectionReader {
 public:
  SectionReader(absl::string_view data, absl::string_view name)
      : data_(data), name_(name) {}
  template <typename T>
  absl::Status Get(T* value, absl::string_view field) {
    if (data_.size() - pos_ < sizeof(T)) return Short(field);
    std::memcpy(value, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return absl::OkStatus();
  }
  absl::StatusOr<absl::string_view> Bytes(uint64_t n, absl::string_view field) {
    if (data_.size() - pos_ < n) return Short(field);
    absl::string_view out = data_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  uint64_t remaining() const { return data_.size() - pos_; }
  absl::Status Done() const {
    if (remaining() == 0) return absl::OkStatus();
    return Malformed(absl::StrCat("section ", name_, " has ", remaining(),
                                  " bytes after its last field"));
  }

 private:
  absl::Status Short(absl::string_view field) const {
    return Malformed(
        absl::StrCat("section ", name_, " ends before its field ", field));
  }
  absl::string_view data_;
  absl::string_view name_;
  uint64_t pos_ = 0;
};
}  // namespace linattn::snapshot_internal

#endif  // LINATTN_CORE_SESSION_SNAPSHOT_CONTAINER_H_
