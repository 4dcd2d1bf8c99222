// A real redis-server for a test: on a free loopback port, its data (an
// append-only file, fsync always) in the test's directory, killed with the
// object. Start() again after Kill() brings it back from that file.
#ifndef LINATTN_TESTS_UTIL_REDIS_SERVER_H_
#define LINATTN_TESTS_UTIL_REDIS_SERVER_H_

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "server/redis/redis_client.h"

namespace linattn::testing {

inline int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// redis-server on 127.0.0.1 (AOF, fsync always, in `dir`), for one test.
class RedisServer {
 public:
  explicit RedisServer(std::string dir)
      : dir_(std::move(dir)), port_(FreePort()) {
    Start();
  }
  ~RedisServer() { Kill(); }
  void Start() {
    pid_ = fork();
    if (pid_ == 0) {
      const std::string port = std::to_string(port_);
      execlp("redis-server", "redis-server", "--port", port.c_str(), "--bind",
             "127.0.0.1", "--dir", dir_.c_str(), "--appendonly", "yes",
             "--appendfsync", "always", "--save", "", "--logfile",
             (dir_ + "/redis.log").c_str(), nullptr);
      _exit(127);
    }
    // Ready once it answers.
    RedisClient probe(
        {.host = "127.0.0.1", .port = port_, .db = 0, .text = url()},
        std::chrono::milliseconds(200));
    for (int i = 0; i < 200; ++i) {
      auto r = probe.Run({"PING"});
      if (r.ok() && r->str == "PONG") return;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    ADD_FAILURE() << "redis-server did not start (is it installed? "
                     "scripts/install-deps.sh installs it)";
  }
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  std::string url() const {
    return "redis://127.0.0.1:" + std::to_string(port_);
  }

 private:
  const std::string dir_;
  const int port_;
  pid_t pid_ = -1;
};

}  // namespace linattn::testing

#endif  // LINATTN_TESTS_UTIL_REDIS_SERVER_H_
