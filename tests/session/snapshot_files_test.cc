#include "core/session/snapshot_files.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/session/snapshot.h"
#include "tests/util/files.h"
#include "tests/util/temp_dir.h"

namespace linattn {
namespace {

using ::testing::HasSubstr;

using testing::ReadFile;
using testing::WriteFile;

TEST(SnapshotFiles, WriteReplaceReadAndRemove) {
  testing::TempDir tmp;
  const SnapshotFiles files(tmp.Path("snapshots"), /*sync=*/true);
  ASSERT_TRUE(files.Open().ok());
  ASSERT_TRUE(files.Write("a", 7, "first blob").ok());
  ASSERT_TRUE(files.Write("..", 9, std::string(5000, 'z')).ok());
  ASSERT_TRUE(files.Write("a", 12, "second blob").ok());  // replaces
  EXPECT_TRUE(std::filesystem::exists(tmp.Path("snapshots/session-...snap")));
  auto all = files.ReadAll();
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].id, "..");
  EXPECT_EQ((*all)[0].seq, 9u);
  EXPECT_EQ((*all)[0].blob(), std::string(5000, 'z'));
  EXPECT_EQ((*all)[1].id, "a");
  EXPECT_EQ((*all)[1].seq, 12u);
  EXPECT_EQ((*all)[1].blob(), "second blob");
  EXPECT_EQ(files.disk_bytes(), ReadFile(files.PathOf("a")).size() +
                                    ReadFile(files.PathOf("..")).size());
  ASSERT_TRUE(files.Remove("..").ok());
  ASSERT_TRUE(files.Remove("never-written").ok());
  EXPECT_EQ(files.ReadAll().value().size(), 1u);
  // Not an id: nothing is written outside the directory.
  EXPECT_EQ(files.Write("../x", 1, "blob").code(),
            absl::StatusCode::kInvalidArgument);
}

// The manifest lists every session with a file: one missing is DATA_LOSS
// naming it; files it does not list (a directory from before manifests)
// join it; a removed session's line goes with its file.
TEST(SnapshotFiles, AListedFileThatIsMissingIsNamed) {
  testing::TempDir tmp;
  {
    const SnapshotFiles files(tmp.Path("snapshots"), /*sync=*/true);
    ASSERT_TRUE(files.Open().ok());
    ASSERT_TRUE(files.Write("a", 1, "blob a").ok());
    const SnapshotFiles::Replacement two[] = {{"b", 2, "blob b"},
                                              {"c", 3, "blob c"}};
    ASSERT_TRUE(files.WriteMany(two).ok());
    ASSERT_TRUE(files.Remove("c").ok());
  }
  EXPECT_EQ(ReadFile(tmp.Path("snapshots/MANIFEST")),
            "linattn snapshot files 1\na\nb\nend\n");
  std::filesystem::remove(tmp.Path("snapshots/session-b.snap"));
  {
    const SnapshotFiles files(tmp.Path("snapshots"), /*sync=*/true);
    auto all = files.ReadAll();
    EXPECT_EQ(all.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(all.status().message(), HasSubstr("session 'b'"));
    EXPECT_THAT(all.status().message(),
                HasSubstr(files.PathOf("b") + " is missing"));
  }
  // Without its manifest the directory is read as it is, and gets one.
  std::filesystem::remove(tmp.Path("snapshots/MANIFEST"));
  const SnapshotFiles files(tmp.Path("snapshots"), /*sync=*/true);
  ASSERT_EQ(files.ReadAll().value().size(), 1u);
  EXPECT_EQ(ReadFile(tmp.Path("snapshots/MANIFEST")),
            "linattn snapshot files 1\na\nend\n");
  // A manifest cut short is refused by name.
  WriteFile(tmp.Path("snapshots/MANIFEST"), "linattn snapshot files 1\na\n");
  const SnapshotFiles reread(tmp.Path("snapshots"), /*sync=*/true);
  auto cut = reread.ReadAll();
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(cut.status().message(), HasSubstr("MANIFEST"));
}

TEST(SnapshotFiles, ManyFilesAtOnceAllOrNoneReplaced) {
  testing::TempDir tmp;
  const SnapshotFiles files(tmp.Path("snapshots"), /*sync=*/true);
  ASSERT_TRUE(files.Open().ok());
  ASSERT_TRUE(files.Write("b", 1, "old b").ok());
  const std::string big(70000, 'q');
  const SnapshotFiles::Replacement three[] = {
      {"a", 5, "new a"}, {"b", 6, big}, {"c", 7, "new c"}};
  ASSERT_TRUE(files.WriteMany(three).ok());
  auto all = files.ReadAll().value();
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].blob(), "new a");
  EXPECT_EQ(all[1].blob(), big);
  EXPECT_EQ(all[1].seq, 6u);
  EXPECT_EQ(all[2].blob(), "new c");
  // One that cannot be written: none is replaced, no temporary file stays.
  const SnapshotFiles::Replacement bad[] = {
      {"a", 8, "newer a"}, {"../x", 8, "escape"}, {"c", 8, "newer c"}};
  EXPECT_EQ(files.WriteMany(bad).code(), absl::StatusCode::kInvalidArgument);
  all = files.ReadAll().value();
  EXPECT_EQ(all[0].blob(), "new a");
  EXPECT_EQ(all[2].blob(), "new c");
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e :
       std::filesystem::directory_iterator(tmp.Path("snapshots"))) {
    ++entries;
  }
  EXPECT_EQ(entries, 4u);  // the three files and MANIFEST
}

TEST(SnapshotFiles, AnUnfinishedReplacementLeavesTheOldFile) {
  testing::TempDir tmp;
  const SnapshotFiles files(tmp.Path("s"), true);
  ASSERT_TRUE(files.Open().ok());
  ASSERT_TRUE(files.Write("a", 3, "old").ok());
  WriteFile(tmp.Path("s/session-a.snap.tmp"), "half of a new fi");
  auto all = files.ReadAll().value();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].blob(), "old");
  EXPECT_FALSE(std::filesystem::exists(tmp.Path("s/session-a.snap.tmp")));
}

TEST(SnapshotFiles, ADamagedOrMisnamedFileIsRefusedByName) {
  testing::TempDir tmp;
  const SnapshotFiles files(tmp.Path("s"), false);
  ASSERT_TRUE(files.Open().ok());
  ASSERT_TRUE(files.Write("a", 3, "the blob").ok());
  const std::string path = files.PathOf("a");
  const std::string good = ReadFile(path);
  for (size_t i = 0; i < good.size(); ++i) {
    std::string altered = good;
    altered[i] ^= 0x04;
    WriteFile(path, altered);
    const absl::Status s = files.ReadAll().status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << i;
    EXPECT_THAT(std::string(s.message()), HasSubstr(path)) << i;
  }
  WriteFile(path, good.substr(0, good.size() - 1));
  EXPECT_EQ(files.ReadAll().status().code(), absl::StatusCode::kDataLoss);
  // Intact, but under another session's name.
  WriteFile(path, good);
  WriteFile(files.PathOf("b"), good);
  const absl::Status misnamed = files.ReadAll().status();
  EXPECT_EQ(misnamed.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(misnamed.message()), HasSubstr("another session"));
}

// A full disk fails the write with RESOURCE_EXHAUSTED and leaves the old
// file whole (in a child process, whose file size limit is its own).
TEST(SnapshotFiles, AFullDiskKeepsTheOldFile) {
  testing::TempDir tmp;
  const SnapshotFiles files(tmp.Path("s"), true);
  ASSERT_TRUE(files.Open().ok());
  ASSERT_TRUE(files.Write("a", 3, "old and small").ok());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{4096, 4096};
    setrlimit(RLIMIT_FSIZE, &limit);
    const absl::Status s = files.Write("a", 4, std::string(100000, 'n'));
    _exit(s.code() == absl::StatusCode::kResourceExhausted ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  auto all = files.ReadAll().value();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].seq, 3u);
  EXPECT_EQ(all[0].blob(), "old and small");
  EXPECT_EQ(Crc32Extend(Crc32("1234"), "56789"), Crc32("123456789"));
}

}  // namespace
}  // namespace linattn
