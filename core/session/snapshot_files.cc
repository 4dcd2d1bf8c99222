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
#include "core/session/session_manager.h"
#include "core/session/snapshot.h"
#include "core/util/crc.h"
#include "core/util/file_io.h"
#include "core/util/little_endian.h"

namespace linattn {
namespace {

constexpr char kMagic[8] = {'L', 'N', 'A', 'T', 'S', 'E', 'S', 'S'};
constexpr uint32_t kVersion = 1;
constexpr char kPrefix[] = "session-";
constexpr char kSuffix[] = ".snap";
constexpr char kTemporarySuffix[] = ".snap.tmp";

constexpr absl::string_view kWho = "snapshot files";

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

absl::Status SnapshotFiles::Open() const {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("snapshot files: creating ", dir_, ": ", ec.message()));
  }
  return absl::OkStatus();
}

absl::Status SnapshotFiles::Write(absl::string_view id, uint64_t seq,
                                  absl::string_view blob) const {
  if (!IsValidSessionId(id)) {
    return absl::InvalidArgumentError("snapshot files: not a session id");
  }
  std::string head(kMagic, sizeof(kMagic));
  PutLittleEndian<uint32_t>(head, kVersion);
  PutLittleEndian<uint64_t>(head, seq);
  PutLittleEndian<uint16_t>(head, static_cast<uint16_t>(id.size()));
  head.append(id.data(), id.size());
  // The checksum runs over the head and the blob without joining them.
  std::string tail;
  PutLittleEndian<uint32_t>(tail, Crc32cExtend(Crc32c(head), blob));

  const std::string path = PathOf(id);
  const std::string temporary = (std::filesystem::path(dir_) /
                                 absl::StrCat(kPrefix, id, kTemporarySuffix))
                                    .string();
  const int fd =
      ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus("creating", temporary, errno);
  absl::Status status;
  for (absl::string_view part :
       {absl::string_view(head), blob, absl::string_view(tail)}) {
    if (status.ok()) status = WriteAll(kWho, fd, part, temporary);
  }
  if (status.ok() && sync_ && ::fdatasync(fd) != 0) {
    status = ErrnoStatus("syncing", temporary, errno);
  }
  ::close(fd);
  if (status.ok() && ::rename(temporary.c_str(), path.c_str()) != 0) {
    status = ErrnoStatus("renaming", temporary, errno);
  }
  if (!status.ok()) {
    ::unlink(temporary.c_str());  // the old file, if any, stays
    return status;
  }
  if (sync_) return SyncDirectory(kWho, dir_);
  return absl::OkStatus();
}

absl::Status SnapshotFiles::Remove(absl::string_view id) const {
  if (!IsValidSessionId(id)) return absl::OkStatus();
  const std::string path = PathOf(id);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoStatus("removing", path, errno);
  }
  if (sync_) return SyncDirectory(kWho, dir_);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<SnapshotFiles::Entry>> SnapshotFiles::ReadAll()
    const {
  std::vector<Entry> out;
  std::error_code ec;
  if (!std::filesystem::exists(dir_, ec)) return out;
  for (const auto& dirent : std::filesystem::directory_iterator(dir_, ec)) {
    const std::string name = dirent.path().filename().string();
    const std::string path = dirent.path().string();
    if (!name.starts_with(kPrefix)) continue;
    if (EndsWith(name, kTemporarySuffix)) {
      // A replacement the process did not finish: the old file (if any) is
      // the session's.
      std::filesystem::remove(dirent.path(), ec);
      continue;
    }
    if (!EndsWith(name, kSuffix)) continue;
    const std::string id =
        name.substr(sizeof(kPrefix) - 1, name.size() - (sizeof(kPrefix) - 1) -
                                             (sizeof(kSuffix) - 1));
    auto damaged = [&](absl::string_view why) {
      return absl::DataLossError(absl::StrCat(
          "snapshot files: ", path, ": ", why,
          "; refusing to start from it (move it away to start without the "
          "session)"));
    };
    auto read = ReadWholeFile(kWho, path);
    if (!read.ok()) return damaged("cannot be read");
    const std::string& data = *read;
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
        absl::string_view(data).substr(22, id_length) != id) {
      return damaged("it names another session than its file name");
    }
    Entry entry;
    entry.id = id;
    entry.seq = GetLittleEndian<uint64_t>(data.data() + 12);
    entry.blob = data.substr(22 + id_length, data.size() - 22 - id_length - 4);
    entry.path = path;
    out.push_back(std::move(entry));
  }
  if (ec) {
    return absl::InternalError(
        absl::StrCat("snapshot files: listing ", dir_, ": ", ec.message()));
  }
  std::sort(out.begin(), out.end(),
            [](const Entry& a, const Entry& b) { return a.id < b.id; });
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
