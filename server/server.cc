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
#include "server/listen_address.h"
#include "server/redis/redis_shared_store.h"
#include "spdlog/spdlog.h"

namespace linattn {

absl::StatusOr<std::unique_ptr<LinattnServer>> LinattnServer::Start(
    const ServerOptions& options) {
  // The address first: a port in use is found before models load.
  LINATTN_ASSIGN_OR_RETURN(const ListenAddress listen,
                           ParseListenAddress(options.listen, "--listen",
                                              /*allow_unix=*/true));
  LINATTN_RETURN_IF_ERROR(CheckCanListen(listen, "--listen"));
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
  if (!authenticates && !options.allow_unauthenticated) {
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
  }
  std::unique_ptr<LinattnServer> server(new LinattnServer());
  if (!options.api_keys_file.empty()) {
    LINATTN_ASSIGN_OR_RETURN(server->keys_,
                             ApiKeys::Load(options.api_keys_file));
    spdlog::info("API keys from {}: {} key(s) of {} tenant(s)",
                 options.api_keys_file, server->keys_->current()->key_count(),
                 server->keys_->current()->tenants().size());
  }
  server->gate_.set_keys(server->keys_.get());
  if (options.tls.enabled() || !options.tls.client_ca.empty()) {
    LINATTN_ASSIGN_OR_RETURN(server->tls_, TlsIdentity::Load(options.tls));
    spdlog::info("TLS on both listeners with {}{}", server->tls_->Describe(),
                 server->tls_->mutual()
                     ? "; clients must present a certificate of "
                       "--tls-client-ca"
                     : "");
  }
  server->observability_ = std::make_unique<Observability>(options.metrics);
  Observability* const observability = server->observability_.get();
  server->gate_.set_observability(observability);
  // One session table (--max-sessions, --max-state-memory) and one compute
  // worker for both services.
  SessionManagerOptions session_options = options.sessions;
  session_options.max_message_bytes =
      static_cast<uint64_t>(options.max_message_bytes);
  DurableStoreOptions durable = options.durable;
  // A commit that finds sessions taken over (their writes fenced) sends
  // them away as the heartbeat would; either way the operator hears of it.
  durable.on_taken_over = [](size_t sessions) {
    spdlog::warn(
        "state store: {} session(s) were taken over by another replica "
        "while this one's lease had lapsed (their writes were refused); they "
        "leave this replica",
        sessions);
  };
  durable.forward = options.generation.forward;
  durable.forward.chunkwise.precision = options.prefill_precision;
  durable.on_commit = [observability](double seconds) {
    observability->DurableCommit(seconds);
  };
  if (!options.shared.url.empty()) {
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
    durable.shared = std::shared_ptr<SharedStore>(std::move(*shared));
  }
  if (!durable.dir.empty() || durable.shared != nullptr) {
    LINATTN_ASSIGN_OR_RETURN(server->store_, DurableStore::Open(durable));
    session_options.observer = server->store_.get();
  }
  LINATTN_ASSIGN_OR_RETURN(server->sessions_,
                           SessionManager::Create(session_options));
  server->executor_ =
      std::make_shared<ComputeExecutor>(options.compute_threads);
  SchedulerOptions scheduler_options = options.scheduler;
  scheduler_options.chunkwise.precision = options.prefill_precision;
  scheduler_options.budget = server->sessions_->shared_budget();
  scheduler_options.executor = server->executor_;
  scheduler_options.store = server->store_.get();
  scheduler_options.on_round = [observability](size_t requests,
                                               double seconds) {
    observability->SchedulerRound(requests, seconds);
  };
  server->scheduler_ = std::make_unique<Scheduler>(scheduler_options);
  server->service_ = std::make_unique<AttentionServiceImpl>(
      server->sessions_.get(), server->scheduler_.get(), &server->gate_,
      server->store_.get(),
      SharedMemoryOptions{
          .enabled = options.shared_memory,
          .max_tensor_bytes = static_cast<uint64_t>(options.max_message_bytes),
          .max_bytes_in_flight = options.transport_memory_bytes});
  std::vector<std::shared_ptr<const Model>> models;
  for (const std::string& dir : options.models) {
    auto model = Model::Load(dir, "", options.weights);
    if (!model.ok()) {
      return absl::Status(model.status().code(),
                          absl::StrCat("model: ", model.status().message()));
    }
    // A session's snapshot is one message: a model whose sessions could not
    // be snapshotted is refused now, not at the first Snapshot.
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
    models.push_back(std::move(*model));
  }
  if (server->store_ != nullptr) {
    // Every recorded session is back before anything is served.
    LINATTN_ASSIGN_OR_RETURN(
        server->recovery_, server->store_->Recover(*server->sessions_, models));
    const RecoveryReport& r = server->recovery_;
    if (durable.shared != nullptr) {
      spdlog::info(
          "state store {}: replica '{}' (lease {} ms); sessions are loaded "
          "from the store when first asked for",
          options.shared.url, options.shared.replica,
          options.shared.lease.count());
    } else {
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
  }
  GenerationOptions generation_options = options.generation;
  generation_options.forward.chunkwise.precision = options.prefill_precision;
  generation_options.sessions = server->sessions_.get();
  generation_options.store = server->store_.get();
  generation_options.executor = server->executor_;
  generation_options.on_iteration = [observability](size_t rows,
                                                    double seconds) {
    observability->GenerationIteration(rows, seconds);
  };
  server->generation_ =
      std::make_unique<GenerationEngine>(std::move(models), generation_options);
  server->generation_service_ = std::make_unique<GenerationServiceImpl>(
      server->generation_.get(), &server->gate_);
  // How a scrape reads the server (set before any listener is up).
  observability->set_reader([s = server.get()](ServerReadings& r) {
    SessionManager& table = *s->sessions_;
    r.attention_sessions =
        table.List(SessionKind::kAttention, Tenant::Server()).size();
    r.model_sessions = table.List(SessionKind::kModel, Tenant::Server()).size();
    r.tenants = table.tenant_count();
    r.state_bytes = table.state_bytes_in_use();
    r.state_budget_bytes = table.budget().limit();
    const Scheduler::Load attention = s->scheduler_->load();
    const GenerationEngine::Load generation = s->generation_->load();
    r.waiting = attention.waiting + generation.waiting;
    r.running = attention.running + generation.running;
    r.calls_in_flight = s->gate_.in_flight();
    const SchedulerStats stats = s->scheduler_->stats();
    r.decode_steps = stats.steps;
    r.attention_prefill_tokens = stats.prefill_tokens;
    const GenerationStats gen = s->generation_->stats();
    r.model_prompt_tokens = gen.prompt_tokens;
    r.model_generated_tokens = gen.generated_tokens;
    if (s->store_ != nullptr) {
      const DurableStore::Stats d = s->store_->stats();
      r.durable = true;
      r.durable_commits = d.commits;
      r.durable_failed_commits = d.failed_commits;
      r.durable_bytes = d.bytes;
      r.snapshots_written = d.snapshots_written;
    }
  });

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
                           server->tls_ != nullptr
                               ? server->tls_->GrpcCredentials()
                               : grpc::InsecureServerCredentials(),
                           &server->port_);
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(server->gate_.NewInterceptorFactory());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  // Every call's context is a CallContext (its tenant, for the handlers).
  builder.SetContextAllocator(std::make_unique<CallContextAllocator>());
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  builder.RegisterService(server->service_.get());
  builder.RegisterService(server->generation_service_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("--listen: cannot bind ", listen.ToString()));
  }
  if (listen.is_unix()) {
    server->address_ = listen.ToString();
    server->port_ = 0;  // no TCP port (gRPC reports 1 for a unix socket)
    // The socket file this server made, so that a drain removes only it.
    struct stat st {};
    if (lstat(listen.unix_path.c_str(), &st) == 0) {
      server->unix_path_ = listen.unix_path;
      server->unix_dev_ = st.st_dev;
      server->unix_ino_ = st.st_ino;
    }
  } else {
    server->address_ = absl::StrCat(listen.host, ":", server->port_);
  }
  grpc::HealthCheckServiceInterface* health =
      server->server_->GetHealthCheckService();
  health->SetServingStatus("", true);
  health->SetServingStatus("linattn.v1.AttentionService", true);
  health->SetServingStatus("linattn.v1.GenerationService", true);
  if (!options.http_listen.empty() && options.http_listen != "none") {
    HttpFrontendOptions http;
    LINATTN_ASSIGN_OR_RETURN(
        http.listen, ParseListenAddress(options.http_listen, "--http-listen"));
    http.max_body_bytes = static_cast<size_t>(options.max_message_bytes);
    http.threads = options.http_threads;
    http.tls = server->tls_.get();
    // Stored responses are sessions: at most a quarter of the table.
    http.max_stored_responses = static_cast<size_t>(std::clamp<uint64_t>(
        options.sessions.max_sessions / 4, 1, http.max_stored_responses));
    LINATTN_ASSIGN_OR_RETURN(
        server->http_,
        HttpFrontend::Start(http, server->generation_.get(), &server->gate_));
  }
  if (!options.metrics_listen.empty() && options.metrics_listen != "none" &&
      options.metrics) {
    LINATTN_ASSIGN_OR_RETURN(
        const ListenAddress metrics,
        ParseListenAddress(options.metrics_listen, "--metrics-listen"));
    LINATTN_ASSIGN_OR_RETURN(server->metrics_,
                             MetricsListener::Start(metrics, observability));
  }
  if (!options.haproxy_agent_listen.empty()) {
    LINATTN_ASSIGN_OR_RETURN(const ListenAddress agent,
                             ParseListenAddress(options.haproxy_agent_listen,
                                                "--haproxy-agent-listen"));
    CallGate* gate = &server->gate_;
    LINATTN_ASSIGN_OR_RETURN(
        server->agent_, HaproxyAgent::Start(agent, [gate]() -> std::string {
          return gate->draining() ? "drain" : "up ready";
        }));
  }
  if (options.idle_ttl.count() > 0) {
    server->evictor_ = std::thread(
        [s = server.get(), ttl = options.idle_ttl] { s->EvictionLoop(ttl); });
  }
  if (server->store_ != nullptr) {
    std::chrono::milliseconds period = options.maintenance_period;
    if (options.durable.durability == Durability::kBatch) {
      period = std::min(period, options.durable.sync_interval);
    }
    server->maintainer_ =
        std::thread([s = server.get(), period] { s->MaintenanceLoop(period); });
    if (server->store_->shared()) {
      // Heartbeats on a thread of their own (four per lease time), so that
      // a long snapshot pass never lets the lease lapse.
      server->heartbeat_ =
          std::thread([s = server.get(), period = options.shared.lease / 4] {
            s->HeartbeatLoop(period);
          });
      server->handover_ =
          std::thread([s = server.get()] { s->HandOverLoop(); });
    }
  }
  return server;
}

size_t LinattnServer::SnapshotSessions(
    const std::vector<DurableStore::Due>& sessions) {
  // In pieces of at most kSnapshotPieceBytes of blobs, so that snapshotting
  // every session at once (the drain) holds one piece in memory, not a
  // second copy of every state; each piece is written with one sync.
  constexpr uint64_t kSnapshotPieceBytes = uint64_t{64} << 20;
  size_t written = 0;
  for (size_t first = 0; first < sessions.size();) {
    size_t last = first;
    uint64_t bytes = 0;
    while (last < sessions.size() &&
           (last == first ||
            bytes + sessions[last].state_bytes <= kSnapshotPieceBytes)) {
      bytes += sessions[last++].state_bytes;
    }
    written +=
        SnapshotPiece(std::span<const DurableStore::Due>(sessions).subspan(
            first, last - first));
    first = last;
  }
  return written;
}

size_t LinattnServer::SnapshotPiece(std::span<const DurableStore::Due> piece) {
  // Each blob is taken on the compute worker, in its session's order with
  // its other requests, together with the journal position it covers.
  struct Results {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<DurableStore::Taken> taken;
    size_t outstanding = 0;
    bool closed = false;  // the wait is over: late blobs are dropped
  };
  auto results = std::make_shared<Results>();
  DurableStore* store = store_.get();
  auto deliver = [results, store](const DurableStore::Due& due,
                                  absl::StatusOr<std::string> blob,
                                  uint64_t seq) {
    std::lock_guard<std::mutex> lock(results->mu);
    if (!blob.ok() || results->closed) {
      // It may be listed again (a late one once its request has run).
      store->SnapshotAbandoned(due);
    } else {
      results->taken.push_back({due, seq, *std::move(blob)});
    }
    --results->outstanding;
    results->cv.notify_all();
  };
  {
    std::lock_guard<std::mutex> lock(results->mu);
    results->outstanding = piece.size();
  }
  for (const DurableStore::Due& due : piece) {
    if (due.kind == SessionKind::kModel) {
      generation_->SnapshotForStore(
          due.id,
          [due, deliver](absl::StatusOr<std::string> blob, uint64_t seq) {
            deliver(due, std::move(blob), seq);
          });
      continue;
    }
    auto found = sessions_->FindAttention(due.id, Tenant::Server());
    if (!found.ok() || (*found)->incarnation() != due.incarnation) {
      deliver(due, absl::NotFoundError("gone"), 0);
      continue;
    }
    auto taken = std::make_shared<std::pair<std::string, uint64_t>>();
    scheduler_->Run(
        *std::move(found),
        [store, taken](AttentionSession& s) {
          taken->first = SerializeSnapshot(s.spec(), s.state());
          taken->second = store->CoveredPosition(s);
          return absl::OkStatus();
        },
        [due, taken, deliver](absl::Status status) {
          if (!status.ok()) return deliver(due, status, 0);
          deliver(due, std::move(taken->first), taken->second);
        });
  }
  // A session whose queue is held up (a Generate whose client reads
  // slowly) does not hold up the others: what is not taken in time waits
  // for a later pass.
  std::vector<DurableStore::Taken> taken;
  {
    std::unique_lock<std::mutex> lock(results->mu);
    results->cv.wait_for(lock, std::chrono::seconds(10),
                         [&] { return results->outstanding == 0; });
    results->closed = true;
    taken.swap(results->taken);
  }
  if (absl::Status s = store->WriteSnapshots(taken); !s.ok()) {
    spdlog::warn("{}: writing {} snapshot(s): {}", store->label(), taken.size(),
                 std::string(s.message()));
    return 0;
  }
  return taken.size();
}

void LinattnServer::MaintenanceLoop(std::chrono::milliseconds period) {
  std::unique_lock<std::mutex> lock(mu_);
  bool failing = false;
  while (!stop_cv_.wait_for(lock, period, [this] { return stopping_; })) {
    lock.unlock();
    // A batch sync that fell due, and deletions of evicted sessions.
    absl::Status s = store_->Tick();
    if (s.ok()) {
      SnapshotSessions(store_->DueForSnapshot(256));
      s = store_->Maintain();
    }
    if (!s.ok() && !failing) {
      spdlog::warn("{}: {}", store_->label(), std::string(s.message()));
    }
    failing = !s.ok();
    lock.lock();
  }
}

void LinattnServer::Heartbeat() {
  auto lost = store_->Beat();
  if (!lost.ok()) {
    if (!heartbeat_failing_) {
      spdlog::warn("state store: renewing this replica's lease: {}",
                   std::string(lost.status().message()));
    }
    heartbeat_failing_ = true;
    return;
  }
  if (heartbeat_failing_) spdlog::info("state store: reachable again");
  heartbeat_failing_ = false;
  if (!lost->empty()) {
    spdlog::warn(
        "state store: {} session(s) were taken over by other replicas while "
        "this one's lease had lapsed; they leave this replica",
        lost->size());
    (void)store_->HandOver(*lost, /*release=*/false);
  }
}

void LinattnServer::HeartbeatLoop(std::chrono::milliseconds period) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_cv_.wait_for(lock, period, [this] { return stopping_; })) {
    lock.unlock();
    Heartbeat();
    lock.lock();
  }
}

void LinattnServer::HandOverLoop() {
  bool failing = false;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
    }
    auto wanted = store_->AwaitWanted();
    if (!wanted.ok()) {
      if (!failing) {
        spdlog::warn("state store: waiting for other replicas' requests: {}",
                     std::string(wanted.status().message()));
      }
      failing = true;
      std::unique_lock<std::mutex> lock(mu_);
      stop_cv_.wait_for(lock, std::chrono::milliseconds(200),
                        [this] { return stopping_; });
      continue;
    }
    failing = false;
    if (wanted->empty()) continue;
    // Asked for by other replicas: snapshot (so the next owner replays
    // little), then released.
    const size_t written = SnapshotSessions(*wanted);
    const absl::Status s = store_->HandOver(*wanted, /*release=*/true);
    spdlog::info(
        "state store: handed {} session(s) over to the replicas that asked "
        "({} snapshot(s) written){}",
        wanted->size(), written,
        s.ok() ? "" : absl::StrCat("; releasing: ", s.message()));
  }
}

void LinattnServer::EvictionLoop(std::chrono::milliseconds ttl) {
  const auto period = std::clamp(ttl / 4, std::chrono::milliseconds(10),
                                 std::chrono::milliseconds(1000));
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_cv_.wait_for(lock, period, [this] { return stopping_; })) {
    lock.unlock();
    const SessionManager::Evicted n = sessions_->EvictIdle(ttl);
    observability_->Evicted("attention", n.attention);
    observability_->Evicted("model", n.model);
    if (n.attention + n.model != 0) {
      spdlog::info(
          "evicted {} idle attention and {} idle model session(s) (idle ttl "
          "{} ms)",
          n.attention, n.model, ttl.count());
    }
    lock.lock();
  }
}

void LinattnServer::Drain(std::chrono::milliseconds grace) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  stop_cv_.notify_all();
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
      generation_->AbortGenerations(over);
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
  if (evictor_.joinable()) evictor_.join();
  if (maintainer_.joinable()) maintainer_.join();
  if (handover_.joinable()) handover_.join();
  if (heartbeat_.joinable()) heartbeat_.join();
  if (store_ != nullptr && scheduler_ != nullptr && generation_ != nullptr) {
    // Every session into its snapshot file, so that the next start reads
    // files instead of replaying the journal.
    const auto start = std::chrono::steady_clock::now();
    absl::Status s = store_->Tick();
    const std::vector<DurableStore::Due> all = store_->AllSessions();
    const size_t written = s.ok() ? SnapshotSessions(all) : 0;
    if (s.ok()) s = store_->Maintain();
    if (s.ok() && store_->shared()) s = store_->DropLease();
    if (!s.ok()) {
      spdlog::warn("{}: at shutdown: {}", store_->label(),
                   std::string(s.message()));
    }
    spdlog::info(
        "{}: wrote the snapshots of {} of {} session(s) in {:.3f} s",
        store_->label(), written, all.size(),
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count());
  }
  // The HTTP listener answered /health with 503 through the drain.
  http_.reset();
  metrics_.reset();
  if (scheduler_ != nullptr) scheduler_->Shutdown();
}

LinattnServer::~LinattnServer() {
  Drain(std::chrono::milliseconds(0));
  if (server_ != nullptr) server_->Wait();
}

}  // namespace linattn
