// Journal: the append-only, checksummed log that makes sessions durable
// (docs/design.md §4, "Durable sessions").
//
// A journal is a directory of segment files, journal-<first seq>.log, each
//
//   offset  size  field (little-endian)
//   0       8     magic "LNATJRNL"
//   8       4     format version (1)
//   12      8     sequence number of its first record
//   20      …     records, back to back
//
// and each record
//
//   0       4     body length n (at most kMaxJournalRecordBytes)
//   4       4     CRC-32C (core/util/crc.h) of those 4 bytes
//   8       4     CRC-32C of the body
//   12      n     body: seq u64, type u8, session id length u16 and bytes,
//                 payload (the rest)
//
// Sequence numbers rise by one from record to record across segments.
//
// Writing is group commit: records Add()ed for one scheduler round or
// generation iteration go to disk with one write() and, under
// Durability::kAlways, one fdatasync() in Commit(), before any response of
// the round is sent. A Commit that fails (a full disk, an I/O error) cuts
// the segment back to its last committed length: nothing of the group is
// kept, nothing committed before it is lost, and the caller fails the
// round's changes (RESOURCE_EXHAUSTED for a full disk).
//
// Reading (ReadJournal) takes every segment in order. A record cut short
// by the end of the last segment, or the last record there failing its
// checksum (or zeros from a write that never landed), is a torn write from
// a crash: it is dropped and reported; the length's own checksum tells a
// record cut short from a damaged length. Any other damage — a bad
// record with bytes after it, a gap in the sequence, a bad header — is
// DATA_LOSS naming the file and byte offset: a journal is never read past
// damage into a wrong state.
//
// Not thread-safe: the compute worker writes; recovery reads before serving.
#ifndef LINATTN_CORE_SESSION_JOURNAL_H_
#define LINATTN_CORE_SESSION_JOURNAL_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace linattn {

// When a committed group is made durable.
enum class Durability {
  kAlways,  // fdatasync in every Commit: an acknowledged step survives a
            // crash of the machine
  kBatch,   // fdatasync by the first Commit after `sync_interval` (an
            // idle writer's owner calls Commit on a timer): a machine crash
            // may lose that window; a process crash loses nothing
  kOff,     // never: the page cache decides
};
absl::StatusOr<Durability> ParseDurability(absl::string_view name);
absl::string_view DurabilityName(Durability durability);

inline constexpr uint32_t kMaxJournalRecordBytes = uint32_t{1} << 30;

struct JournalOptions {
  Durability durability = Durability::kAlways;
  std::chrono::milliseconds sync_interval{100};  // kBatch
  // A segment is closed and a new one started once it holds this much.
  uint64_t segment_bytes = uint64_t{64} << 20;
};

struct JournalRecord {
  uint64_t seq = 0;
  uint8_t type = 0;
  std::string session_id;
  std::string payload;
  // Where it was read (ReadJournal).
  std::string file;
  uint64_t offset = 0;
};

class JournalWriter {
 public:
  // Continues the journal in `dir` (created if missing) after `next_seq`
  // − 1, the last record recovery read, in a new segment.
  static absl::StatusOr<std::unique_ptr<JournalWriter>> Open(
      const std::string& dir, uint64_t next_seq, JournalOptions options = {});
  ~JournalWriter();
  JournalWriter(const JournalWriter&) = delete;
  JournalWriter& operator=(const JournalWriter&) = delete;

  // Adds a record to the group under way; returns its sequence number.
  uint64_t Add(uint8_t type, absl::string_view session_id,
               absl::string_view payload);
  // Makes the group durable (per the options) or, failing, drops it whole.
  absl::Status Commit();
  // Drops the group under way (nothing of it is written).
  void Abandon();
  // Starts a new segment at the next record; returns the first sequence
  // number it will hold. Segments before it can be removed once nothing
  // needs their records (RemoveSegmentsBefore).
  absl::StatusOr<uint64_t> Rotate();
  // Removes the whole segments whose records all precede `seq`.
  absl::Status RemoveSegmentsBefore(uint64_t seq);

  uint64_t next_seq() const { return next_seq_; }
  // The first sequence number of the segment being written.
  uint64_t segment_first_seq() const { return segment_first_seq_; }
  uint64_t pending_bytes() const { return group_.size(); }
  const std::string& dir() const { return dir_; }
  // Bytes in the journal's segments.
  uint64_t disk_bytes() const;

 private:
  JournalWriter(std::string dir, JournalOptions options, uint64_t next_seq)
      : dir_(std::move(dir)), options_(options), next_seq_(next_seq) {}
  absl::Status OpenSegment();

  const std::string dir_;
  const JournalOptions options_;
  uint64_t next_seq_;
  uint64_t group_first_seq_ = 0;
  std::string group_;  // encoded records not yet written
  int fd_ = -1;
  std::string segment_path_;
  uint64_t segment_length_ = 0;  // committed bytes
  uint64_t segment_first_seq_ = 0;
  std::chrono::steady_clock::time_point last_sync_;
  bool unsynced_ = false;
};

struct JournalScan {
  std::vector<JournalRecord> records;  // in sequence order (first overload)
  uint64_t next_seq = 1;               // after the last record read
  // A torn write dropped from the end of the last segment (0 if none).
  uint64_t dropped_tail_bytes = 0;
  std::string dropped_tail_file;
  uint64_t dropped_tail_offset = 0;
};
// Reads every segment of `dir` (an empty scan if there is none); see the
// file comment for what is dropped and what refused.
absl::StatusOr<JournalScan> ReadJournal(const std::string& dir);
// The same, one segment in memory at a time: each record goes to `visit`
// in order (and not into the scan); an error from `visit` stops the read.
absl::StatusOr<JournalScan> ReadJournal(
    const std::string& dir,
    const std::function<absl::Status(JournalRecord&)>& visit);

// Cuts the torn write a scan dropped off its file (removing a segment whose
// header was cut), so that the journal reads cleanly once new segments
// follow it. Call before JournalWriter::Open continues the journal.
absl::Status RepairJournal(const JournalScan& scan);

// The body of a record as written (exposed for tests).
std::string EncodeJournalRecord(const JournalRecord& record);

}  // namespace linattn

#endif  // LINATTN_CORE_SESSION_JOURNAL_H_
