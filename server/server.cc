#include "server/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/session/snapshot.h"
#include "core/util/status_macros.h"
#include "grpc_health/v1/health.pb.h"
#include "server/redis/redis_shared_store.h"
#include "server/replica/shared_record_log.h"
#include "spdlog/spdlog.h"

namespace linattn {

namespace {

// The flags that must agree before anything starts: shared memory needs a
// unix socket and no tenants, the prefill precision a CPU that has it, and
// a listener others can reach a way to check who calls.
absl::Status CheckServingOptions(const ServerOptions& options,
                                 const ListenAddress& listen) {
  if (options.shared_memory && listen.unix_path.empty()) {
    return absl::InvalidArgumentError(
        "--shared-memory: needs --listen unix:PATH (a region is named by a "
        "client on this machine, which connects through the socket)");
  }
  if (options.shared_memory && !options.api_keys_file.empty()) {
    // A client can name any linattn memfd the server can open, another
    // tenant's among them.
    return absl::InvalidArgumentError(
        "--shared-memory: not with --api-keys (a client could name another "
        "tenant's region; the socket's clients must trust each other)");
  }
  if (absl::Status s = PrefillPrecisionSupported(options.prefill_precision);
      !s.ok()) {
    // The message names the field; here the flag it comes from.
    absl::string_view why = s.message();
    why.remove_prefix(std::min(why.size(), why.find(':')));
    return absl::Status(s.code(), absl::StrCat("--prefill-precision", why));
  }
  // Sessions are users' contexts: a listener others can reach checks
  // who calls, unless the operator says a proxy in front does.
  const bool authenticates =
      !options.api_keys_file.empty() || !options.tls.client_ca.empty();
  if (authenticates || options.allow_unauthenticated) return absl::OkStatus();
  std::vector<std::pair<const char*, std::string>> listeners = {
      {"--listen", options.listen}};
  if (!options.http_listen.empty() && options.http_listen != "none") {
    listeners.push_back({"--http-listen", options.http_listen});
  }
  for (const auto& [flag, text] : listeners) {
    LINATTN_ASSIGN_OR_RETURN(
        const ListenAddress address,
        ParseListenAddress(text, flag, std::string_view(flag) == "--listen"));
    if (address.IsLoopback()) continue;
    return absl::FailedPreconditionError(absl::StrCat(
        flag, ": ", text,
        " is not a loopback address, and this server checks no "
        "credentials: anyone who reaches it could read, change or delete "
        "every session. Give --api-keys FILE (LINATTN_API_KEYS; "
        "deploy/README.md says how from a secret) or --tls-client-ca, or "
        "--allow-unauthenticated to serve anyway (behind a proxy that "
        "authenticates)"));
  }
  return absl::OkStatus();
}

// The models of --model, each checked against the message size (a session's
// snapshot is one message) and the others' names.
absl::StatusOr<std::vector<std::shared_ptr<const Model>>> LoadModels(
    const ServerOptions& options) {
  std::vector<std::shared_ptr<const Model>> models;
  for (const std::string& dir : options.models) {
    const auto state = options.initial_states.find(dir);
    auto model =
        Model::Load(dir, "", options.weights,
                    state == options.initial_states.end() ? "" : state->second);
    if (!model.ok()) {
      return absl::Status(model.status().code(),
                          absl::StrCat("model: ", model.status().message()));
    }
    const uint64_t snapshot = ModelSnapshotBytes(**model) + 64;
    if (snapshot > static_cast<uint64_t>(options.max_message_bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--max-message-bytes: ", options.max_message_bytes,
          " is less than a snapshot of a session of model '", (*model)->name(),
          "' (", snapshot, " bytes with its framing)"));
    }
    for (const auto& other : models) {
      if (other->name() == (*model)->name()) {
        return absl::InvalidArgumentError(
            absl::StrCat("model: two models are named '", other->name(), "' (",
                         other->dir(), " and ", dir, ")"));
      }
    }
    const ModelConfig& config = (*model)->config();
    // The feature map is linear_attn's; the other types name their rule.
    const std::string mixer =
        config.type == ModelType::kLinearAttn
            ? absl::StrCat("feature map ",
                           ModelFeatureMapName(config.feature_map),
                           config.norm_feature_map ? " (normalised)" : "")
            : std::string(ModelTypeName(config.type));
    spdlog::info(
        "model '{}' from {}: {}, {} layers, hidden {}, {} heads, {} "
        "parameters ({} weights), {} tokenizer, {} bytes of state per "
        "session, fingerprint {}",
        (*model)->name(), dir, mixer, config.num_hidden_layers,
        config.hidden_size, config.num_heads, (*model)->parameter_count(),
        WeightTypeName((*model)->weight_type()), (*model)->tokenizer().kind(),
        (*model)->state_bytes(), (*model)->fingerprint_hex());
    if (config.is_hybrid()) {
      spdlog::info("model '{}': {}", (*model)->name(), HybridSummary(**model));
    }
    if (!(*model)->initial_state_file().empty()) {
      spdlog::info(
          "model '{}': new sessions start from the initial state in {} "
          "(held once, {} bytes)",
          (*model)->name(), (*model)->initial_state_file(),
          (*model)->attention_state_bytes());
    }
    if (!(*model)->ignored_note().empty()) {
      spdlog::info("model '{}': {}", (*model)->name(),
                   (*model)->ignored_note());
    }
    if ((*model)->chat_template().kind() == ChatTemplate::Kind::kRefused) {
      spdlog::warn("model '{}': chat template {}", (*model)->name(),
                   (*model)->chat_template_note());
    } else {
      spdlog::info("model '{}': chat template {}", (*model)->name(),
                   (*model)->chat_template_note());
    }
    models.push_back(std::move(*model));
  }
  return models;
}

// Where sessions are kept: --state-dir, or the shared store of
// --state-store (opened here: only the server links Redis), not both.
absl::StatusOr<DurableStoreOptions> StoreOptions(const ServerOptions& options) {
  DurableStoreOptions durable = options.durable;
  if (options.shared.url.empty()) return durable;
  if (!durable.dir.empty()) {
    return absl::InvalidArgumentError(
        "--state-store: sessions are kept in the state store or in "
        "--state-dir (LINATTN_STATE_DIR), not both; give one (--state-dir "
        "none turns the directory off)");
  }
  auto shared = RedisSharedStore::Open(options.shared);
  if (!shared.ok()) {
    return absl::Status(
        shared.status().code(),
        absl::StrCat("--state-store: ", shared.status().message()));
  }
  durable.log = std::make_shared<SharedRecordLog>(std::move(*shared));
  return durable;
}

void LogRecovery(const ServerOptions& options, const RecoveryReport& r) {
  if (!options.shared.url.empty()) {
    spdlog::info(
        "state store {}: replica '{}' (lease {} ms); sessions are loaded "
        "from the store when first asked for",
        options.shared.url, options.shared.replica,
        options.shared.lease.count());
    return;
  }
  spdlog::info(
      "state dir {} ({} durability): recovered {} attention and {} model "
      "session(s) from {} snapshot file(s) and {} journal record(s) ({} "
      "replayed) in {:.3f} s",
      options.durable.dir,
      std::string(DurabilityName(options.durable.durability)),
      r.attention_sessions, r.model_sessions, r.snapshot_files, r.records,
      r.replayed, r.seconds);
  if (r.dropped_tail_bytes > 0) {
    spdlog::warn(
        "state dir: dropped a torn write of {} byte(s) at the end of the "
        "journal ({} at byte {}): a crash cut it short before it was "
        "acknowledged",
        r.dropped_tail_bytes, r.dropped_tail_file, r.dropped_tail_offset);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<LinattnServer>> LinattnServer::Start(
    const ServerOptions& options) {
  // The address first: a port in use is found before models load.
  LINATTN_ASSIGN_OR_RETURN(const ListenAddress listen,
                           ParseListenAddress(options.listen, "--listen",
                                              /*allow_unix=*/true));
  LINATTN_RETURN_IF_ERROR(CheckCanListen(listen, "--listen"));
  LINATTN_RETURN_IF_ERROR(CheckServingOptions(options, listen));
  std::unique_ptr<LinattnServer> server(new LinattnServer());
  LINATTN_RETURN_IF_ERROR(server->LoadCredentials(options));
  server->observability_ = std::make_unique<Observability>(options.metrics);
  server->gate_.set_observability(server->observability_.get());
  LINATTN_RETURN_IF_ERROR(server->StartEngine(options));
  LINATTN_RETURN_IF_ERROR(server->ServeGrpc(options, listen));
  LINATTN_RETURN_IF_ERROR(server->StartListeners(options));
  return server;
}

absl::Status LinattnServer::LoadCredentials(const ServerOptions& options) {
  if (!options.api_keys_file.empty()) {
    LINATTN_ASSIGN_OR_RETURN(keys_, ApiKeys::Load(options.api_keys_file));
    spdlog::info("API keys from {}: {} key(s) of {} tenant(s)",
                 options.api_keys_file, keys_->current()->key_count(),
                 keys_->current()->tenants().size());
  }
  gate_.set_keys(keys_.get());
  if (options.tls.enabled() || !options.tls.client_ca.empty()) {
    LINATTN_ASSIGN_OR_RETURN(tls_, TlsIdentity::Load(options.tls));
    spdlog::info("TLS on both listeners with {}{}", tls_->Describe(),
                 tls_->mutual() ? "; clients must present a certificate of "
                                  "--tls-client-ca"
                                : "");
  }
  return absl::OkStatus();
}

absl::Status LinattnServer::StartEngine(const ServerOptions& options) {
  EngineOptions engine;
  // One session table (--max-sessions, --max-state-memory) and one compute
  // worker for both services.
  engine.sessions = options.sessions;
  engine.sessions.max_message_bytes =
      static_cast<uint64_t>(options.max_message_bytes);
  engine.scheduler = options.scheduler;
  engine.generation = options.generation;
  engine.prefill_precision = options.prefill_precision;
  engine.compute_threads = options.compute_threads;
  engine.idle_ttl = options.idle_ttl;
  engine.periods.upkeep = options.maintenance_period;
  LINATTN_ASSIGN_OR_RETURN(engine.durable, StoreOptions(options));
  LINATTN_ASSIGN_OR_RETURN(engine.models, LoadModels(options));
  const bool durable =
      !engine.durable.dir.empty() || engine.durable.log != nullptr;
  engine_log_ = std::make_unique<EngineLog>(
      observability_.get(),
      engine.durable.log != nullptr ? "state store" : "state dir");
  engine.events = engine_log_.get();
  LINATTN_ASSIGN_OR_RETURN(engine_, Engine::Create(std::move(engine)));
  if (durable) LogRecovery(options, engine_->recovery());
  service_ = std::make_unique<AttentionServiceImpl>(
      &engine_->attention(), &gate_,
      SharedMemoryOptions{
          .enabled = options.shared_memory,
          .max_tensor_bytes = static_cast<uint64_t>(options.max_message_bytes),
          .max_bytes_in_flight = options.transport_memory_bytes});
  generation_service_ =
      std::make_unique<GenerationServiceImpl>(&engine_->generation(), &gate_);
  // How a scrape reads the server (set before any listener is up).
  observability_->set_reader(
      [e = engine_.get(), gate = &gate_](ServerReadings& r) {
        r.engine = e->Read();
        r.calls_in_flight = gate->in_flight();
      });
  return absl::OkStatus();
}

absl::Status LinattnServer::ServeGrpc(const ServerOptions& options,
                                      const ListenAddress& listen) {
  // Health answers through gRPC's own implementation, which registers no
  // schema; naming the generated one links it in, so that reflection can
  // describe grpc.health.v1.Health to clients that discover services.
  grpc::health::v1::HealthCheckRequest::descriptor();
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // gRPC would share the port with another process bound with
  // SO_REUSEPORT, and the kernel would split connections (and so sessions)
  // between the two servers.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Bounded transport memory. A stream's receive window stays at HTTP/2's
  // 64 KiB (no BDP probing growing it to megabytes), so a client that sends
  // without reading parks at most that beyond the one message the server
  // has asked for; streams per connection are capped; and the resource
  // quota bounds what all connections hold together (under pressure gRPC
  // shrinks windows and closes idle connections).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  builder.AddChannelArgument(
      GRPC_ARG_MAX_CONCURRENT_STREAMS,
      static_cast<int>(options.max_streams_per_connection));
  grpc::ResourceQuota quota("linattn-server");
  quota.Resize(static_cast<size_t>(options.transport_memory_bytes));
  builder.SetResourceQuota(quota);
  if (listen.is_unix()) {
    // Again just before binding: gRPC replaces whatever socket is at the
    // path, and the first check ran before the models loaded.
    LINATTN_RETURN_IF_ERROR(CheckCanListen(listen, "--listen"));
  }
  builder.AddListeningPort(listen.ToString(),
                           tls_ != nullptr ? tls_->GrpcCredentials()
                                           : grpc::InsecureServerCredentials(),
                           &port_);
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(gate_.NewInterceptorFactory());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  // Every call's context is a CallContext (its tenant, for the handlers).
  builder.SetContextAllocator(std::make_unique<CallContextAllocator>());
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  builder.RegisterService(service_.get());
  builder.RegisterService(generation_service_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("--listen: cannot bind ", listen.ToString()));
  }
  if (listen.is_unix()) {
    address_ = listen.ToString();
    port_ = 0;  // no TCP port (gRPC reports 1 for a unix socket)
    // The socket file this server made, so that a drain removes only it.
    struct stat st {};
    if (lstat(listen.unix_path.c_str(), &st) == 0) {
      unix_path_ = listen.unix_path;
      unix_dev_ = st.st_dev;
      unix_ino_ = st.st_ino;
    }
  } else {
    address_ = absl::StrCat(listen.host, ":", port_);
  }
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  health->SetServingStatus("", true);
  health->SetServingStatus("linattn.v1.AttentionService", true);
  health->SetServingStatus("linattn.v1.GenerationService", true);
  return absl::OkStatus();
}

absl::Status LinattnServer::StartListeners(const ServerOptions& options) {
  if (!options.http_listen.empty() && options.http_listen != "none") {
    HttpFrontendOptions http;
    LINATTN_ASSIGN_OR_RETURN(
        http.listen, ParseListenAddress(options.http_listen, "--http-listen"));
    http.max_body_bytes = static_cast<size_t>(options.max_message_bytes);
    http.threads = options.http_threads;
    http.request_timeout =
        std::chrono::milliseconds(options.http_request_timeout_ms);
    http.tls = tls_.get();
    // Stored responses are sessions: each tenant's at most a quarter of the
    // table.
    http.max_stored_responses = static_cast<size_t>(std::clamp<uint64_t>(
        options.sessions.max_sessions / 4, 1, http.max_stored_responses));
    LINATTN_ASSIGN_OR_RETURN(
        http_, HttpFrontend::Start(http, &engine_->generation(), &gate_));
  }
  if (!options.metrics_listen.empty() && options.metrics_listen != "none" &&
      options.metrics) {
    LINATTN_ASSIGN_OR_RETURN(
        const ListenAddress metrics,
        ParseListenAddress(options.metrics_listen, "--metrics-listen"));
    LINATTN_ASSIGN_OR_RETURN(
        metrics_, MetricsListener::Start(metrics, observability_.get()));
  }
  if (!options.haproxy_agent_listen.empty()) {
    LINATTN_ASSIGN_OR_RETURN(const ListenAddress agent,
                             ParseListenAddress(options.haproxy_agent_listen,
                                                "--haproxy-agent-listen"));
    CallGate* gate = &gate_;
    LINATTN_ASSIGN_OR_RETURN(
        agent_, HaproxyAgent::Start(agent, [gate]() -> std::string {
          return gate->draining() ? "drain" : "up ready";
        }));
  }
  return absl::OkStatus();
}

void LinattnServer::Drain(std::chrono::milliseconds grace) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (server_ != nullptr) {  // null when Start failed before serving
    // Readiness goes first: health says NOT_SERVING on the open listener,
    // so probes and load balancers see the drain, and new calls are
    // refused with the reason (server/rpc_entry.h).
    server_->GetHealthCheckService()->Shutdown();
    gate_.Drain();
    // A Decode stream is in flight only while a step of it runs: one waiting
    // for its client's next message ends now, and one with a step running
    // ends once that step's response is written. Generate streams and
    // unary calls get the grace period.
    service_->AbortStreams(absl::UnavailableError(
        "the server is shutting down; open a new stream to another replica "
        "(every step answered so far is in the session)"));
    const auto deadline = std::chrono::steady_clock::now() + grace;
    bool idle = gate_.WaitIdle(deadline);
    if (!idle) {
      // The grace period is over: what still runs ends with a status that
      // says why, not with gRPC's "Cancelling all calls".
      const absl::Status over = absl::UnavailableError(
          "the server is shutting down and its grace period ended before "
          "this call did");
      spdlog::info("grace period over: ending {} call(s) still in flight",
                   gate_.in_flight());
      engine_->AbortGenerations(over);
      service_->AbortStreams(over);
      idle = gate_.WaitIdle(std::chrono::steady_clock::now() +
                            std::chrono::milliseconds(500));
    }
    // Idle connections (and ones that never finished their handshake) are
    // closed at once; calls still in flight get half a second more.
    server_->Shutdown(
        std::chrono::system_clock::now() +
        (idle ? std::chrono::milliseconds(0) : std::chrono::milliseconds(500)));
    // gRPC leaves a unix socket's file behind; a client that finds none
    // knows at once that nobody serves there.
    struct stat st {};
    if (!unix_path_.empty() && lstat(unix_path_.c_str(), &st) == 0 &&
        S_ISSOCK(st.st_mode) && st.st_dev == unix_dev_ &&
        st.st_ino == unix_ino_) {
      unlink(unix_path_.c_str());
    }
    unix_path_.clear();
  }
  // Eviction and the store's upkeep stop; every session goes into its
  // snapshot; queued compute runs out.
  if (engine_ != nullptr) engine_->Drain();
  // The HTTP listener answered /health with 503 through the drain.
  http_.reset();
  metrics_.reset();
}

LinattnServer::~LinattnServer() {
  Drain(std::chrono::milliseconds(0));
  if (server_ != nullptr) server_->Wait();
}

}  // namespace linattn
