// LinattnServer: the front ends around one Engine (core/engine/engine.h) —
// the gRPC listener with its limits, health and reflection, the HTTP,
// metrics and HAProxy agent listeners, API keys and TLS — and the graceful
// drain. main.cc parses flags and waits for a signal; Start is wiring.
#ifndef LINATTN_SERVER_SERVER_H_
#define LINATTN_SERVER_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/engine/engine.h"
#include "server/attention_service.h"
#include "server/engine_log.h"
#include "server/generation_service.h"
#include "server/haproxy_agent.h"
#include "server/http_frontend.h"
#include "server/listen_address.h"
#include "server/metrics_listener.h"
#include "server/observability.h"
#include "server/redis/shared_store.h"
#include "server/rpc_entry.h"
#include "server/tls.h"

namespace linattn {

struct ServerOptions {
  std::string listen = "127.0.0.1:50051";  // port 0 = pick a free one
  // sessions.max_state_bytes is the one memory budget of both services
  // (core/util/memory_budget.h); Start shares it with the scheduler and the
  // generation engine, whose own budget fields are then not used.
  SessionManagerOptions sessions;
  SchedulerOptions scheduler;
  // Sessions unused this long are deleted; 0 = kept until deleted.
  std::chrono::milliseconds idle_ttl{std::chrono::hours(1)};
  int max_message_bytes = 64 << 20;
  // Transport bounds (docs/design.md, "Bounded memory"): streams one
  // connection may hold open at once, and the memory gRPC's transport may
  // use for all connections together (its resource quota).
  uint32_t max_streams_per_connection = 1024;
  uint64_t transport_memory_bytes = uint64_t{1} << 30;
  // Model directories for GenerationService (none: it serves no models).
  std::vector<std::string> models;
  // A model directory's initial state file (--initial-state), by directory.
  std::map<std::string, std::string> initial_states;
  WeightType weights = WeightType::kF32;  // how their projections are packed
  // The operands of chunkwise prefill's products in both services (the
  // linear rule's; ChunkwiseOptions::precision); Start refuses bf16 on a
  // CPU without native bf16 products.
  PrefillPrecision prefill_precision = PrefillPrecision::kF32;
  // OpenMP threads of the compute worker's team (0 = OpenMP's default).
  int compute_threads = 0;
  GenerationOptions generation;
  // Durable sessions (docs/design.md §4): with a directory, every session
  // is recovered from it before the server serves, and every change is
  // recorded there before it is acknowledged. Empty = memory only.
  DurableStoreOptions durable;
  // Replicas (docs/design.md §4, "Replicas and the shared store"): with a
  // url (redis://HOST:PORT), sessions' records and snapshots go to Redis
  // instead of durable.dir, each session owned by one replica at a time.
  SharedStoreOptions shared;
  // The HAProxy agent-check endpoint (server/haproxy_agent.h); empty = none.
  std::string haproxy_agent_listen;
  // The HTTP listener (server/http_frontend.h); empty or "none" = none
  // (linattn-server's own default is 127.0.0.1:8080).
  std::string http_listen;
  // Its requests served at once; generations (completions, chats,
  // responses, streams included) take at most this − 8 of them.
  int http_threads = 64;
  // The time an HTTP request's headers and body have to arrive
  // (server/http_intake.h).
  int http_request_timeout_ms = 30'000;
  // API keys (server/api_keys.h): with a file, every call of both services
  // and the HTTP listener needs a key, and sessions belong to tenants.
  // Empty = no keys: one anonymous tenant.
  std::string api_keys_file;
  // /metrics on a listener of its own (server/metrics_listener.h); empty =
  // none (the HTTP listener serves /metrics whenever it is on).
  std::string metrics_listen;
  // TLS on the gRPC and HTTP listeners (server/tls.h); off when empty.
  TlsOptions tls;
  // Serve on an address other machines can reach with no credentials
  // checked (no API keys, no client certificates). Refused unless set.
  bool allow_unauthenticated = false;
  // Prefill tensors in co-located clients' memfds
  // (PrefillRequest.shared_memory; docs/design.md, "Shared-memory
  // tensors"). Only with `listen` on a unix socket.
  bool shared_memory = false;
  // Prometheus metrics (server/observability.h); off: /metrics is 404.
  bool metrics = true;
  // How often the maintenance thread looks for sessions to snapshot (and,
  // for Durability::kBatch, syncs: then every durable.sync_interval).
  std::chrono::milliseconds maintenance_period{500};
};

class LinattnServer {
 public:
  // Binds and starts serving; health reports SERVING once this returns.
  static absl::StatusOr<std::unique_ptr<LinattnServer>> Start(
      const ServerOptions& options);
  ~LinattnServer();

  // The address actually bound (with the chosen port when 0 was asked;
  // unix:PATH for a unix socket, whose port() is 0).
  const std::string& address() const { return address_; }
  int port() const { return port_; }
  // The HTTP port (0 without the listener).
  int http_port() const { return http_ != nullptr ? http_->port() : 0; }
  // The HAProxy agent-check port (0 without one).
  int agent_port() const { return agent_ != nullptr ? agent_->port() : 0; }
  // The --metrics-listen port (0 without one).
  int metrics_port() const {
    return metrics_ != nullptr ? metrics_->port() : 0;
  }
  Observability& observability() { return *observability_; }

  // Graceful drain: health turns NOT_SERVING (the listener stays open for
  // probes), new calls get UNAVAILABLE, in-flight calls get until `grace` to
  // finish; then Generate and Decode streams still open end with UNAVAILABLE
  // saying the server is shutting down, the listener closes and queued
  // compute runs out. Blocks until done; idempotent.
  void Drain(std::chrono::milliseconds grace);

  SessionManager& sessions() { return engine_->sessions(); }
  // Reads the API keys file again (SIGHUP); the old keys stay on error.
  absl::Status ReloadKeys() { return keys_->Reload(); }
  // Reads the TLS files again (SIGHUP) for new connections; open ones and
  // sessions go on. OK without TLS.
  absl::Status ReloadTls() {
    return tls_ != nullptr ? tls_->Reload() : absl::OkStatus();
  }
  const TlsIdentity* tls() const { return tls_.get(); }
  // Null without ServerOptions::durable.
  DurableStore* store() { return engine_->store(); }
  const RecoveryReport& recovery() const { return engine_->recovery(); }
  Scheduler& scheduler() { return engine_->scheduler(); }
  GenerationEngine& generation() { return engine_->generation(); }
  Engine& engine() { return *engine_; }

 private:
  LinattnServer() = default;
  // The steps of Start, in order.
  absl::Status LoadCredentials(const ServerOptions& options);
  absl::Status StartEngine(const ServerOptions& options);
  absl::Status ServeGrpc(const ServerOptions& options,
                         const ListenAddress& listen);
  absl::Status StartListeners(const ServerOptions& options);

  std::unique_ptr<ApiKeys> keys_ = std::make_unique<ApiKeys>();
  std::unique_ptr<TlsIdentity> tls_;  // null without TLS
  // Metrics and access logs; outlives everything that reports to it.
  std::unique_ptr<Observability> observability_;
  CallGate gate_;  // admission, drain and in-flight count of every call
  std::unique_ptr<EngineLog> engine_log_;  // outlives the engine
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<AttentionServiceImpl> service_;
  std::unique_ptr<GenerationServiceImpl> generation_service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  int port_ = 0;
  // --listen unix:PATH: the socket file this server bound (device, inode),
  // removed once drained if it is still that file.
  std::string unix_path_;
  uint64_t unix_dev_ = 0, unix_ino_ = 0;
  std::unique_ptr<HaproxyAgent> agent_;       // --haproxy-agent-listen
  std::unique_ptr<HttpFrontend> http_;        // --http-listen
  std::unique_ptr<MetricsListener> metrics_;  // --metrics-listen
  std::mutex mu_;
  bool stopping_ = false;  // guarded by mu_
};

}  // namespace linattn

#endif  // LINATTN_SERVER_SERVER_H_
