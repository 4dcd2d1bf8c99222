// SnapshotFiles: one file per session in a directory, each the session's
// snapshot (the container of snapshot.h) and the journal sequence number it
// covers, so that recovery starts from the file and replays only the
// journal's records after it (docs/design.md §5, durable sessions).
//
//   session-<id>.snap
//   offset  size  field (little-endian)
//   0       8     magic "LNATSESS"
//   8       4     format version (1)
//   12      8     journal sequence number the snapshot includes
//   20      2     session id length, then the id
//   …       …     the snapshot blob
//   end−4   4     CRC-32C (core/util/crc.h) of every byte before it
//
// A file is replaced atomically (written beside it, synced, renamed over
// it, the directory synced), so a crash leaves the old file or the new
// one, never a mix; a leftover temporary file is removed when the
// directory is read. A file that is damaged, or names another session than
// its file name, is refused as DATA_LOSS naming it: recovery never starts
// from a wrong state.
//
// Thread-safe for distinct sessions; one writer per session at a time.
#ifndef LINATTN_CORE_SESSION_SNAPSHOT_FILES_H_
#define LINATTN_CORE_SESSION_SNAPSHOT_FILES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace linattn {

class SnapshotFiles {
 public:
  // `sync`: make each replacement durable (fsync of the file and the
  // directory) before Write returns.
  SnapshotFiles(std::string dir, bool sync)
      : dir_(std::move(dir)), sync_(sync) {}

  // Creates the directory if missing.
  absl::Status Open() const;
  // Replaces the file of session `id` with `blob` covering journal records
  // up to `seq`. A full disk is RESOURCE_EXHAUSTED, and the old file stays.
  absl::Status Write(absl::string_view id, uint64_t seq,
                     absl::string_view blob) const;
  // Removes the file of session `id` (none is fine).
  absl::Status Remove(absl::string_view id) const;

  struct Entry {
    std::string id;
    uint64_t seq = 0;
    std::string blob;
    std::string path;
  };
  // Every session's file, by id.
  absl::StatusOr<std::vector<Entry>> ReadAll() const;

  std::string PathOf(absl::string_view id) const;
  // Bytes in the directory's snapshot files.
  uint64_t disk_bytes() const;

 private:
  const std::string dir_;
  const bool sync_;
};

}  // namespace linattn

#endif  // LINATTN_CORE_SESSION_SNAPSHOT_FILES_H_
