// linattn-server: the gRPC service of docs/design.md §3.
//
//   linattn-server --listen 0.0.0.0:50051 --max-sessions 10000 ...
// Every flag can also come from the environment (LINATTN_LISTEN, …), which
// is how the container is configured. SIGTERM or SIGINT drains: health turns
// NOT_SERVING, new calls are refused, in-flight calls get --grace-period to
// finish, and the process exits 0. A second signal during the drain exits at
// once (status 1). With --state-dir, the drain ends by writing every
// session's snapshot file, so the next start reads files, not the journal;
// with --state-store, it writes every session's snapshot to Redis and gives
// up the replica's lease, so other replicas take its sessions at once.
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "CLI/CLI.hpp"
#include "core/session/session_manager.h"
#include "core/util/byte_size.h"
#include "core/util/flag_checks.h"
#include "core/util/malloc_settings.h"
#include "core/util/openmp_spin.h"
#include "server/listen_address.h"
#include "server/logging.h"
#include "server/server.h"
#include "spdlog/spdlog.h"

namespace {

// The built-in model, found relative to this binary as installed
// (PREFIX/bin → PREFIX/share/linattn/models/tiny) and in the build tree
// (build/bin → build/share/…, which links to the source's models/tiny).
std::string BuiltinModelDir() {
  std::error_code error;
  const std::filesystem::path self =
      std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) return "";
  return (self.parent_path().parent_path() / "share" / "linattn" / "models" /
          "tiny")
      .lexically_normal()
      .string();
}

}  // namespace

int main(int argc, char** argv) {
  linattn::UseShortOpenMpSpin(argv);
  linattn::UseServingMallocSettings();
  // A file size limit (RLIMIT_FSIZE) reached by the state dir's files is a
  // full disk to report (EFBIG → RESOURCE_EXHAUSTED), not a signal that
  // ends the server.
  signal(SIGXFSZ, SIG_IGN);
  // A client that closes its connection while we write to it is an error
  // on that connection, not the end of the server: OpenSSL (the HTTPS
  // listener) writes with write(2), which raises SIGPIPE on a closed
  // socket (gRPC's own writes ask the kernel not to).
  signal(SIGPIPE, SIG_IGN);
  CLI::App app{
      "linattn-server: linear-attention sessions over gRPC (linattn.v1)"};
  app.set_version_flag("--version", "linattn-server " LINATTN_VERSION);
  // A flag given twice: the last one counts (as with most servers), so a
  // wrapper's defaults can be overridden by appending.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  linattn::ServerOptions options;
  int workers = 0;
  std::string max_memory = "4GiB";
  double idle_ttl_s = 3600;
  double grace_s = 10;
  std::string log_level = "info";
  bool log_json = false;
  std::string port_file;
  app.add_option("--listen", options.listen,
                 "host:port to serve on (port 0 picks a free port), or "
                 "unix:/absolute/path for clients on this machine (the "
                 "socket's mode follows the umask); an address another "
                 "process listens on is refused")
      ->envname("LINATTN_LISTEN")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            auto parsed = linattn::ParseListenAddress(text, "--listen",
                                                      /*allow_unix=*/true);
            return parsed.ok() ? ""
                               : std::string(parsed.status().message().substr(
                                     std::string("--listen: ").size()));
          },
          "HOST:PORT|unix:PATH"))
      ->capture_default_str();
  app.add_option("--workers", workers,
                 "compute threads for the kernels (0 = one per core)")
      ->envname("LINATTN_WORKERS")
      ->check(linattn::NumberAtLeast(0, 4096));
  app.add_option("--max-sessions", options.sessions.max_sessions,
                 "most sessions held at once (attention and model sessions "
                 "together)")
      ->envname("LINATTN_MAX_SESSIONS")
      ->capture_default_str();
  app.add_option("--max-state-memory", max_memory,
                 "total recurrent state of all sessions: bytes, or with a "
                 "unit (K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024, "
                 "KB/MB/GB/TB of 1000)")
      ->envname("LINATTN_MAX_STATE_MEMORY")
      ->check(linattn::ByteSize())
      ->capture_default_str();
  app.add_option("--idle-ttl", idle_ttl_s,
                 "delete sessions (both services) unused this many seconds, "
                 "so that clients that vanish cannot fill the server; 0 = "
                 "keep them until deleted")
      ->envname("LINATTN_IDLE_TTL")
      ->check(linattn::NumberAtLeast(0, 1e9))
      ->capture_default_str();
  app.add_option("--max-message-bytes", options.max_message_bytes,
                 "largest request or response message")
      ->envname("LINATTN_MAX_MESSAGE_BYTES")
      ->check(linattn::NumberAtLeast(1024, 1 << 30))
      ->capture_default_str();
  app.add_option(
         "--max-batch", options.scheduler.max_round,
         "requests (one per session) the scheduler runs as one batch; 1 turns "
         "batching off")
      ->envname("LINATTN_MAX_BATCH")
      ->check(linattn::NumberAtLeast(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--prefill-tokens-per-round",
                 options.scheduler.prefill_tokens_per_round,
                 "prefill tokens the scheduler runs per round, shared evenly "
                 "among the sessions prefilling; a longer prefill takes "
                 "several rounds, and other sessions' steps run between them")
      ->envname("LINATTN_PREFILL_TOKENS_PER_ROUND")
      ->check(linattn::NumberAtLeast(1, uint64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--max-streams-per-connection",
                 options.max_streams_per_connection,
                 "streams one client connection may have open at once")
      ->envname("LINATTN_MAX_STREAMS_PER_CONNECTION")
      ->check(linattn::NumberAtLeast(1, 1 << 20))
      ->capture_default_str();
  std::string transport_memory = "1GiB";
  app.add_option("--transport-memory", transport_memory,
                 "memory gRPC's transport may hold for all connections "
                 "together (bytes; KiB/MiB/GiB suffixes)")
      ->envname("LINATTN_TRANSPORT_MEMORY")
      ->check(linattn::ByteSize())
      ->capture_default_str();
  app.add_option("--default-epsilon", options.sessions.default_epsilon,
                 "ε for sessions whose spec leaves it unset")
      ->envname("LINATTN_DEFAULT_EPSILON")
      ->check(linattn::NumberAtLeast(0))
      ->capture_default_str();
  app.add_option("--grace-period", grace_s,
                 "seconds in-flight calls get after SIGTERM/SIGINT (a second "
                 "signal exits at once)")
      ->envname("LINATTN_GRACE_PERIOD")
      ->check(linattn::NumberAtLeast(0, 86400))
      ->capture_default_str();
  app.add_option("--log-level", log_level,
                 "trace | debug | info | warn | error")
      ->envname("LINATTN_LOG_LEVEL")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}))
      ->capture_default_str();
  app.add_flag("--log-json", log_json,
               "one JSON object per log line (access lines carry their "
               "fields at the top level)")
      ->envname("LINATTN_LOG_JSON");
  std::string access_log = "on";
  app.add_option("--access-log", access_log,
                 "one line per gRPC call and HTTP request (method, session, "
                 "tenant, status, latency, tokens in and out), at info "
                 "level: on | off")
      ->envname("LINATTN_ACCESS_LOG")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  const std::string builtin = BuiltinModelDir();
  std::vector<std::string> models;
  app.add_option("--model", models,
                 "model directory (config.json + model.safetensors) for "
                 "GenerationService; repeat for several; \"none\" serves no "
                 "model (default: the built-in model, " +
                     builtin + ")")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->envname("LINATTN_MODEL");
  std::string weights = "f32";
  app.add_option(
         "--weights", weights,
         "how model projection weights are packed: f32; bf16 (half "
         "the bytes per decode step; activations rounded to bf16 before "
         "each product; needs AVX512_BF16 or AMX); or int8 (a quarter; "
         "one scale per output channel, activations quantised per row; "
         "needs AVX512_VNNI or AMX)")
      ->check(CLI::IsMember({"f32", "bf16", "int8"}))
      ->envname("LINATTN_WEIGHTS")
      ->capture_default_str();
  std::string prefill_precision = "f32";
  app.add_option(
         "--prefill-precision", prefill_precision,
         "operands of chunkwise prefill's products (linear-rule layers and "
         "AttentionService sessions): f32; or bf16 (φ(Q), φ(K), V, the "
         "scores and S rounded to bf16 for the products, fp32 sums and "
         "state; error bound in docs/design.md §1; needs AVX512_BF16 or "
         "AMX)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->envname("LINATTN_PREFILL_PRECISION")
      ->capture_default_str();
  app.add_option("--token-budget", options.generation.token_budget,
                 "tokens one generation iteration runs (decode rows first, "
                 "then prompt pieces)")
      ->envname("LINATTN_TOKEN_BUDGET")
      ->check(linattn::NumberAtLeast(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--max-generating", options.generation.max_batch,
                 "generating sessions decoded together in one iteration")
      ->envname("LINATTN_MAX_GENERATING")
      ->check(linattn::NumberAtLeast(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--state-dir", options.durable.dir,
                 "keep sessions durable in this directory: every change is "
                 "recorded there before it is acknowledged, and at start every "
                 "session is recovered from it before the server serves "
                 "(docs/design.md, \"Durable sessions\"); one server per "
                 "directory. none (the default of this binary; `make run` "
                 "and the container give one): sessions live in memory only, "
                 "and a restart loses them")
      ->envname("LINATTN_STATE_DIR");
  std::string durability = "always";
  app.add_option("--durability", durability,
                 "with --state-dir: always = fsync each scheduler round and "
                 "generation iteration before answering (nothing acknowledged "
                 "is lost, even by a power cut); batch = fsync every "
                 "--sync-interval-ms (a crash of the process loses nothing, "
                 "one of the machine up to that window); off = never fsync "
                 "(the page cache decides)")
      ->envname("LINATTN_DURABILITY")
      ->check(CLI::IsMember({"always", "batch", "off"}))
      ->capture_default_str();
  int64_t sync_interval_ms = 100;
  app.add_option("--sync-interval-ms", sync_interval_ms,
                 "with --durability batch: the longest time between fsyncs")
      ->envname("LINATTN_SYNC_INTERVAL_MS")
      ->check(linattn::NumberAtLeast(1, 3'600'000))
      ->capture_default_str();
  app.add_option("--state-store", options.shared.url,
                 "keep sessions in Redis (redis://HOST:PORT[/DB]) instead of "
                 "--state-dir, so that replicas behind a session-hashing "
                 "proxy share them: each session is served by one replica at "
                 "a time, any replica takes over one whose owner died or "
                 "left, and every change is in Redis before it is "
                 "acknowledged (docs/design.md, \"Replicas and the shared "
                 "store\")")
      ->envname("LINATTN_STATE_STORE");
  std::string replica_name;
  app.add_option("--replica-name", replica_name,
                 "with --state-store: this replica's name in the store (a "
                 "random suffix is added, so each start is a new owner); "
                 "default: the host name")
      ->envname("LINATTN_REPLICA_NAME");
  int64_t lease_ms = 2000;
  app.add_option("--lease-ms", lease_ms,
                 "with --state-store: how long this replica's sessions stay "
                 "its own without a heartbeat (renewed every quarter of it); "
                 "a replica that dies is taken over after at most this long")
      ->envname("LINATTN_LEASE_MS")
      ->check(linattn::NumberAtLeast(100, 600'000))
      ->capture_default_str();
  app.add_option("--haproxy-agent-listen", options.haproxy_agent_listen,
                 "HOST:PORT answering HAProxy's agent-check: \"up ready\" "
                 "while serving, \"drain\" once a drain began, so a proxy "
                 "stops routing sessions here before the listener closes "
                 "(deploy/haproxy); default: none")
      ->envname("LINATTN_HAPROXY_AGENT_LISTEN");
  CLI::Option* http_listen =
      app.add_option("--http-listen", options.http_listen,
                     "HOST:PORT of the HTTP listener (OpenAI's API: "
                     "/v1/models, /v1/completions, /v1/chat/completions, "
                     "/v1/responses; /v1/sessions; /health, /tokenize, "
                     "/detokenize; the explorer page at /), or none. "
                     "Default: 127.0.0.1:8080, following --listen: its host "
                     "when a loopback one, and port 8080 + (P - 50051) for "
                     "--listen HOST:P with P >= 50051 (a free port for P = "
                     "0), so servers side by side on their own --listen "
                     "ports get their own HTTP ports")
          ->envname("LINATTN_HTTP_LISTEN");
  app.add_option("--http-threads", options.http_threads,
                 "requests the HTTP listener serves at once (a streamed "
                 "completion holds one for its length); completions, chats "
                 "and responses take at most this - 8, more get 429")
      ->envname("LINATTN_HTTP_THREADS")
      ->check(CLI::Range(9, 4096))
      ->capture_default_str();
  app.add_option("--api-keys", options.api_keys_file,
                 "JSON file of API keys stored as SHA-256 hashes, each naming "
                 "a tenant, its quotas and whether it is admin "
                 "(docs/design.md, \"Tenants and keys\"); every call then "
                 "needs \"authorization: Bearer KEY\", and a session belongs "
                 "to the tenant that created it. SIGHUP reads it again. "
                 "Default: no keys, one anonymous tenant")
      ->envname("LINATTN_API_KEYS")
      ->check(CLI::ExistingFile);
  app.add_option("--metrics-listen", options.metrics_listen,
                 "HOST:PORT serving Prometheus' /metrics on a listener of "
                 "its own (the HTTP listener serves /metrics too when it is "
                 "on); default: none")
      ->envname("LINATTN_METRICS_LISTEN");
  app.add_option("--tls-cert", options.tls.cert,
                 "PEM certificate chain (leaf first): gRPC and HTTP serve TLS "
                 "with it (needs --tls-key); SIGHUP reads it again")
      ->envname("LINATTN_TLS_CERT")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-key", options.tls.key,
                 "PEM private key of --tls-cert's certificate")
      ->envname("LINATTN_TLS_KEY")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-client-ca", options.tls.client_ca,
                 "PEM CA certificates: clients must present a certificate "
                 "one of them signed (mTLS, both listeners)")
      ->envname("LINATTN_TLS_CLIENT_CA")
      ->check(CLI::ExistingFile);
  app.add_flag("--allow-unauthenticated", options.allow_unauthenticated,
               "serve on a non-loopback address without --api-keys or "
               "--tls-client-ca (refused otherwise: anyone who reaches the "
               "server could use every session)")
      ->envname("LINATTN_ALLOW_UNAUTHENTICATED");
  app.add_flag("--shared-memory", options.shared_memory,
               "take Prefill tensors from co-located clients' memfds "
               "(PrefillRequest.shared_memory: read and written by the "
               "server, no copy through the socket); needs --listen "
               "unix:PATH, and not --api-keys: any client of the socket can "
               "name any linattn memfd of the server's user")
      ->envname("LINATTN_SHARED_MEMORY");
  std::string metrics = "on";
  app.add_option("--metrics", metrics,
                 "Prometheus metrics at /metrics: on | off (off also skips "
                 "the latency histograms' work on every call)")
      ->envname("LINATTN_METRICS")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  std::string http_port_file;
  app.add_option("--http-port-file", http_port_file,
                 "write the HTTP listener's bound port here once serving")
      ->envname("LINATTN_HTTP_PORT_FILE");
  app.add_option("--port-file", port_file,
                 "write the bound port here once serving (0 on a unix socket)")
      ->envname("LINATTN_PORT_FILE");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; a usage error exits 2, as is usual.
    return app.exit(e) == 0 ? 0 : 2;
  }

  linattn::SetUpLogging(log_level, log_json, access_log == "on");
  options.metrics = metrics == "on";

  options.sessions.max_state_bytes = *linattn::ParseByteSize(max_memory);
  options.transport_memory_bytes = *linattn::ParseByteSize(transport_memory);
  if (options.transport_memory_bytes < (uint64_t{1} << 20)) {
    std::fprintf(stderr,
                 "--transport-memory: %s is below 1MiB, too little for gRPC to "
                 "serve one connection\nRun with --help for more "
                 "information.\n",
                 transport_memory.c_str());
    return 2;
  }
  if (workers > 0) omp_set_num_threads(workers);  // model loading's threads
  options.compute_threads = workers;
  options.weights = *linattn::ParseWeightType(weights);
  options.prefill_precision =
      *linattn::ParsePrefillPrecision(prefill_precision);
  if (models.empty()) {
    if (std::filesystem::exists(builtin + "/config.json")) {
      options.models.push_back(builtin);
    } else {
      spdlog::warn(
          "the built-in model is not at {} (this binary's ../share); "
          "GenerationService serves no model unless --model names one",
          builtin);
    }
  }
  for (const std::string& dir : models) {
    if (dir != "none" && !dir.empty()) options.models.push_back(dir);
  }
  options.idle_ttl =
      std::chrono::milliseconds(static_cast<int64_t>(idle_ttl_s * 1000));
  if (options.durable.dir == "none") options.durable.dir.clear();
  if (http_listen->count() == 0) {
    // (--listen was checked by its validator.)
    options.http_listen = linattn::DefaultHttpListen(
        *linattn::ParseListenAddress(options.listen, "--listen",
                                     /*allow_unix=*/true));
  }
  options.durable.durability = *linattn::ParseDurability(durability);
  options.durable.sync_interval = std::chrono::milliseconds(sync_interval_ms);
  if (!options.shared.url.empty()) {
    if (replica_name.empty()) {
      char host[256] = {};
      replica_name = gethostname(host, sizeof(host) - 1) == 0 && host[0] != 0
                         ? host
                         : "linattn";
    }
    options.shared.replica =
        replica_name + "-" + linattn::RandomSessionId().substr(0, 8);
    options.shared.lease = std::chrono::milliseconds(lease_ms);
  }

  // Signals are taken by sigwait below, so every thread starts with them
  // blocked. SIGUSR1 is the drain thread telling the main thread it is done.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGUSR1);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto server = linattn::LinattnServer::Start(options);
  if (!server.ok()) {
    spdlog::error("cannot start: {}", std::string(server.status().message()));
    return 1;
  }
  spdlog::info(
      "linattn-server {} listening on {} (compute threads {}, max sessions "
      "{}, max state memory {}, idle ttl {} s)",
      LINATTN_VERSION, (*server)->address(), omp_get_max_threads(),
      options.sessions.max_sessions,
      linattn::FormatByteSize(options.sessions.max_state_bytes), idle_ttl_s);
  if ((*server)->http_port() != 0) {
    spdlog::info("HTTP on port {}", (*server)->http_port());
  }
  // Where sessions live, said once at start: a server whose sessions a
  // restart loses says so.
  if (!options.durable.dir.empty()) {
    spdlog::info("sessions are durable in {} (--durability {})",
                 std::filesystem::absolute(options.durable.dir).string(),
                 durability);
  } else if (options.shared.url.empty()) {
    spdlog::warn(
        "sessions live in memory only: a restart loses them (--state-dir "
        "DIR keeps them; `make run` keeps them in "
        "$XDG_STATE_HOME/linattn)");
  }
  if (!http_port_file.empty()) {
    std::ofstream(http_port_file) << (*server)->http_port() << "\n";
  }
  if (!port_file.empty()) {
    std::ofstream(port_file) << (*server)->port() << "\n";
  }

  int signal_number = 0;
  for (;;) {
    sigwait(&signals, &signal_number);
    if (signal_number == SIGHUP) {
      // Reloads what is read from files; sessions and calls go on.
      if (options.tls.enabled()) {
        const absl::Status s = (*server)->ReloadTls();
        if (s.ok()) {
          spdlog::info("SIGHUP: TLS certificate reloaded: {}",
                       (*server)->tls()->Describe());
        } else {
          spdlog::error("SIGHUP: keeping the TLS certificate in use: {}",
                        std::string(s.message()));
        }
      }
      if (!options.api_keys_file.empty()) {
        const absl::Status s = (*server)->ReloadKeys();
        if (s.ok()) {
          spdlog::info("SIGHUP: API keys reloaded from {}",
                       options.api_keys_file);
        } else {
          spdlog::error("SIGHUP: keeping the API keys in use: {}",
                        std::string(s.message()));
        }
      }
      continue;
    }
    if (signal_number != SIGUSR1) break;
  }
  spdlog::info(
      "signal {}: draining (grace period {} s; a second signal "
      "exits at once)",
      signal_number, grace_s);
  const pthread_t main_thread = pthread_self();
  std::atomic<bool> drained{false};
  std::thread drain([&] {
    (*server)->Drain(
        std::chrono::milliseconds(static_cast<int64_t>(grace_s * 1000)));
    drained.store(true);
    pthread_kill(main_thread, SIGUSR1);
  });
  for (;;) {  // a SIGUSR1 from elsewhere is not the drain's
    sigwait(&signals, &signal_number);
    if (signal_number == SIGUSR1 && drained.load()) break;
    if (signal_number == SIGHUP) continue;  // nothing to reload now
    if (signal_number != SIGUSR1) {
      spdlog::warn("signal {} during the drain: exiting now", signal_number);
      std::fflush(stdout);
      _exit(1);
    }
  }
  drain.join();
  const linattn::SchedulerStats stats = (*server)->scheduler().stats();
  const linattn::GenerationStats gen = (*server)->generation().stats();
  const linattn::Observability::Totals calls =
      (*server)->observability().totals();
  spdlog::info(
      "stopped: attention: {} decode steps in {} batches, {} prefills ({} "
      "tokens) in {} batches; generation: {} generate and {} append "
      "requests, {} prompt tokens, {} tokens generated in {} iterations; "
      "calls: {} gRPC ({} failed), {} HTTP ({} failed)",
      stats.steps, stats.step_batches, stats.prefills, stats.prefill_tokens,
      stats.prefill_batches, gen.generates, gen.appends, gen.prompt_tokens,
      gen.generated_tokens, gen.iterations, calls.grpc_calls, calls.grpc_failed,
      calls.http_requests, calls.http_failed);
  return 0;
}
