#include "core/session/local_record_log.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/util/status_macros.h"

namespace linattn {

LocalRecordLog::LocalRecordLog(const LocalRecordLogOptions& options)
    : options_(options),
      journal_dir_((std::filesystem::path(options.dir) / "journal").string()),
      files_((std::filesystem::path(options.dir) / "sessions").string(),
             options.durability != Durability::kOff) {}

absl::StatusOr<std::unique_ptr<LocalRecordLog>> LocalRecordLog::Open(
    const LocalRecordLogOptions& options) {
  if (options.dir.empty()) {
    return absl::InvalidArgumentError("state dir: must not be empty");
  }
  std::unique_ptr<LocalRecordLog> log(new LocalRecordLog(options));
  LINATTN_ASSIGN_OR_RETURN(log->lock_, StateDirLock::Acquire(options.dir));
  LINATTN_RETURN_IF_ERROR(log->files_.Open());
  std::error_code ec;
  std::filesystem::create_directories(log->journal_dir_, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat(
        "state dir: creating ", log->journal_dir_, ": ", ec.message()));
  }
  return log;
}

absl::Status LocalRecordLog::Recover(Replayer& replayer, SessionManager&,
                                     DurableStore&) {
  // Snapshot files first, one in memory at a time: each is where its
  // session's replay starts. Then the journal, one segment at a time.
  LINATTN_RETURN_IF_ERROR(files_.ForEach([&](SnapshotFiles::Entry& f) {
    return replayer.Snapshot(f.id, f.seq, f.blob(), f.path);
  }));
  LINATTN_ASSIGN_OR_RETURN(
      scan_, ReadJournal(journal_dir_, [&](JournalRecord& record) {
        return replayer.Apply(record);
      }));
  replayer.Finish(scan_);
  for (const auto& [id, incarnation] : replayer.snapshots()) {
    on_disk_[id] = incarnation;
  }
  // Records continue after the last one read, and after every file's.
  scan_.next_seq = std::max(scan_.next_seq, replayer.max_covered() + 1);
  next_incarnation_ = replayer.max_incarnation() + 1;
  return absl::OkStatus();
}

absl::Status LocalRecordLog::StartWriting(
    const std::map<std::string, RebuiltSession, std::less<>>& sessions) {
  LINATTN_RETURN_IF_ERROR(RepairJournal(scan_));
  std::lock_guard<std::mutex> write_lock(write_mu_);
  LINATTN_ASSIGN_OR_RETURN(
      writer_, JournalWriter::Open(journal_dir_, scan_.next_seq,
                                   JournalOptions{
                                       .durability = options_.durability,
                                       .sync_interval = options_.sync_interval,
                                       .segment_bytes = options_.segment_bytes,
                                   }));
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, r] : sessions) {
    needs_[id] = Needs{r.incarnation, r.first_needed};
  }
  committed_seq_ = scan_.next_seq - 1;
  segment_starts_.assign(1, writer_->segment_first_seq());
  return absl::OkStatus();
}

RecordLog::CommitResult LocalRecordLog::Commit(
    std::span<const StagedChange> staged, std::span<const Record> records,
    bool) {
  CommitResult result;
  std::lock_guard<std::mutex> write_lock(write_mu_);
  if (writer_ == nullptr) {
    result.status =
        absl::FailedPreconditionError("state dir: the store has not recovered");
    return result;
  }
  struct Seq {
    uint64_t seq = 0;
    bool remove = false;
  };
  std::vector<Seq> seqs;
  auto add = [&](const Record& r, bool create) {
    const std::string body = r.Body();
    seqs.push_back({writer_->Add(static_cast<uint8_t>(r.type), r.id, body),
                    r.type == DurableRecord::kDelete});
    result.written.push_back({r.id, r.incarnation,
                              JournalRecordBytes(body.size(), r.id.size()),
                              create});
  };
  for (const StagedChange& s : staged) {
    if (!s.create) {
      add(DeleteRecord(s.id, s.incarnation), false);
      continue;
    }
    for (const Record& r : CreateRecords(*s.session, s.incarnation)) {
      add(r, true);
    }
  }
  for (const Record& r : records) add(r, false);
  result.status = writer_->Commit();
  result.writes = 1;
  if (!result.status.ok()) {
    result.written.clear();
    return result;
  }
  std::lock_guard<std::mutex> lock(mu_);
  committed_seq_ = writer_->next_seq() - 1;
  if (segment_starts_.empty() ||
      segment_starts_.back() != writer_->segment_first_seq()) {
    segment_starts_.push_back(writer_->segment_first_seq());
    if (segment_starts_.size() > 2) segment_starts_.pop_front();
  }
  for (size_t i = 0; i < result.written.size(); ++i) {
    const Written& w = result.written[i];
    auto it = needs_.find(w.id);
    if (seqs[i].remove) {
      removals_.push_back({w.id, w.incarnation, seqs[i].seq});
      if (it != needs_.end() && it->second.incarnation == w.incarnation) {
        needs_.erase(it);
      }
      continue;
    }
    if (w.create) {
      if (it == needs_.end() || it->second.incarnation != w.incarnation) {
        needs_[w.id] = Needs{w.incarnation, seqs[i].seq};
      }
      continue;
    }
    if (it != needs_.end() && it->second.incarnation == w.incarnation) {
      it->second.first = std::min(it->second.first, seqs[i].seq);
    }
  }
  return result;
}

uint64_t LocalRecordLog::CoveredPosition(const std::string&, uint64_t) const {
  std::lock_guard<std::mutex> lock(mu_);
  return committed_seq_;
}

uint64_t LocalRecordLog::committed_position() const {
  std::lock_guard<std::mutex> lock(mu_);
  return committed_seq_;
}

bool LocalRecordLog::Pinned(const std::string& id, uint64_t incarnation) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (segment_starts_.size() != 2) return false;
  auto it = needs_.find(id);
  return it != needs_.end() && it->second.incarnation == incarnation &&
         it->second.first < segment_starts_.front();
}

absl::Status LocalRecordLog::WriteSnapshots(
    std::span<const SnapshotToStore> taken, std::vector<bool>& written) {
  written.assign(taken.size(), false);
  if (taken.empty()) return absl::OkStatus();
  std::vector<std::string> data;
  std::vector<SnapshotFiles::Replacement> files;
  data.reserve(taken.size());
  files.reserve(taken.size());
  for (const SnapshotToStore& t : taken) {
    data.push_back(IncarnationBytes(t.incarnation) + OwnerSection(t.owner) +
                   std::string(t.blob));
    files.push_back({t.id, t.covered, data.back()});
  }
  LINATTN_RETURN_IF_ERROR(
      files.size() == 1 ? files_.Write(files[0].id, files[0].seq, files[0].blob)
                        : files_.WriteMany(files));
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < taken.size(); ++i) {
    const SnapshotToStore& t = taken[i];
    written[i] = true;
    // On disk even if the session went since it was taken: its deletion's
    // removal (Maintain, this thread) comes after and finds it.
    on_disk_[t.id] = t.incarnation;
    auto it = needs_.find(t.id);
    if (it != needs_.end() && it->second.incarnation == t.incarnation) {
      it->second.first = std::max(it->second.first, t.covered + 1);
    }
  }
  return absl::OkStatus();
}

absl::Status LocalRecordLog::Maintain() {
  std::vector<PendingRemoval> removals;
  {
    std::lock_guard<std::mutex> lock(mu_);
    removals.swap(removals_);
  }
  for (size_t i = 0; i < removals.size(); ++i) {
    const PendingRemoval& r = removals[i];
    auto it = on_disk_.find(r.id);
    if (it == on_disk_.end() || it->second != r.incarnation) continue;
    if (absl::Status s = files_.Remove(r.id); !s.ok()) {
      // Tried again next time; its journal records stay until then.
      std::lock_guard<std::mutex> lock(mu_);
      removals_.insert(removals_.end(), removals.begin() + i, removals.end());
      return s;
    }
    on_disk_.erase(it);
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.files_removed;
  }
  uint64_t needed = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    needed = committed_seq_ + 1;
    for (const auto& [id, n] : needs_) needed = std::min(needed, n.first);
    for (const PendingRemoval& r : removals_) needed = std::min(needed, r.seq);
  }
  std::lock_guard<std::mutex> write_lock(write_mu_);
  if (writer_ == nullptr) return absl::OkStatus();
  const uint64_t before = writer_->disk_bytes();
  LINATTN_RETURN_IF_ERROR(writer_->RemoveSegmentsBefore(needed));
  if (writer_->disk_bytes() < before) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.segments_removed;
  }
  return absl::OkStatus();
}

RecordLog::Stats LocalRecordLog::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

uint64_t LocalRecordLog::journal_disk_bytes() const {
  std::error_code ec;
  uint64_t total = 0;
  for (const auto& dirent :
       std::filesystem::directory_iterator(journal_dir_, ec)) {
    const uint64_t size = std::filesystem::file_size(dirent.path(), ec);
    if (!ec) total += size;
  }
  return total;
}

uint64_t LocalRecordLog::snapshot_disk_bytes() const {
  return files_.disk_bytes();
}

}  // namespace linattn
