// MetricsListener: `/metrics` on a listener of its own (--metrics-listen),
// for a server whose HTTP listener is off or should not be what
// Prometheus reaches. With the HTTP listener on, /metrics is served there
// too (server/http_frontend.h).
#ifndef LINATTN_SERVER_METRICS_LISTENER_H_
#define LINATTN_SERVER_METRICS_LISTENER_H_

#include <httplib.h>

#include <atomic>
#include <memory>
#include <thread>

#include "absl/status/statusor.h"
#include "server/listen_address.h"
#include "server/observability.h"

namespace linattn {

class MetricsListener {
 public:
  static absl::StatusOr<std::unique_ptr<MetricsListener>> Start(
      const ListenAddress& listen, Observability* observability);
  ~MetricsListener();
  int port() const { return port_; }

 private:
  MetricsListener() = default;
  httplib::Server server_;
  std::thread thread_;
  std::atomic<bool> done_{false};
  int port_ = 0;
};

}  // namespace linattn

#endif  // LINATTN_SERVER_METRICS_LISTENER_H_
