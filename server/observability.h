// Observability: the access log and the Prometheus metrics of both
// front ends (docs/design.md, "Metrics and access logs").
//
// Every gRPC call of the services (through CallGate's interceptor,
// server/rpc_entry.h) and every HTTP request (httplib's logger) ends in
// CallEnded: one access line (server/logging.h) and the request metrics.
// Latencies are observed where they happen (decode steps and prefills in
// the services, first token and time between tokens where Generate events
// arrive, scheduler rounds and generation iterations on the compute
// worker, durable commits in the store); gauges and cumulative counts are
// read from the server when /metrics is scraped (Scrape).
//
// Metric names (linattn_…, and the three of the Kubernetes inference
// gateway's model-server protocol, names chosen by the operator in its
// InferencePool: linattn_num_requests_waiting, linattn_num_requests_running,
// linattn_kv_cache_usage_perc — the state in use over the budget, 0 to 1)
// are listed in deploy/prometheus/README.md.
#ifndef LINATTN_SERVER_OBSERVABILITY_H_
#define LINATTN_SERVER_OBSERVABILITY_H_

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "absl/strings/string_view.h"
#include "core/engine/engine.h"

namespace linattn {

// One finished call or request, as the access log reports it.
struct CallRecord {
  absl::string_view protocol;  // "grpc" | "http"
  // gRPC: "linattn.v1.AttentionService/Decode"; HTTP: "POST /v1/sessions".
  std::string method;
  // The metric's labels: gRPC: the service ("AttentionService") and
  // method ("Decode"); HTTP: "http" and the route ("POST /v1/sessions/{id}",
  // "other" for paths no route serves).
  std::string service_label, method_label;
  std::string session;
  std::string tenant;
  std::string status;  // gRPC: the code's name; HTTP: the status number
  int code = 0;        // gRPC code or HTTP status
  bool failed = false;
  double seconds = 0;
  uint64_t tokens_in = 0, tokens_out = 0;
  std::string peer;
};

// What a scrape reads from the server at that moment: the engine's
// readings (sessions, memory, queues, cumulative work) and the calls in
// flight.
struct ServerReadings {
  Engine::Readings engine;
  uint64_t calls_in_flight = 0;
};

class Observability {
 public:
  // `metrics` false: only the access log and the totals (no Prometheus
  // updates; /metrics answers 404).
  explicit Observability(bool metrics = true);
  ~Observability();
  bool metrics() const { return metrics_; }

  // Set once before serving: how a scrape reads the server.
  void set_reader(std::function<void(ServerReadings&)> reader) {
    reader_ = std::move(reader);
  }

  void CallEnded(const CallRecord& call);

  // Seconds each (latencies) and sizes.
  void DecodeStep(double seconds);
  void Prefill(double seconds);
  void FirstToken(double seconds);
  void BetweenTokens(double seconds);
  void SchedulerRound(size_t requests, double seconds);
  void GenerationIteration(size_t rows, double seconds);
  void DurableCommit(double seconds);
  void Evicted(absl::string_view kind, uint64_t sessions);

  // The text exposition format of every metric, gauges read now.
  std::string Scrape();

  // For the shutdown summary.
  struct Totals {
    uint64_t grpc_calls = 0, grpc_failed = 0;
    uint64_t http_requests = 0, http_failed = 0;
  };
  Totals totals() const;

 private:
  const bool metrics_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::function<void(ServerReadings&)> reader_;
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Family<prometheus::Histogram>* request_seconds_;
  prometheus::Family<prometheus::Counter>* evictions_;
  prometheus::Histogram *decode_step_, *prefill_, *first_token_,
      *between_tokens_, *round_seconds_, *round_size_, *iteration_seconds_,
      *iteration_rows_, *durable_commit_;
  prometheus::Gauge *sessions_attention_, *sessions_model_, *tenants_,
      *state_bytes_, *state_budget_, *usage_, *waiting_, *running_, *in_flight_;
  // Counters fed from the server's cumulative counts at each scrape.
  prometheus::Counter *decode_tokens_attention_, *prefill_tokens_attention_,
      *prefill_tokens_model_, *decode_tokens_model_, *durable_commits_,
      *durable_failed_, *durable_bytes_, *snapshots_written_;
  std::mutex scrape_mu_;
  // Guarded by scrape_mu_: the cumulative counts last fed.
  static constexpr size_t kFedCounters = 8;
  std::array<uint64_t, kFedCounters> fed_{};
  std::atomic<uint64_t> grpc_calls_{0}, grpc_failed_{0}, http_requests_{0},
      http_failed_{0};
};

// The HTTP request a listener thread is serving: httplib serves each on
// one thread, its response (a stream included) and its logger too, so what
// the handlers learn is noted here for the access line.
struct HttpCallNote {
  std::chrono::steady_clock::time_point start;
  std::string tenant;
  std::string session;
  uint64_t tokens_in = 0, tokens_out = 0;
};
HttpCallNote& CurrentHttpCall();

// The route an HTTP path is served by, for metric labels: ids become
// "{id}"; anything no route serves is "other".
std::string HttpRouteLabel(absl::string_view method, absl::string_view path);

}  // namespace linattn

#endif  // LINATTN_SERVER_OBSERVABILITY_H_
