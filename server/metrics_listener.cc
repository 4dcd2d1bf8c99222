#include "server/metrics_listener.h"

#include <chrono>

#include "core/util/status_macros.h"
#include "server/http_frontend.h"

namespace linattn {

absl::StatusOr<std::unique_ptr<MetricsListener>> MetricsListener::Start(
    const ListenAddress& listen, Observability* observability) {
  LINATTN_RETURN_IF_ERROR(CheckCanListen(listen, "--metrics-listen"));
  std::unique_ptr<MetricsListener> m(new MetricsListener());
  httplib::Server& s = m->server_;
  // Scrapes are few: two threads, bodies refused.
  s.new_task_queue = [] { return new httplib::ThreadPool(2); };
  s.set_payload_max_length(0);
  s.Get("/metrics",
        [observability](const httplib::Request&, httplib::Response& res) {
          res.set_content(observability->Scrape(),
                          "text/plain; version=0.0.4; charset=utf-8");
        });
  LINATTN_ASSIGN_OR_RETURN(m->port_,
                           BindHttpListener(s, listen, "--metrics-listen"));
  m->thread_ = std::thread([p = m.get()] {
    p->server_.listen_after_bind();
    p->done_ = true;
  });
  return m;
}

MetricsListener::~MetricsListener() {
  // stop() only stops a server that is listening: wait until it is.
  while (thread_.joinable() && !server_.is_running() && !done_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  server_.stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace linattn
