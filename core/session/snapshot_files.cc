#include "core/session/snapshot_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/session/session_manager.h"
#include "core/session/snapshot.h"
#include "core/util/crc.h"
#include "core/util/file_io.h"
#include "core/util/little_endian.h"
#include "core/util/status_macros.h"

namespace linattn {
namespace {

constexpr char kMagic[8] = {'L', 'N', 'A', 'T', 'S', 'E', 'S', 'S'};
constexpr uint32_t kVersion = 1;
constexpr char kPrefix[] = "session-";
constexpr char kSuffix[] = ".snap";
constexpr char kTemporarySuffix[] = ".snap.tmp";

constexpr absl::string_view kWho = "snapshot files";
constexpr char kManifest[] = "MANIFEST";
constexpr absl::string_view kManifestHead = "linattn snapshot files 1";

absl::Status ErrnoStatus(absl::string_view what, const std::string& path,
                         int err) {
  return linattn::ErrnoStatus(kWho, what, path, err);
}

bool EndsWith(const std::string& s, absl::string_view suffix) {
  return absl::EndsWith(s, suffix);
}

}  // namespace

std::string SnapshotFiles::PathOf(absl::string_view id) const {
  // Ids are [A-Za-z0-9._-]: with the prefix, even "." and ".." name plain
  // files inside the directory.
  return (std::filesystem::path(dir_) / absl::StrCat(kPrefix, id, kSuffix))
      .string();
}

std::string SnapshotFiles::ManifestPath() const {
  return (std::filesystem::path(dir_) / kManifest).string();
}

// The manifest: its head line, one session id per line, and "end" (a file
// cut short is refused).
absl::Status SnapshotFiles::LoadManifest() const {
  if (manifest_loaded_) return absl::OkStatus();
  const std::string path = ManifestPath();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    manifest_loaded_ = true;
    return absl::OkStatus();
  }
  auto damaged = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat(
        "snapshot files: ", path, ": ", why,
        "; refusing to start from it (remove it to start from the files "
        "present)"));
  };
  auto read = ReadWholeFile(kWho, path);
  if (!read.ok()) return damaged("cannot be read");
  std::vector<absl::string_view> lines =
      absl::StrSplit(*read, '\n', absl::SkipEmpty());
  if (lines.size() < 2 || lines.front() != kManifestHead ||
      lines.back() != "end") {
    return damaged("not a complete manifest");
  }
  std::set<std::string, std::less<>> listed;
  for (size_t i = 1; i + 1 < lines.size(); ++i) {
    if (!IsValidSessionId(lines[i])) return damaged("lists a bad session id");
    listed.emplace(lines[i]);
  }
  listed_ = std::move(listed);
  manifest_loaded_ = true;
  return absl::OkStatus();
}

absl::Status SnapshotFiles::WriteManifest() const {
  std::string text = absl::StrCat(kManifestHead, "\n");
  for (const std::string& id : listed_) absl::StrAppend(&text, id, "\n");
  absl::StrAppend(&text, "end\n");
  const std::string path = ManifestPath();
  const std::string temporary = path + ".tmp";
  const int fd =
      ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus("creating", temporary, errno);
  absl::Status status = WriteAll(kWho, fd, text, temporary);
  if (status.ok() && sync_ && ::fdatasync(fd) != 0) {
    status = ErrnoStatus("syncing", temporary, errno);
  }
  ::close(fd);
  if (status.ok() && ::rename(temporary.c_str(), path.c_str()) != 0) {
    status = ErrnoStatus("renaming", temporary, errno);
  }
  if (!status.ok()) {
    ::unlink(temporary.c_str());
    return status;
  }
  if (sync_) return SyncDirectory(kWho, dir_);
  return absl::OkStatus();
}

absl::Status SnapshotFiles::List(const std::vector<std::string>& ids) const {
  std::lock_guard<std::mutex> lock(manifest_mu_);
  // The files are written: that stands whatever happens to the manifest
  // (a manifest that could not be read or written is tried again with the
  // next change; meanwhile a file it misses is only not watched for).
  if (!LoadManifest().ok()) return absl::OkStatus();
  bool added = false;
  for (const std::string& id : ids) added |= listed_.insert(id).second;
  if (!added && !manifest_stale_) return absl::OkStatus();
  manifest_stale_ = !WriteManifest().ok();
  return absl::OkStatus();
}

absl::Status SnapshotFiles::Open() const {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("snapshot files: creating ", dir_, ": ", ec.message()));
  }
  return absl::OkStatus();
}

namespace {

// The file's bytes before and after the blob (the checksum runs over the
// head and the blob without joining them).
std::pair<std::string, std::string> Frame(absl::string_view id, uint64_t seq,
                                          absl::string_view blob) {
  std::string head(kMagic, sizeof(kMagic));
  PutLittleEndian<uint32_t>(head, kVersion);
  PutLittleEndian<uint64_t>(head, seq);
  PutLittleEndian<uint16_t>(head, static_cast<uint16_t>(id.size()));
  head.append(id.data(), id.size());
  std::string tail;
  PutLittleEndian<uint32_t>(tail, Crc32cExtend(Crc32c(head), blob));
  return {std::move(head), std::move(tail)};
}

}  // namespace

std::string SnapshotFiles::TemporaryOf(absl::string_view id) const {
  return (std::filesystem::path(dir_) /
          absl::StrCat(kPrefix, id, kTemporarySuffix))
      .string();
}

absl::Status SnapshotFiles::WriteTemporary(absl::string_view id, uint64_t seq,
                                           absl::string_view blob,
                                           bool sync) const {
  if (!IsValidSessionId(id)) {
    return absl::InvalidArgumentError("snapshot files: not a session id");
  }
  const auto [head, tail] = Frame(id, seq, blob);
  const std::string temporary = TemporaryOf(id);
  const int fd =
      ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus("creating", temporary, errno);
  absl::Status status;
  for (absl::string_view part :
       {absl::string_view(head), blob, absl::string_view(tail)}) {
    if (status.ok()) status = WriteAll(kWho, fd, part, temporary);
  }
  if (status.ok() && sync && ::fdatasync(fd) != 0) {
    status = ErrnoStatus("syncing", temporary, errno);
  }
  ::close(fd);
  if (!status.ok()) ::unlink(temporary.c_str());  // the old file, if any, stays
  return status;
}

absl::Status SnapshotFiles::Write(absl::string_view id, uint64_t seq,
                                  absl::string_view blob) const {
  LINATTN_RETURN_IF_ERROR(WriteTemporary(id, seq, blob, sync_));
  const std::string temporary = TemporaryOf(id);
  if (::rename(temporary.c_str(), PathOf(id).c_str()) != 0) {
    const absl::Status s = ErrnoStatus("renaming", temporary, errno);
    ::unlink(temporary.c_str());
    return s;
  }
  if (sync_) LINATTN_RETURN_IF_ERROR(SyncDirectory(kWho, dir_));
  return List({std::string(id)});
}

absl::Status SnapshotFiles::WriteMany(
    std::span<const Replacement> files) const {
  size_t written = 0;
  absl::Status status;
  for (; written < files.size() && status.ok(); ++written) {
    status = WriteTemporary(files[written].id, files[written].seq,
                            files[written].blob, /*sync=*/false);
  }
  if (status.ok() && sync_) {
    // One sync for every new file's data, before any of them replaces an
    // old one.
    const int dir = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0 || ::syncfs(dir) != 0) {
      status = ErrnoStatus("syncing", dir_, errno);
    }
    if (dir >= 0) ::close(dir);
  }
  if (!status.ok()) {
    for (size_t i = 0; i < written; ++i) {
      ::unlink(TemporaryOf(files[i].id).c_str());
    }
    return status;
  }
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string temporary = TemporaryOf(files[i].id);
    if (::rename(temporary.c_str(), PathOf(files[i].id).c_str()) != 0) {
      status = ErrnoStatus("renaming", temporary, errno);
      for (size_t j = i; j < files.size(); ++j) {
        ::unlink(TemporaryOf(files[j].id).c_str());
      }
      break;
    }
  }
  if (sync_) {
    // The renames that happened are made durable even if a later one
    // failed.
    const absl::Status synced = SyncDirectory(kWho, dir_);
    if (status.ok()) status = synced;
  }
  if (!status.ok()) return status;
  std::vector<std::string> ids;
  for (const Replacement& f : files) ids.push_back(f.id);
  return List(ids);
}

absl::Status SnapshotFiles::Remove(absl::string_view id) const {
  if (!IsValidSessionId(id)) return absl::OkStatus();
  {
    // Its line goes first: a crash in between leaves a file not listed (a
    // deleted session's, which the journal's delete record removes), never
    // a listed one missing.
    std::lock_guard<std::mutex> lock(manifest_mu_);
    LINATTN_RETURN_IF_ERROR(LoadManifest());
    if (auto it = listed_.find(id); it != listed_.end()) {
      const std::string kept = *it;
      listed_.erase(it);
      if (absl::Status s = WriteManifest(); !s.ok()) {
        // The file stays until its line is gone (tried again later).
        listed_.insert(kept);
        return s;
      }
      manifest_stale_ = false;
    }
  }
  const std::string path = PathOf(id);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoStatus("removing", path, errno);
  }
  if (sync_) return SyncDirectory(kWho, dir_);
  return absl::OkStatus();
}

absl::Status SnapshotFiles::ForEach(
    const std::function<absl::Status(Entry&)>& visit) const {
  std::error_code ec;
  if (!std::filesystem::exists(dir_, ec)) return absl::OkStatus();
  std::vector<std::string> names;
  for (const auto& dirent : std::filesystem::directory_iterator(dir_, ec)) {
    const std::string name = dirent.path().filename().string();
    if (!name.starts_with(kPrefix)) continue;
    if (EndsWith(name, kTemporarySuffix)) {
      // A replacement the process did not finish: the old file (if any) is
      // the session's.
      std::filesystem::remove(dirent.path(), ec);
      continue;
    }
    if (EndsWith(name, kSuffix)) names.push_back(name);
  }
  if (ec) {
    return absl::InternalError(
        absl::StrCat("snapshot files: listing ", dir_, ": ", ec.message()));
  }
  std::sort(names.begin(), names.end());
  std::set<std::string, std::less<>> present;
  for (const std::string& name : names) {
    std::string id =
        name.substr(sizeof(kPrefix) - 1, name.size() - (sizeof(kPrefix) - 1) -
                                             (sizeof(kSuffix) - 1));
    if (!IsValidSessionId(id)) {
      return absl::DataLossError(absl::StrCat(
          "snapshot files: ", (std::filesystem::path(dir_) / name).string(),
          ": its name holds no session id; refusing to start from it (move "
          "it away to start without it)"));
    }
    present.insert(std::move(id));
  }
  {
    // Every session the manifest lists has its file.
    std::lock_guard<std::mutex> lock(manifest_mu_);
    LINATTN_RETURN_IF_ERROR(LoadManifest());
    for (const std::string& id : listed_) {
      if (!present.contains(id)) {
        return absl::DataLossError(absl::StrCat(
            "snapshot files: session '", id, "': its file ", PathOf(id),
            " is missing, though ", ManifestPath(),
            " lists it (the server wrote it and never deleted it); refusing "
            "to start without the session (remove its line from the "
            "manifest to start without it)"));
      }
    }
  }
  for (const std::string& name : names) {
    Entry entry;
    entry.path = (std::filesystem::path(dir_) / name).string();
    entry.id =
        name.substr(sizeof(kPrefix) - 1, name.size() - (sizeof(kPrefix) - 1) -
                                             (sizeof(kSuffix) - 1));
    auto damaged = [&](absl::string_view why) {
      return absl::DataLossError(absl::StrCat(
          "snapshot files: ", entry.path, ": ", why,
          "; refusing to start from it (move it away and remove its line "
          "from ",
          ManifestPath(), " to start without the session)"));
    };
    auto read = ReadWholeFile(kWho, entry.path);
    if (!read.ok()) return damaged("cannot be read");
    entry.bytes = *std::move(read);
    const std::string& data = entry.bytes;
    if (data.size() < 8 + 4 + 8 + 2 + 4 ||
        std::memcmp(data.data(), kMagic, sizeof(kMagic)) != 0) {
      return damaged("not a session snapshot file");
    }
    if (Crc32c(absl::string_view(data).substr(0, data.size() - 4)) !=
        GetLittleEndian<uint32_t>(data.data() + data.size() - 4)) {
      return damaged("checksum mismatch (truncated or altered)");
    }
    if (GetLittleEndian<uint32_t>(data.data() + 8) != kVersion) {
      return damaged(absl::StrCat("format version ",
                                  GetLittleEndian<uint32_t>(data.data() + 8),
                                  " is not supported"));
    }
    const uint16_t id_length = GetLittleEndian<uint16_t>(data.data() + 20);
    if (22 + uint64_t{id_length} + 4 > data.size() ||
        absl::string_view(data).substr(22, id_length) != entry.id) {
      return damaged("it names another session than its file name");
    }
    entry.seq = GetLittleEndian<uint64_t>(data.data() + 12);
    entry.blob_offset = 22 + id_length;
    entry.blob_size = data.size() - 22 - id_length - 4;
    LINATTN_RETURN_IF_ERROR(visit(entry));
  }
  // Every file is whole: files the manifest does not list (a crash between
  // a first file and its line, a directory from before manifests) join it.
  std::lock_guard<std::mutex> lock(manifest_mu_);
  if (present != listed_ || manifest_stale_) {
    listed_ = std::move(present);
    LINATTN_RETURN_IF_ERROR(WriteManifest());
    manifest_stale_ = false;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<SnapshotFiles::Entry>> SnapshotFiles::ReadAll()
    const {
  std::vector<Entry> out;
  LINATTN_RETURN_IF_ERROR(ForEach([&](Entry& e) {
    out.push_back(std::move(e));
    return absl::OkStatus();
  }));
  return out;
}

uint64_t SnapshotFiles::disk_bytes() const {
  uint64_t total = 0;
  std::error_code ec;
  if (!std::filesystem::exists(dir_, ec)) return 0;
  for (const auto& dirent : std::filesystem::directory_iterator(dir_, ec)) {
    if (EndsWith(dirent.path().filename().string(), kSuffix)) {
      const uint64_t size = std::filesystem::file_size(dirent.path(), ec);
      if (!ec) total += size;
    }
  }
  return total;
}

}  // namespace linattn
