// StateDirLock: one server per state directory. Two servers writing one
// journal would interleave their records and each recover the other's as
// its own, so the directory is locked (flock on DIR/lock) for as long as a
// durable store has it open; the kernel lets go when the process ends, by
// kill -9 too, so a crash never leaves a stale lock behind.
#ifndef LINATTN_CORE_SESSION_STATE_DIR_LOCK_H_
#define LINATTN_CORE_SESSION_STATE_DIR_LOCK_H_

#include <string>

#include "absl/status/statusor.h"

namespace linattn {

class StateDirLock {
 public:
  StateDirLock() = default;
  // Creates `dir` if need be. FAILED_PRECONDITION naming the process that
  // holds it when another one (or another store in this process) does.
  static absl::StatusOr<StateDirLock> Acquire(const std::string& dir);
  StateDirLock(StateDirLock&& other) noexcept : fd_(other.fd_) {
    other.fd_ = -1;
  }
  StateDirLock& operator=(StateDirLock&& other) noexcept;
  StateDirLock(const StateDirLock&) = delete;
  StateDirLock& operator=(const StateDirLock&) = delete;
  ~StateDirLock();

  bool held() const { return fd_ >= 0; }

 private:
  explicit StateDirLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace linattn

#endif  // LINATTN_CORE_SESSION_STATE_DIR_LOCK_H_
