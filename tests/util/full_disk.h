// A full disk for a test: `body` runs in a child process whose files may
// grow to `bytes` at most (a write past that fails with EFBIG, which the
// store reports as RESOURCE_EXHAUSTED), and the parent gets the child's
// exit code: `body`'s return value, or -1 if it did not exit normally.
#ifndef LINATTN_TESTS_UTIL_FULL_DISK_H_
#define LINATTN_TESTS_UTIL_FULL_DISK_H_

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <functional>

namespace linattn::testing {

inline int ExitCodeWithFullDisk(uint64_t bytes,
                                const std::function<int()>& body) {
  const pid_t child = fork();
  if (child < 0) return -1;
  if (child == 0) {
    signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{bytes, bytes};
    setrlimit(RLIMIT_FSIZE, &limit);
    _exit(body());
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

}  // namespace linattn::testing

#endif  // LINATTN_TESTS_UTIL_FULL_DISK_H_
