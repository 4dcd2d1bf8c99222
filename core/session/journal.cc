#include "core/session/journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/session/snapshot.h"
#include "core/util/crc.h"
#include "core/util/file_io.h"
#include "core/util/little_endian.h"
#include "core/util/status_macros.h"

namespace linattn {
namespace {

constexpr char kMagic[8] = {'L', 'N', 'A', 'T', 'J', 'R', 'N', 'L'};
constexpr uint32_t kVersion = 1;
constexpr uint64_t kHeaderBytes = 20;
constexpr uint64_t kRecordHeaderBytes = 12;
// seq, type, id length.
constexpr uint64_t kBodyFixedBytes = 8 + 1 + 2;

std::string SegmentName(uint64_t first_seq) {
  return absl::StrFormat("journal-%020u.log", first_seq);
}

// The first sequence number a segment's name states, or 0 if it is not a
// segment's name.
uint64_t SegmentFirstSeq(const std::string& name) {
  uint64_t seq = 0;
  if (name.size() != 8 + 20 + 4 || name.compare(0, 8, "journal-") != 0 ||
      name.compare(28, 4, ".log") != 0) {
    return 0;
  }
  for (size_t i = 8; i < 28; ++i) {
    if (name[i] < '0' || name[i] > '9') return 0;
    seq = seq * 10 + static_cast<uint64_t>(name[i] - '0');
  }
  return seq;
}

constexpr absl::string_view kWho = "journal";

absl::Status ErrnoStatus(absl::string_view what, const std::string& path,
                         int err) {
  return linattn::ErrnoStatus(kWho, what, path, err);
}

// The segments of `dir`, by first sequence number.
absl::StatusOr<std::vector<std::pair<uint64_t, std::string>>> Segments(
    const std::string& dir) {
  std::vector<std::pair<uint64_t, std::string>> out;
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) return out;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (const uint64_t seq = SegmentFirstSeq(name); seq != 0) {
      out.emplace_back(seq, entry.path().string());
    }
  }
  if (ec) {
    return absl::InternalError(
        absl::StrCat("journal: listing ", dir, ": ", ec.message()));
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

absl::StatusOr<Durability> ParseDurability(absl::string_view name) {
  if (name == "always") return Durability::kAlways;
  if (name == "batch") return Durability::kBatch;
  if (name == "off") return Durability::kOff;
  return absl::InvalidArgumentError(absl::StrCat(
      "durability: '", name, "' is not one of always, batch, off"));
}

absl::string_view DurabilityName(Durability durability) {
  switch (durability) {
    case Durability::kAlways:
      return "always";
    case Durability::kBatch:
      return "batch";
    case Durability::kOff:
      return "off";
  }
  return "?";
}

std::string EncodeJournalRecord(const JournalRecord& record) {
  std::string body;
  body.reserve(kBodyFixedBytes + record.session_id.size() +
               record.payload.size());
  PutLittleEndian<uint64_t>(body, record.seq);
  PutLittleEndian<uint8_t>(body, record.type);
  PutLittleEndian<uint16_t>(body,
                            static_cast<uint16_t>(record.session_id.size()));
  body += record.session_id;
  body += record.payload;
  std::string out;
  out.reserve(kRecordHeaderBytes + body.size());
  PutLittleEndian<uint32_t>(out, static_cast<uint32_t>(body.size()));
  PutLittleEndian<uint32_t>(out, Crc32c(out));  // of the length
  PutLittleEndian<uint32_t>(out, Crc32c(body));
  out += body;
  return out;
}

absl::StatusOr<std::unique_ptr<JournalWriter>> JournalWriter::Open(
    const std::string& dir, uint64_t next_seq, JournalOptions options) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("journal: creating ", dir, ": ", ec.message()));
  }
  std::unique_ptr<JournalWriter> writer(
      new JournalWriter(dir, options, std::max<uint64_t>(next_seq, 1)));
  if (absl::Status s = writer->OpenSegment(); !s.ok()) return s;
  return writer;
}

JournalWriter::~JournalWriter() {
  if (fd_ >= 0) {
    if (unsynced_) ::fdatasync(fd_);
    ::close(fd_);
  }
}

absl::Status JournalWriter::OpenSegment() {
  const std::string path =
      (std::filesystem::path(dir_) / SegmentName(next_seq_)).string();
  const int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus("creating", path, errno);
  std::string header(kMagic, sizeof(kMagic));
  PutLittleEndian<uint32_t>(header, kVersion);
  PutLittleEndian<uint64_t>(header, next_seq_);
  absl::Status s = WriteAll(kWho, fd, header, path);
  if (s.ok() && options_.durability != Durability::kOff &&
      ::fdatasync(fd) != 0) {
    s = ErrnoStatus("syncing", path, errno);
  }
  if (s.ok() && options_.durability != Durability::kOff) {
    s = SyncDirectory(kWho, dir_);
  }
  if (!s.ok()) {
    ::close(fd);
    ::unlink(path.c_str());
    return s;
  }
  if (fd_ >= 0) {
    if (unsynced_ && ::fdatasync(fd_) != 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(path.c_str());
      return ErrnoStatus("syncing", segment_path_, err);
    }
    ::close(fd_);
  }
  fd_ = fd;
  segment_path_ = path;
  segment_length_ = header.size();
  segment_first_seq_ = next_seq_;
  unsynced_ = false;
  last_sync_ = std::chrono::steady_clock::now();
  return absl::OkStatus();
}

uint64_t JournalWriter::Add(uint8_t type, absl::string_view session_id,
                            absl::string_view payload) {
  if (group_.empty()) group_first_seq_ = next_seq_;
  JournalRecord record{.seq = next_seq_++,
                       .type = type,
                       .session_id = std::string(session_id),
                       .payload = std::string(payload)};
  group_ += EncodeJournalRecord(record);
  return record.seq;
}

void JournalWriter::Abandon() {
  if (group_.empty()) return;
  next_seq_ = group_first_seq_;
  group_.clear();
}

absl::Status JournalWriter::Commit() {
  if (group_.empty()) {
    // Nothing new; a batch sync that fell due still happens.
    if (options_.durability == Durability::kBatch && unsynced_ &&
        std::chrono::steady_clock::now() - last_sync_ >=
            options_.sync_interval) {
      if (::fdatasync(fd_) != 0) {
        return ErrnoStatus("syncing", segment_path_, errno);
      }
      unsynced_ = false;
      last_sync_ = std::chrono::steady_clock::now();
    }
    return absl::OkStatus();
  }
  absl::Status s = WriteAll(kWho, fd_, group_, segment_path_);
  bool sync = false;
  if (s.ok()) {
    switch (options_.durability) {
      case Durability::kAlways:
        sync = true;
        break;
      case Durability::kBatch:
        sync = std::chrono::steady_clock::now() - last_sync_ >=
               options_.sync_interval;
        break;
      case Durability::kOff:
        break;
    }
    if (sync && ::fdatasync(fd_) != 0) {
      s = ErrnoStatus("syncing", segment_path_, errno);
    }
  }
  if (!s.ok()) {
    // Whatever part of the group reached the file goes: the segment ends
    // at its last committed record again.
    if (::ftruncate(fd_, static_cast<off_t>(segment_length_)) == 0) {
      ::lseek(fd_, static_cast<off_t>(segment_length_), SEEK_SET);
    }
    Abandon();
    return s;
  }
  segment_length_ += group_.size();
  group_.clear();
  if (sync) {
    unsynced_ = false;
    last_sync_ = std::chrono::steady_clock::now();
  } else {
    unsynced_ = true;
  }
  if (segment_length_ >= options_.segment_bytes) {
    // A full segment is closed after the commit. If the next one cannot be
    // opened, this one stays in use and the rotation is tried again after
    // the next commit.
    absl::Status rotated = OpenSegment();
    (void)rotated;
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> JournalWriter::Rotate() {
  if (!group_.empty()) {
    return absl::FailedPreconditionError(
        "journal: a group is under way; commit it before rotating");
  }
  if (absl::Status s = OpenSegment(); !s.ok()) return s;
  return next_seq_;
}

absl::Status JournalWriter::RemoveSegmentsBefore(uint64_t seq) {
  auto segments = Segments(dir_);
  if (!segments.ok()) return segments.status();
  // A segment's records end where the next one's begin.
  for (size_t i = 0; i + 1 < segments->size(); ++i) {
    if ((*segments)[i + 1].first > seq) break;
    if ((*segments)[i].second == segment_path_) break;
    if (::unlink((*segments)[i].second.c_str()) != 0 && errno != ENOENT) {
      return ErrnoStatus("removing", (*segments)[i].second, errno);
    }
  }
  return absl::OkStatus();
}

uint64_t JournalWriter::disk_bytes() const {
  uint64_t total = 0;
  auto segments = Segments(dir_);
  if (!segments.ok()) return 0;
  for (const auto& [seq, path] : *segments) {
    std::error_code ec;
    const uint64_t size = std::filesystem::file_size(path, ec);
    if (!ec) total += size;
  }
  return total;
}

absl::Status RepairJournal(const JournalScan& scan) {
  if (scan.dropped_tail_bytes == 0) return absl::OkStatus();
  const std::string& path = scan.dropped_tail_file;
  if (scan.dropped_tail_offset == 0) {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return ErrnoStatus("removing", path, errno);
    }
  } else {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus("opening", path, errno);
    int rc = ::ftruncate(fd, static_cast<off_t>(scan.dropped_tail_offset));
    if (rc == 0) rc = ::fdatasync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) return ErrnoStatus("cutting the torn tail of", path, err);
  }
  return SyncDirectory(kWho,
                       std::filesystem::path(path).parent_path().string());
}

absl::StatusOr<JournalScan> ReadJournal(const std::string& dir) {
  std::vector<JournalRecord> records;
  auto scan = ReadJournal(dir, [&](JournalRecord& record) {
    records.push_back(std::move(record));
    return absl::OkStatus();
  });
  if (scan.ok()) scan->records = std::move(records);
  return scan;
}

absl::StatusOr<JournalScan> ReadJournal(
    const std::string& dir,
    const std::function<absl::Status(JournalRecord&)>& visit) {
  JournalScan scan;
  bool any_record = false;
  auto segments = Segments(dir);
  if (!segments.ok()) return segments.status();
  for (size_t si = 0; si < segments->size(); ++si) {
    // (Not a structured binding: the lambdas below capture these.)
    const uint64_t first_seq = (*segments)[si].first;
    const std::string& path = (*segments)[si].second;
    const bool last_segment = si + 1 == segments->size();
    auto read = ReadWholeFile(kWho, path);
    if (!read.ok()) return read.status();
    const std::string& data = *read;
    auto damaged = [&](uint64_t offset, absl::string_view what) {
      return absl::DataLossError(absl::StrCat(
          "journal: ", path, " at byte ", offset, ": ", what,
          "; refusing to recover past damage (move the file away to start "
          "without what it holds)"));
    };
    if (data.size() < kHeaderBytes) {
      if (last_segment && std::string_view(kMagic, sizeof(kMagic))
                              .starts_with(std::string_view(data).substr(
                                  0, std::min<size_t>(8, data.size())))) {
        // A segment whose header was being written when the process died.
        scan.dropped_tail_bytes = data.size();
        scan.dropped_tail_file = path;
        scan.dropped_tail_offset = 0;
        break;
      }
      return damaged(0, "the segment header is cut short");
    }
    if (std::memcmp(data.data(), kMagic, sizeof(kMagic)) != 0) {
      return damaged(0, "not a journal segment (bad magic)");
    }
    if (GetLittleEndian<uint32_t>(data.data() + 8) != kVersion) {
      return damaged(8, absl::StrCat("journal format version ",
                                     GetLittleEndian<uint32_t>(data.data() + 8),
                                     " is not supported (this server reads ",
                                     kVersion, ")"));
    }
    if (GetLittleEndian<uint64_t>(data.data() + 12) != first_seq) {
      return damaged(12,
                     "the header's first sequence number is not the "
                     "file name's");
    }
    if (first_seq != scan.next_seq && !(!any_record && si == 0)) {
      return damaged(0, absl::StrCat("records ", scan.next_seq, " to ",
                                     first_seq - 1, " are missing"));
    }
    scan.next_seq = first_seq;
    uint64_t pos = kHeaderBytes;
    while (pos < data.size()) {
      const uint64_t left = data.size() - pos;
      // A record that does not fit, or whose checksum fails, at the end of
      // the last segment is a torn write; anywhere else it is damage.
      // (A crash can also leave the file extended with zeros where the
      // write did not land.)
      auto zeros_to_end = [&] {
        return std::all_of(data.begin() + static_cast<std::ptrdiff_t>(pos),
                           data.end(), [](char c) { return c == 0; });
      };
      auto torn_or_damaged = [&](uint64_t end,
                                 absl::string_view what) -> absl::Status {
        if (last_segment && (end >= data.size() || zeros_to_end())) {
          scan.dropped_tail_bytes = left;
          scan.dropped_tail_file = path;
          scan.dropped_tail_offset = pos;
          return absl::OkStatus();
        }
        return damaged(pos, what);
      };
      if (left < kRecordHeaderBytes) {
        if (absl::Status s = torn_or_damaged(data.size(), "a cut record");
            !s.ok()) {
          return s;
        }
        break;
      }
      // The length has a checksum of its own: a damaged length is told
      // from a record cut short by the end of the file.
      const uint32_t length = GetLittleEndian<uint32_t>(data.data() + pos);
      if (Crc32c(absl::string_view(data).substr(pos, 4)) !=
          GetLittleEndian<uint32_t>(data.data() + pos + 4)) {
        if (absl::Status s =
                torn_or_damaged(pos + kRecordHeaderBytes,
                                "a record's length fails its checksum");
            !s.ok()) {
          return s;
        }
        break;
      }
      const uint32_t crc = GetLittleEndian<uint32_t>(data.data() + pos + 8);
      const uint64_t end = pos + kRecordHeaderBytes + length;
      if (length < kBodyFixedBytes || length > kMaxJournalRecordBytes) {
        return damaged(pos,
                       absl::StrCat("a record of impossible length ", length));
      }
      if (end > data.size()) {
        if (absl::Status s = torn_or_damaged(end, "a record cut short");
            !s.ok()) {
          return s;
        }
        break;
      }
      const absl::string_view body(data.data() + pos + kRecordHeaderBytes,
                                   length);
      if (Crc32c(body) != crc) {
        if (absl::Status s = torn_or_damaged(end, "a record's checksum fails");
            !s.ok()) {
          return s;
        }
        break;
      }
      JournalRecord record;
      record.seq = GetLittleEndian<uint64_t>(body.data());
      record.type = GetLittleEndian<uint8_t>(body.data() + 8);
      const uint16_t id_length = GetLittleEndian<uint16_t>(body.data() + 9);
      if (kBodyFixedBytes + id_length > length) {
        return damaged(pos, "a record's session id runs past its end");
      }
      if (record.seq != scan.next_seq) {
        return damaged(pos, absl::StrCat("record ", record.seq, " where ",
                                         scan.next_seq, " was due"));
      }
      record.session_id = std::string(body.substr(kBodyFixedBytes, id_length));
      record.payload = std::string(body.substr(kBodyFixedBytes + id_length));
      record.file = path;
      record.offset = pos;
      LINATTN_RETURN_IF_ERROR(visit(record));
      any_record = true;
      ++scan.next_seq;
      pos = end;
    }
    if (scan.dropped_tail_bytes != 0) break;
  }
  return scan;
}

}  // namespace linattn
