// A real linattn-server process on 127.0.0.1 with an ephemeral port (or on
// a unix socket), for integration tests. Started with --listen 127.0.0.1:0
// --port-file; stopped with SIGTERM (then SIGKILL after a bound) when the
// object goes away.
#ifndef LINATTN_TESTS_INTEGRATION_SERVER_PROCESS_H_
#define LINATTN_TESTS_INTEGRATION_SERVER_PROCESS_H_

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace linattn::testing {

class ServerProcess {
 public:
  // Starts the server with `args` added; nullptr if it did not come up
  // within 20 s. `log` (optional) receives its stdout and stderr. `prefix`
  // (optional) runs it through another program (e.g. /usr/bin/prlimit
  // --fsize=N), which must exec it.
  static std::unique_ptr<ServerProcess> Start(
      const std::vector<std::string>& args = {}, const std::string& log = "",
      const std::vector<std::string>& prefix = {}) {
    return StartOn("127.0.0.1:0", args, log, prefix);
  }

  // The same on `listen`: host:port, or unix:PATH (whose port file holds 0
  // once it serves). The HTTP listener is on a free loopback port, or with
  // `default_http` where the server puts it when --http-listen is not given.
  static std::unique_ptr<ServerProcess> StartOn(
      const std::string& listen, const std::vector<std::string>& args = {},
      const std::string& log = "", const std::vector<std::string>& prefix = {},
      bool default_http = false) {
    // The test is the server's client: a connection the server closes
    // while an OpenSSL client writes to it (an mTLS refusal) is an error
    // on that connection, not SIGPIPE ending the test.
    signal(SIGPIPE, SIG_IGN);
    auto p = std::unique_ptr<ServerProcess>(new ServerProcess());
    p->port_file_ = std::filesystem::temp_directory_path() /
                    ("linattn_port_" + std::to_string(::getpid()) + "_" +
                     std::to_string(counter_++));
    std::filesystem::remove(p->port_file_);
    p->http_port_file_ = p->port_file_.string() + "_http";
    std::filesystem::remove(p->http_port_file_);
    const bool unix_socket = listen.rfind("unix:", 0) == 0;
    if (unix_socket) p->address_ = listen;
    std::vector<std::string> argv = {LINATTN_SERVER_BINARY,
                                     "--listen",
                                     listen,
                                     "--port-file",
                                     p->port_file_.string(),
                                     "--http-port-file",
                                     p->http_port_file_.string(),
                                     "--log-level",
                                     "warn"};
    if (!default_http)
      argv.insert(argv.end(), {"--http-listen", "127.0.0.1:0"});
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.begin(), prefix.begin(), prefix.end());
    std::vector<char*> cargv;
    for (std::string& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    if (!log.empty()) {
      posix_spawn_file_actions_addopen(&actions, 1, log.c_str(),
                                       O_WRONLY | O_CREAT | O_TRUNC, 0644);
      posix_spawn_file_actions_adddup2(&actions, 1, 2);
    }
    const int spawned = posix_spawn(&p->pid_, cargv[0], &actions, nullptr,
                                    cargv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (spawned != 0) return nullptr;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      std::ifstream in(p->port_file_);
      if (in >> p->port_ && (p->port_ > 0 || unix_socket)) return p;
      int status = 0;
      if (waitpid(p->pid_, &status, WNOHANG) == p->pid_) {
        p->pid_ = -1;
        return nullptr;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return nullptr;
  }

  ~ServerProcess() {
    if (pid_ > 0) Stop(std::chrono::seconds(10));
    std::filesystem::remove(port_file_);
    std::filesystem::remove(http_port_file_);
  }

  // The HTTP listener's port (written with the gRPC one; 0 if the server
  // was started with --http-listen none).
  int http_port() const {
    int port = 0;
    std::ifstream(http_port_file_) >> port;
    return port;
  }

  std::string address() const {
    return address_.empty() ? "127.0.0.1:" + std::to_string(port_) : address_;
  }
  std::shared_ptr<grpc::Channel> Channel() const {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(256 << 20);
    args.SetMaxSendMessageSize(256 << 20);
    return grpc::CreateCustomChannel(address(),
                                     grpc::InsecureChannelCredentials(), args);
  }
  pid_t pid() const { return pid_; }

  // SIGKILL at once (a crash), and reaped.
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }

  // SIGTERM, then wait up to `bound` (SIGKILL after). Returns the wait
  // status, or -1 if it had to be killed.
  int Stop(std::chrono::milliseconds bound) {
    if (pid_ <= 0) return -1;
    kill(pid_, SIGTERM);
    return Wait(bound);
  }
  int Wait(std::chrono::milliseconds bound) {
    const auto deadline = std::chrono::steady_clock::now() + bound;
    int status = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return status;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return -1;
  }

 private:
  ServerProcess() = default;
  static inline int counter_ = 0;
  pid_t pid_ = -1;
  int port_ = 0;
  std::string address_;  // unix:PATH; empty for 127.0.0.1:port_
  std::filesystem::path port_file_;
  std::filesystem::path http_port_file_;
};

}  // namespace linattn::testing

#endif  // LINATTN_TESTS_INTEGRATION_SERVER_PROCESS_H_
