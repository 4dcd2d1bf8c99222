// POSIX file operations with their failures as statuses: a full disk (or
// quota, or file size limit) is RESOURCE_EXHAUSTED, anything else INTERNAL;
// messages start with `who` ("journal", "snapshot files") and name the
// path.
#ifndef LINATTN_CORE_UTIL_FILE_IO_H_
#define LINATTN_CORE_UTIL_FILE_IO_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace linattn {

absl::Status ErrnoStatus(absl::string_view who, absl::string_view what,
                         const std::string& path, int err);
// All of `data` to `fd` (retrying short writes and EINTR).
absl::Status WriteAll(absl::string_view who, int fd, absl::string_view data,
                      const std::string& path);
// fsync of a directory, so that entries created, renamed or removed in it
// are durable.
absl::Status SyncDirectory(absl::string_view who, const std::string& dir);
// The whole file.
absl::StatusOr<std::string> ReadWholeFile(absl::string_view who,
                                          const std::string& path);

}  // namespace linattn

#endif  // LINATTN_CORE_UTIL_FILE_IO_H_
