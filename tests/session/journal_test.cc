#include "core/session/journal.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tests/util/files.h"
#include "tests/util/temp_dir.h"

namespace linattn {
namespace {

using ::testing::HasSubstr;

using testing::ReadFile;
using testing::WriteFile;

std::vector<std::string> SegmentFiles(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Three groups of records, committed; returns the journal's directory.
std::string WriteThreeGroups(const testing::TempDir& tmp,
                             JournalOptions options = {}) {
  const std::string dir = tmp.Path("journal");
  auto writer = JournalWriter::Open(dir, 1, options).value();
  writer->Add(1, "a", "first");
  writer->Add(2, "b", std::string(100, 'x'));
  EXPECT_TRUE(writer->Commit().ok());
  writer->Add(3, "a", "second");
  EXPECT_TRUE(writer->Commit().ok());
  writer->Add(4, "", "");
  writer->Add(5, "c", "third");
  EXPECT_TRUE(writer->Commit().ok());
  return dir;
}

TEST(Journal, RecordsComeBackInOrderAcrossSegmentsAndRestarts) {
  testing::TempDir tmp;
  const std::string dir = WriteThreeGroups(tmp, {.segment_bytes = 64});
  EXPECT_GE(SegmentFiles(dir).size(), 2u) << "small segments rotate";
  auto scan = ReadJournal(dir);
  ASSERT_TRUE(scan.ok()) << scan.status();
  ASSERT_EQ(scan->records.size(), 5u);
  EXPECT_EQ(scan->next_seq, 6u);
  EXPECT_EQ(scan->dropped_tail_bytes, 0u);
  for (uint64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(scan->records[i].seq, i + 1);
    EXPECT_EQ(scan->records[i].type, i + 1);
  }
  EXPECT_EQ(scan->records[1].payload, std::string(100, 'x'));
  EXPECT_EQ(scan->records[3].session_id, "");
  EXPECT_EQ(scan->records[4].session_id, "c");
  // A restart continues in a new segment after the last record.
  {
    auto writer = JournalWriter::Open(dir, scan->next_seq).value();
    writer->Add(6, "d", "after");
    ASSERT_TRUE(writer->Commit().ok());
  }
  auto again = ReadJournal(dir);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_EQ(again->records.size(), 6u);
  EXPECT_EQ(again->records[5].payload, "after");
}

TEST(Journal, AbandonedAndUncommittedGroupsLeaveNothing) {
  testing::TempDir tmp;
  const std::string dir = tmp.Path("j");
  {
    auto writer = JournalWriter::Open(dir, 1).value();
    writer->Add(1, "a", "kept");
    ASSERT_TRUE(writer->Commit().ok());
    writer->Add(1, "a", "dropped");
    writer->Abandon();
    EXPECT_EQ(writer->next_seq(), 2u);
    writer->Add(1, "a", "never committed");
  }
  auto scan = ReadJournal(dir).value();
  ASSERT_EQ(scan.records.size(), 1u);
  EXPECT_EQ(scan.records[0].payload, "kept");
}

// Every cut of the last record is a torn write: dropped, reported, and
// everything before it read.
TEST(Journal, ATornTailIsDroppedAndReported) {
  testing::TempDir tmp;
  const std::string dir = WriteThreeGroups(tmp);
  const std::string segment = SegmentFiles(dir).back();
  const std::string whole = ReadFile(segment);
  const size_t last_record = whole.size() - (12 + 11 + 1 + 5);  // "c", "third"
  for (size_t cut = last_record + 1; cut < whole.size(); ++cut) {
    WriteFile(segment, whole.substr(0, cut));
    auto scan = ReadJournal(dir);
    ASSERT_TRUE(scan.ok()) << "cut at " << cut << ": " << scan.status();
    EXPECT_EQ(scan->records.size(), 4u);
    EXPECT_EQ(scan->dropped_tail_bytes, cut - last_record);
    EXPECT_EQ(scan->dropped_tail_offset, last_record);
  }
  // Repaired, the journal goes on after the torn write and reads cleanly.
  {
    auto scan = ReadJournal(dir).value();
    ASSERT_TRUE(RepairJournal(scan).ok());
    auto writer = JournalWriter::Open(dir, scan.next_seq).value();
    writer->Add(9, "d", "after the crash");
    ASSERT_TRUE(writer->Commit().ok());
    auto again = ReadJournal(dir);
    ASSERT_TRUE(again.ok()) << again.status();
    ASSERT_EQ(again->records.size(), 5u);
    EXPECT_EQ(again->records[4].payload, "after the crash");
    EXPECT_EQ(again->dropped_tail_bytes, 0u);
    std::filesystem::remove(SegmentFiles(dir).back());
  }
  // A last record whose bytes changed, or zeros where it should be.
  std::string flipped = whole;
  flipped[whole.size() - 2] ^= 0x20;
  WriteFile(segment, flipped);
  EXPECT_EQ(ReadJournal(dir).value().records.size(), 4u);
  WriteFile(segment, whole.substr(0, last_record) + std::string(300, '\0'));
  EXPECT_EQ(ReadJournal(dir).value().records.size(), 4u);
}

// Damage anywhere but the tail refuses the journal, naming file and offset.
TEST(Journal, DamageBeforeTheTailIsRefusedWithFileAndOffset) {
  testing::TempDir tmp;
  const std::string dir = WriteThreeGroups(tmp);
  const std::string segment = SegmentFiles(dir).back();
  const std::string whole = ReadFile(segment);
  for (size_t i = 20; i < 20 + 12 + 11 + 1 + 5; ++i) {  // the first record
    std::string altered = whole;
    altered[i] ^= 0x01;
    WriteFile(segment, altered);
    auto scan = ReadJournal(dir);
    EXPECT_EQ(scan.status().code(), absl::StatusCode::kDataLoss) << i;
    EXPECT_THAT(std::string(scan.status().message()),
                HasSubstr(segment + " at byte 20"))
        << i;
  }
  // A bad header, a missing segment.
  std::string bad_magic = whole;
  bad_magic[0] = 'X';
  WriteFile(segment, bad_magic);
  EXPECT_EQ(ReadJournal(dir).status().code(), absl::StatusCode::kDataLoss);
  WriteFile(segment, whole);
  {
    auto writer = JournalWriter::Open(dir, 6).value();
    writer->Add(1, "a", "x");
    ASSERT_TRUE(writer->Commit().ok());
    auto writer2 = JournalWriter::Open(dir, 7).value();
    writer2->Add(1, "a", "y");
    ASSERT_TRUE(writer2->Commit().ok());
  }
  ASSERT_EQ(ReadJournal(dir).value().records.size(), 7u);
  std::filesystem::remove(SegmentFiles(dir)[1]);  // records 6..6
  const absl::Status gap = ReadJournal(dir).status();
  EXPECT_EQ(gap.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(gap.message()), HasSubstr("missing"));
}

// A full disk (here: the file size limit) fails the commit with
// RESOURCE_EXHAUSTED and loses nothing committed before it; the journal
// goes on once there is room. Run in a child process, whose limit does not
// touch the test's own files.
TEST(Journal, AFullDiskFailsTheGroupAndKeepsWhatWasCommitted) {
  testing::TempDir tmp;
  const std::string dir = tmp.Path("j");
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    signal(SIGXFSZ, SIG_IGN);
    auto writer = JournalWriter::Open(dir, 1).value();
    writer->Add(1, "a", std::string(1000, 'k'));
    if (!writer->Commit().ok()) _exit(10);
    const rlimit limit{4096, 4096};
    setrlimit(RLIMIT_FSIZE, &limit);
    writer->Add(1, "a", std::string(10000, 'x'));
    const absl::Status full = writer->Commit();
    if (full.code() != absl::StatusCode::kResourceExhausted) _exit(11);
    writer->Add(1, "a", std::string(500, 'r'));  // fits
    if (!writer->Commit().ok()) _exit(12);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  auto scan = ReadJournal(dir);
  ASSERT_TRUE(scan.ok()) << scan.status();
  ASSERT_EQ(scan->records.size(), 2u);
  EXPECT_EQ(scan->records[0].payload, std::string(1000, 'k'));
  EXPECT_EQ(scan->records[1].payload, std::string(500, 'r'));
  EXPECT_EQ(scan->records[1].seq, 2u);
  EXPECT_EQ(scan->dropped_tail_bytes, 0u);
}

TEST(Journal, RemovingOldSegmentsKeepsTheRest) {
  testing::TempDir tmp;
  const std::string dir = tmp.Path("j");
  auto writer = JournalWriter::Open(dir, 1).value();
  writer->Add(1, "a", "1");
  ASSERT_TRUE(writer->Commit().ok());
  ASSERT_EQ(writer->Rotate().value(), 2u);
  writer->Add(1, "a", "2");
  ASSERT_TRUE(writer->Commit().ok());
  ASSERT_EQ(writer->Rotate().value(), 3u);
  ASSERT_TRUE(writer->RemoveSegmentsBefore(2).ok());
  auto scan = ReadJournal(dir).value();
  ASSERT_EQ(scan.records.size(), 1u);
  EXPECT_EQ(scan.records[0].payload, "2");
  EXPECT_EQ(scan.next_seq, 3u);
  EXPECT_EQ(ParseDurability("batch").value(), Durability::kBatch);
  EXPECT_EQ(ParseDurability("sometimes").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace linattn
