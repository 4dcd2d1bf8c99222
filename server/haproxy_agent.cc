#include "server/haproxy_agent.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace linattn {

absl::StatusOr<std::unique_ptr<HaproxyAgent>> HaproxyAgent::Start(
    const ListenAddress& address, std::function<std::string()> state) {
  auto found = ResolveListenAddress(address, "--haproxy-agent-listen");
  if (!found.ok()) return found.status();
  int fd = -1;
  std::string why = "no address";
  for (addrinfo* a = found->get(); a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 64) != 0) {
      why = std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("--haproxy-agent-listen: cannot listen on ",
                     address.ToString(), ": ", why));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int bound_port =
      bound.ss_family == AF_INET6
          ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
          : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return std::unique_ptr<HaproxyAgent>(
      new HaproxyAgent(fd, bound_port, std::move(state)));
}

HaproxyAgent::HaproxyAgent(int fd, int port, std::function<std::string()> state)
    : fd_(fd), port_(port), state_(std::move(state)) {
  thread_ = std::thread([this] { Loop(); });
}

HaproxyAgent::~HaproxyAgent() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  close(fd_);
}

void HaproxyAgent::Loop() {
  while (!stop_) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    const int client = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    // One line, then close: the agent protocol. A peer that does not read
    // cannot hold the thread (the line fits the socket buffer; MSG_DONTWAIT).
    const std::string line = state_() + "\n";
    (void)send(client, line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    close(client);
  }
}

}  // namespace linattn
