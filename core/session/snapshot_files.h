// SnapshotFiles: one file per session in a directory, each the session's
// snapshot (the container of snapshot.h) and the journal sequence number it
// covers, so that recovery starts from the file and replays only the
// journal's records after it (docs/design.md §4, durable sessions).
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
// MANIFEST beside the files lists every session that has one (replaced
// atomically too): a session's first file is written before its line, and
// its line removed before its file, so a file the manifest lists is one the
// server wrote and did not delete. One that is missing when the directory
// is read (deleted by hand, lost with a disk) is DATA_LOSS naming the
// session and its file, rather than a session silently gone. A directory
// without a manifest (from before it) gets one from the files it holds.
//
// Thread-safe for distinct sessions; one writer per session at a time.
#ifndef LINATTN_CORE_SESSION_SNAPSHOT_FILES_H_
#define LINATTN_CORE_SESSION_SNAPSHOT_FILES_H_

#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
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
  struct Replacement {
    std::string id;
    uint64_t seq = 0;
    absl::string_view blob;
  };
  // Write() for several files, with one sync for all: every new file is
  // written beside its name, the file system synced once (syncfs), each
  // renamed over its name, the directory synced once. A crash leaves each
  // file old or new; a failure leaves every old file.
  absl::Status WriteMany(std::span<const Replacement> files) const;
  // Removes the file of session `id` (none is fine).
  absl::Status Remove(absl::string_view id) const;

  struct Entry {
    std::string id;
    uint64_t seq = 0;
    std::string path;
    std::string bytes;  // the whole file
    size_t blob_offset = 0, blob_size = 0;
    absl::string_view blob() const {
      return absl::string_view(bytes).substr(blob_offset, blob_size);
    }
  };
  // Every session's file, one at a time in id order (one file in memory at
  // a time), to `visit`; stops at the first error, its own or `visit`'s.
  // DATA_LOSS before any visit when a file the manifest lists is missing.
  absl::Status ForEach(const std::function<absl::Status(Entry&)>& visit) const;
  // Every session's file, by id (all in memory: for tests and small dirs).
  absl::StatusOr<std::vector<Entry>> ReadAll() const;

  std::string PathOf(absl::string_view id) const;
  // Bytes in the directory's snapshot files.
  uint64_t disk_bytes() const;

 private:
  std::string TemporaryOf(absl::string_view id) const;
  // The new file of `id` beside its name (removed again on failure).
  absl::Status WriteTemporary(absl::string_view id, uint64_t seq,
                              absl::string_view blob, bool sync) const;
  std::string ManifestPath() const;
  // Under manifest_mu_: the manifest read once (none = empty), and
  // rewritten atomically with `listed_`.
  absl::Status LoadManifest() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(manifest_mu_);
  absl::Status WriteManifest() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(manifest_mu_);
  // Lists `ids` (files just written) if they are not yet. Never fails: a
  // manifest that cannot be written now is written with the next change.
  absl::Status List(const std::vector<std::string>& ids) const;

  const std::string dir_;
  const bool sync_;
  mutable std::mutex manifest_mu_;
  mutable bool manifest_loaded_ ABSL_GUARDED_BY(manifest_mu_) = false;
  mutable std::set<std::string, std::less<>> listed_
      ABSL_GUARDED_BY(manifest_mu_);
  // The manifest on disk is behind listed_ (a write of it failed).
  mutable bool manifest_stale_ ABSL_GUARDED_BY(manifest_mu_) = false;
};

}  // namespace linattn

#endif  // LINATTN_CORE_SESSION_SNAPSHOT_FILES_H_
