#include "server/flags.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/model/model.h"
#include "core/session/session_manager.h"
#include "core/util/byte_size.h"
#include "core/util/flag_checks.h"
#include "server/listen_address.h"
#include "spdlog/spdlog.h"

namespace linattn {

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

// The listener, compute threads, limits, the drain.
void DefineServingFlags(CLI::App& app, ServerFlags& f) {
  app.add_option("--listen", f.options.listen,
                 "host:port to serve on (port 0 picks a free port), or "
                 "unix:/absolute/path for clients on this machine (the "
                 "socket's mode follows the umask); an address another "
                 "process listens on is refused")
      ->envname("LINATTN_LISTEN")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            auto parsed = ParseListenAddress(text, "--listen",
                                             /*allow_unix=*/true);
            return parsed.ok() ? ""
                               : std::string(parsed.status().message().substr(
                                     std::string("--listen: ").size()));
          },
          "HOST:PORT|unix:PATH"))
      ->capture_default_str();
  app.add_option("--workers", f.workers,
                 "compute threads for the kernels (0 = one per core)")
      ->envname("LINATTN_WORKERS")
      ->check(NumberAtLeast(0, 4096));
  app.add_option("--max-sessions", f.options.sessions.max_sessions,
                 "most sessions held at once (attention and model sessions "
                 "together)")
      ->envname("LINATTN_MAX_SESSIONS")
      ->capture_default_str();
  app.add_option("--max-state-memory", f.max_memory,
                 "total state of all sessions (recurrent state, and a "
                 "hybrid model's keys and values as they grow) and of "
                 "requests' working copies: bytes, or with a unit (K/M/G/T "
                 "and KiB/MiB/GiB/TiB are powers of 1024, KB/MB/GB/TB of "
                 "1000)")
      ->envname("LINATTN_MAX_STATE_MEMORY")
      ->check(ByteSize())
      ->capture_default_str();
  app.add_option("--idle-ttl", f.idle_ttl_s,
                 "delete sessions (both services) unused this many seconds, "
                 "so that clients that vanish cannot fill the server; 0 = "
                 "keep them until deleted")
      ->envname("LINATTN_IDLE_TTL")
      ->check(NumberAtLeast(0, 1e9))
      ->capture_default_str();
  app.add_option("--max-message-bytes", f.options.max_message_bytes,
                 "largest request or response message")
      ->envname("LINATTN_MAX_MESSAGE_BYTES")
      ->check(NumberAtLeast(1024, 1 << 30))
      ->capture_default_str();
  app.add_option(
         "--max-batch", f.options.scheduler.max_round,
         "requests (one per session) the scheduler runs as one batch; 1 turns "
         "batching off")
      ->envname("LINATTN_MAX_BATCH")
      ->check(NumberAtLeast(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--prefill-tokens-per-round",
                 f.options.scheduler.prefill_tokens_per_round,
                 "prefill tokens the scheduler runs per round, shared evenly "
                 "among the sessions prefilling; a longer prefill takes "
                 "several rounds, and other sessions' steps run between them")
      ->envname("LINATTN_PREFILL_TOKENS_PER_ROUND")
      ->check(NumberAtLeast(1, uint64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--max-streams-per-connection",
                 f.options.max_streams_per_connection,
                 "streams one client connection may have open at once")
      ->envname("LINATTN_MAX_STREAMS_PER_CONNECTION")
      ->check(NumberAtLeast(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--transport-memory", f.transport_memory,
                 "memory gRPC's transport may hold for all connections "
                 "together (bytes; KiB/MiB/GiB suffixes)")
      ->envname("LINATTN_TRANSPORT_MEMORY")
      ->check(ByteSize())
      ->capture_default_str();
  app.add_option("--default-epsilon", f.options.sessions.default_epsilon,
                 "ε for sessions whose spec leaves it unset")
      ->envname("LINATTN_DEFAULT_EPSILON")
      ->check(NumberAtLeast(0))
      ->capture_default_str();
  app.add_option("--grace-period", f.grace_s,
                 "seconds in-flight calls get after SIGTERM/SIGINT (a second "
                 "signal exits at once)")
      ->envname("LINATTN_GRACE_PERIOD")
      ->check(NumberAtLeast(0, 86400))
      ->capture_default_str();
}

// Logs.
void DefineLogFlags(CLI::App& app, ServerFlags& f) {
  app.add_option("--log-level", f.log_level,
                 "trace | debug | info | warn | error")
      ->envname("LINATTN_LOG_LEVEL")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}))
      ->capture_default_str();
  app.add_flag("--log-json", f.log_json,
               "one JSON object per log line (access lines carry their "
               "fields at the top level)")
      ->envname("LINATTN_LOG_JSON");
  app.add_option("--access-log", f.access_log,
                 "one line per gRPC call and HTTP request (method, session, "
                 "tenant, status, latency, tokens in and out), at info "
                 "level: on | off")
      ->envname("LINATTN_ACCESS_LOG")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
}

// Models and generation.
void DefineModelFlags(CLI::App& app, ServerFlags& f) {
  app.add_option("--model", f.models,
                 "model directory (config.json + model.safetensors) for "
                 "GenerationService; repeat for several; \"none\" serves no "
                 "model (default: the built-in model, " +
                     f.builtin + ")")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->envname("LINATTN_MODEL");
  app.add_option("--initial-state", f.initial_states,
                 "[MODEL=]FILE: new sessions of the model (named as clients "
                 "name it; the name may be left out with one --model) start "
                 "from the state in FILE instead of zeros: RWKV's state files, "
                 "safetensors with blocks.<i>.att.time_state per layer "
                 "(tools/convert_rwkv.py --state turns a .pth into one); "
                 "rwkv7 and rwkv6 models; repeat for several models")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_flag("--check", f.check,
               "load the models as the server would, print what each "
               "directory holds (architecture, weights, tokenizer, chat "
               "template) and exit: 0 when every one can be served, 1 when "
               "one cannot");
  app.add_option(
         "--weights", f.weights,
         "how model projection weights are packed: f32; bf16 (half "
         "the bytes per decode step; activations rounded to bf16 before "
         "each product; needs AVX512_BF16 or AMX); or int8 (a quarter; "
         "one scale per output channel, activations quantised per row; "
         "needs AVX512_VNNI or AMX)")
      ->check(CLI::IsMember({"f32", "bf16", "int8"}))
      ->envname("LINATTN_WEIGHTS")
      ->capture_default_str();
  app.add_option(
         "--prefill-precision", f.prefill_precision,
         "operands of chunkwise prefill's products (linear-rule layers and "
         "AttentionService sessions): f32; or bf16 (φ(Q), φ(K), V, the "
         "scores and S rounded to bf16 for the products, fp32 sums and "
         "state; error bound in docs/design.md §1; needs AVX512_BF16 or "
         "AMX)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->envname("LINATTN_PREFILL_PRECISION")
      ->capture_default_str();
  app.add_option("--token-budget", f.options.generation.token_budget,
                 "tokens one generation iteration runs (decode rows first, "
                 "then prompt pieces)")
      ->envname("LINATTN_TOKEN_BUDGET")
      ->check(NumberAtLeast(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--max-generating", f.options.generation.max_batch,
                 "generating sessions decoded together in one iteration")
      ->envname("LINATTN_MAX_GENERATING")
      ->check(NumberAtLeast(1, 1 << 16))
      ->capture_default_str();
}

// Where sessions are kept.
void DefineStoreFlags(CLI::App& app, ServerFlags& f) {
  app.add_option("--state-dir", f.options.durable.dir,
                 "keep sessions durable in this directory: every change is "
                 "recorded there before it is acknowledged, and at start every "
                 "session is recovered from it before the server serves "
                 "(docs/design.md, \"Durable sessions\"); one server per "
                 "directory. none (the default of this binary; `make run` "
                 "and the container give one): sessions live in memory only, "
                 "and a restart loses them")
      ->envname("LINATTN_STATE_DIR");
  app.add_option("--durability", f.durability,
                 "with --state-dir: always = fsync each scheduler round and "
                 "generation iteration before answering (nothing acknowledged "
                 "is lost, even by a power cut); batch = fsync every "
                 "--sync-interval-ms (a crash of the process loses nothing, "
                 "one of the machine up to that window); off = never fsync "
                 "(the page cache decides)")
      ->envname("LINATTN_DURABILITY")
      ->check(CLI::IsMember({"always", "batch", "off"}))
      ->capture_default_str();
  app.add_option("--sync-interval-ms", f.sync_interval_ms,
                 "with --durability batch: the longest time between fsyncs")
      ->envname("LINATTN_SYNC_INTERVAL_MS")
      ->check(NumberAtLeast(1, 3'600'000))
      ->capture_default_str();
  app.add_option("--state-store", f.options.shared.url,
                 "keep sessions in Redis (redis://HOST:PORT[/DB]) instead of "
                 "--state-dir, so that replicas behind a session-hashing "
                 "proxy share them: each session is served by one replica at "
                 "a time, any replica takes over one whose owner died or "
                 "left, and every change is in Redis before it is "
                 "acknowledged (docs/design.md, \"Replicas and the shared "
                 "store\")")
      ->envname("LINATTN_STATE_STORE");
  app.add_option("--replica-name", f.replica_name,
                 "with --state-store: this replica's name in the store (a "
                 "random suffix is added, so each start is a new owner); "
                 "default: the host name")
      ->envname("LINATTN_REPLICA_NAME");
  app.add_option("--lease-ms", f.lease_ms,
                 "with --state-store: how long this replica's sessions stay "
                 "its own without a heartbeat (renewed every quarter of it); "
                 "a replica that dies is taken over after at most this long")
      ->envname("LINATTN_LEASE_MS")
      ->check(NumberAtLeast(100, 600'000))
      ->capture_default_str();
}

// The other listeners, keys, TLS, metrics.
void DefineListenerFlags(CLI::App& app, ServerFlags& f) {
  app.add_option("--haproxy-agent-listen", f.options.haproxy_agent_listen,
                 "HOST:PORT answering HAProxy's agent-check: \"up ready\" "
                 "while serving, \"drain\" once a drain began, so a proxy "
                 "stops routing sessions here before the listener closes "
                 "(deploy/haproxy); default: none")
      ->envname("LINATTN_HAPROXY_AGENT_LISTEN");
  f.http_listen =
      app.add_option("--http-listen", f.options.http_listen,
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
  app.add_option("--http-threads", f.options.http_threads,
                 "requests the HTTP listener serves at once (a streamed "
                 "completion holds one for its length); completions, chats "
                 "and responses take at most this - 8, more get 429")
      ->envname("LINATTN_HTTP_THREADS")
      ->check(CLI::Range(9, 4096))
      ->capture_default_str();
  app.add_option("--http-request-timeout-ms", f.options.http_request_timeout_ms,
                 "the time an HTTP request's headers and body have to "
                 "arrive, from its first byte, however steadily they trickle "
                 "in (408 after it); until their headers are complete, "
                 "connections wait without holding a request thread")
      ->envname("LINATTN_HTTP_REQUEST_TIMEOUT_MS")
      ->check(CLI::Range(100, 3'600'000))
      ->capture_default_str();
  app.add_option("--api-keys", f.options.api_keys_file,
                 "JSON file of API keys stored as SHA-256 hashes, each naming "
                 "a tenant, its quotas and whether it is admin "
                 "(docs/design.md, \"Tenants and keys\"); every call then "
                 "needs \"authorization: Bearer KEY\", and a session belongs "
                 "to the tenant that created it. SIGHUP reads it again. "
                 "Default: no keys, one anonymous tenant")
      ->envname("LINATTN_API_KEYS")
      ->check(CLI::ExistingFile);
  app.add_option("--metrics-listen", f.options.metrics_listen,
                 "HOST:PORT serving Prometheus' /metrics on a listener of "
                 "its own (the HTTP listener serves /metrics too when it is "
                 "on); default: none")
      ->envname("LINATTN_METRICS_LISTEN");
  app.add_option("--tls-cert", f.options.tls.cert,
                 "PEM certificate chain (leaf first): gRPC and HTTP serve TLS "
                 "with it (needs --tls-key); SIGHUP reads it again")
      ->envname("LINATTN_TLS_CERT")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-key", f.options.tls.key,
                 "PEM private key of --tls-cert's certificate")
      ->envname("LINATTN_TLS_KEY")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-client-ca", f.options.tls.client_ca,
                 "PEM CA certificates: clients must present a certificate "
                 "one of them signed (mTLS, both listeners)")
      ->envname("LINATTN_TLS_CLIENT_CA")
      ->check(CLI::ExistingFile);
  app.add_flag("--allow-unauthenticated", f.options.allow_unauthenticated,
               "serve on a non-loopback address without --api-keys or "
               "--tls-client-ca (refused otherwise: anyone who reaches the "
               "server could use every session)")
      ->envname("LINATTN_ALLOW_UNAUTHENTICATED");
  app.add_flag("--shared-memory", f.options.shared_memory,
               "take Prefill tensors from co-located clients' memfds "
               "(PrefillRequest.shared_memory: read and written by the "
               "server, no copy through the socket); needs --listen "
               "unix:PATH, and not --api-keys: any client of the socket can "
               "name any linattn memfd of the server's user")
      ->envname("LINATTN_SHARED_MEMORY");
  app.add_option("--metrics", f.metrics,
                 "Prometheus metrics at /metrics: on | off (off also skips "
                 "the latency histograms' work on every call)")
      ->envname("LINATTN_METRICS")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--http-port-file", f.http_port_file,
                 "write the HTTP listener's bound port here once serving")
      ->envname("LINATTN_HTTP_PORT_FILE");
  app.add_option("--port-file", f.port_file,
                 "write the bound port here once serving (0 on a unix socket)")
      ->envname("LINATTN_PORT_FILE");
}

}  // namespace

void DefineServerFlags(CLI::App& app, ServerFlags& flags) {
  flags.builtin = BuiltinModelDir();
  DefineServingFlags(app, flags);
  DefineLogFlags(app, flags);
  DefineModelFlags(app, flags);
  DefineStoreFlags(app, flags);
  DefineListenerFlags(app, flags);
}

absl::Status ResolveServerFlags(ServerFlags& f) {
  ServerOptions& options = f.options;
  options.metrics = f.metrics == "on";
  options.sessions.max_state_bytes = *ParseByteSize(f.max_memory);
  options.transport_memory_bytes = *ParseByteSize(f.transport_memory);
  if (options.transport_memory_bytes < (uint64_t{1} << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--transport-memory: ", f.transport_memory,
        " is below 1MiB, too little for gRPC to serve one connection"));
  }
  options.compute_threads = f.workers;
  options.weights = *ParseWeightType(f.weights);
  options.prefill_precision = *ParsePrefillPrecision(f.prefill_precision);
  if (f.models.empty()) {
    if (std::filesystem::exists(f.builtin + "/config.json")) {
      options.models.push_back(f.builtin);
    } else {
      spdlog::warn(
          "the built-in model is not at {} (this binary's ../share); "
          "GenerationService serves no model unless --model names one",
          f.builtin);
    }
  }
  for (const std::string& dir : f.models) {
    if (dir != "none" && !dir.empty()) options.models.push_back(dir);
  }
  for (const std::string& entry : f.initial_states) {
    // MODEL=FILE when MODEL names a served model; else, with one model,
    // the whole value is the file.
    std::string dir, file = entry;
    if (const size_t eq = entry.find('='); eq != std::string::npos) {
      for (const std::string& d : options.models) {
        if (Model::DefaultName(d) == entry.substr(0, eq)) {
          dir = d;
          file = entry.substr(eq + 1);
        }
      }
    }
    if (dir.empty()) {
      if (options.models.size() != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--initial-state: '", entry,
            "' names no served model; with several models (or none) give "
            "MODEL=FILE, MODEL the model's name"));
      }
      dir = options.models[0];
    }
    if (!options.initial_states.emplace(dir, file).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--initial-state: model '", Model::DefaultName(dir),
                       "' is given two initial states"));
    }
  }
  options.idle_ttl =
      std::chrono::milliseconds(static_cast<int64_t>(f.idle_ttl_s * 1000));
  if (options.durable.dir == "none") options.durable.dir.clear();
  if (f.http_listen->count() == 0) {
    // (--listen was checked by its validator.)
    options.http_listen = DefaultHttpListen(
        *ParseListenAddress(options.listen, "--listen", /*allow_unix=*/true));
  }
  options.durable.durability = *ParseDurability(f.durability);
  options.durable.sync_interval = std::chrono::milliseconds(f.sync_interval_ms);
  if (!options.shared.url.empty()) {
    std::string name = f.replica_name;
    if (name.empty()) {
      char host[256] = {};
      name = gethostname(host, sizeof(host) - 1) == 0 && host[0] != 0
                 ? host
                 : "linattn";
    }
    options.shared.replica = name + "-" + RandomSessionId().substr(0, 8);
    options.shared.lease = std::chrono::milliseconds(f.lease_ms);
  }
  return absl::OkStatus();
}

}  // namespace linattn
