// The HAProxy agent-check endpoint (--haproxy-agent-listen): HAProxy
// connects, reads one line, and sets the replica's state from it
// (HAProxy's "agent-check" protocol). linattn answers "up ready" while it
// serves and "drain" once its drain began, so a proxy in front of replicas
// (deploy/haproxy) stops routing sessions to a replica that is shutting
// down within one agent interval, before its listener closes: their next
// requests go to the replicas that take them over. gRPC's own health check
// (grpc.health.v1) says the same to gRPC clients and Kubernetes probes;
// HAProxy cannot speak it.
#ifndef LINATTN_SERVER_HAPROXY_AGENT_H_
#define LINATTN_SERVER_HAPROXY_AGENT_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "server/listen_address.h"

namespace linattn {

class HaproxyAgent {
 public:
  // Listens on `address` (port 0 picks one); `state` gives the line to
  // send ("up ready", "drain", …) when a check connects.
  static absl::StatusOr<std::unique_ptr<HaproxyAgent>> Start(
      const ListenAddress& address, std::function<std::string()> state);
  ~HaproxyAgent();
  HaproxyAgent(const HaproxyAgent&) = delete;
  HaproxyAgent& operator=(const HaproxyAgent&) = delete;

  int port() const { return port_; }

 private:
  HaproxyAgent(int fd, int port, std::function<std::string()> state);
  void Loop();

  const int fd_;
  const int port_;
  const std::function<std::string()> state_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace linattn

#endif  // LINATTN_SERVER_HAPROXY_AGENT_H_
