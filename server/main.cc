// linattn-server: the gRPC service of DESIGN.md §3.
//
//   linattn-server --listen 0.0.0.0:50051 --max-sessions 10000 ...
// Every flag can also come from the environment (LINATTN_LISTEN, …), which
// is how the container is configured. SIGTERM or SIGINT drains: health turns
// NOT_SERVING, new calls are refused, in-flight calls get --grace-period to
// finish, and the process exits 0.
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>

#include "CLI/CLI.hpp"
#include "server/server.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace {

// "1073741824", "512MiB", "4GiB", "100MB" → bytes.
bool ParseBytes(const std::string& text, uint64_t* out) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (...) {
    return false;
  }
  const std::string unit = text.substr(used);
  const std::pair<const char*, double> units[] = {{"", 1},
                                                  {"B", 1},
                                                  {"KB", 1e3},
                                                  {"MB", 1e6},
                                                  {"GB", 1e9},
                                                  {"KiB", 1 << 10},
                                                  {"MiB", 1 << 20},
                                                  {"GiB", double(1 << 30)},
                                                  {"TiB", 1099511627776.0}};
  for (const auto& [name, scale] : units) {
    if (unit == name && value >= 0) {
      *out = static_cast<uint64_t>(value * scale);
      return true;
    }
  }
  return false;
}

// The kernels' OpenMP workers share the cores with gRPC's threads and the
// scheduler. libgomp's default is to spin for a long while after every
// parallel region, which takes those cores from the RPC threads (measured:
// half of the server's CPU time spinning under load). A short spin keeps a
// single stream's latency low and lets the threads sleep between batches.
// libgomp reads its environment when it is loaded, so the setting is applied
// by re-executing once; an explicit OMP_WAIT_POLICY or GOMP_SPINCOUNT wins.
void UseShortOpenMpSpin(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr ||
      std::getenv("GOMP_SPINCOUNT") != nullptr) {
    return;
  }
  setenv("GOMP_SPINCOUNT", "20000", 1);
  // The binary's own path (not /proc/self/exe itself, which would rename
  // the process "exe" in ps and top).
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return;
  self[n] = '\0';
  execv(self, argv);  // returns only on failure: carry on as is
}

}  // namespace

int main(int argc, char** argv) {
  UseShortOpenMpSpin(argv);
  CLI::App app{
      "linattn-server: linear-attention sessions over gRPC (linattn.v1)"};
  linattn::ServerOptions options;
  int workers = 0;
  std::string max_memory = "4GiB";
  double idle_ttl_s = 0;
  double grace_s = 10;
  std::string log_level = "info";
  bool log_json = false;
  std::string port_file;
  app.add_option("--listen", options.listen,
                 "address to serve on (port 0 picks a free port)")
      ->envname("LINATTN_LISTEN")
      ->capture_default_str();
  app.add_option("--workers", workers,
                 "compute threads for the kernels (0 = one per core)")
      ->envname("LINATTN_WORKERS")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-sessions", options.sessions.max_sessions,
                 "most sessions held at once")
      ->envname("LINATTN_MAX_SESSIONS")
      ->capture_default_str();
  app.add_option(
         "--max-state-memory", max_memory,
         "total recurrent state of all sessions (bytes, or e.g. 512MiB, 4GiB)")
      ->envname("LINATTN_MAX_STATE_MEMORY")
      ->capture_default_str();
  app.add_option("--idle-ttl", idle_ttl_s,
                 "evict sessions unused this many seconds (0 = never)")
      ->envname("LINATTN_IDLE_TTL")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--max-message-bytes", options.max_message_bytes,
                 "largest request or response message")
      ->envname("LINATTN_MAX_MESSAGE_BYTES")
      ->check(CLI::Range(1024, 1 << 30))
      ->capture_default_str();
  app.add_option(
         "--max-batch", options.scheduler.max_round,
         "requests (one per session) the scheduler runs as one batch; 1 turns "
         "batching off")
      ->envname("LINATTN_MAX_BATCH")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--default-epsilon", options.sessions.default_epsilon,
                 "ε for sessions whose spec leaves it unset")
      ->envname("LINATTN_DEFAULT_EPSILON")
      ->capture_default_str();
  app.add_option("--grace-period", grace_s,
                 "seconds in-flight calls get on SIGTERM")
      ->envname("LINATTN_GRACE_PERIOD")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--log-level", log_level,
                 "trace | debug | info | warn | error")
      ->envname("LINATTN_LOG_LEVEL")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}))
      ->capture_default_str();
  app.add_flag("--log-json", log_json, "one JSON object per log line")
      ->envname("LINATTN_LOG_JSON");
  std::vector<std::string> models = {LINATTN_DEFAULT_MODEL_DIR};
  app.add_option("--model", models,
                 "model directory (config.json + model.safetensors) for "
                 "GenerationService; repeat for several; \"none\" serves no "
                 "model")
      ->envname("LINATTN_MODEL")
      ->capture_default_str();
  std::string weights = "f32";
  app.add_option(
         "--weights", weights,
         "how model projection weights are packed: f32, or bf16 (half "
         "the bytes per decode step; activations rounded to bf16 before "
         "each product; needs AVX512_BF16 or AMX)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->envname("LINATTN_WEIGHTS")
      ->capture_default_str();
  app.add_option("--token-budget", options.generation.token_budget,
                 "tokens one generation iteration runs (decode rows first, "
                 "then prompt pieces)")
      ->envname("LINATTN_TOKEN_BUDGET")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--max-generating", options.generation.max_batch,
                 "generating sessions decoded together in one iteration")
      ->envname("LINATTN_MAX_GENERATING")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--port-file", port_file,
                 "write the bound port here once serving")
      ->envname("LINATTN_PORT_FILE");
  CLI11_PARSE(app, argc, argv);

  auto logger = spdlog::stdout_logger_mt("linattn");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(log_level));
  if (log_json) {
    spdlog::set_pattern(
        R"({"time":"%Y-%m-%dT%H:%M:%S.%fZ","level":"%l","msg":"%v"})",
        spdlog::pattern_time_type::utc);
  }
  spdlog::flush_on(spdlog::level::info);

  if (!ParseBytes(max_memory, &options.sessions.max_state_bytes)) {
    std::cerr << "linattn-server: --max-state-memory: not a size: '"
              << max_memory << "'\n";
    return 2;
  }
  if (workers > 0) omp_set_num_threads(workers);
  options.weights = *linattn::ParseWeightType(weights);
  for (const std::string& dir : models) {
    if (dir != "none" && !dir.empty()) options.models.push_back(dir);
  }
  options.generation.max_sessions = options.sessions.max_sessions;
  options.generation.memory_budget_bytes = options.sessions.max_state_bytes;
  options.idle_ttl =
      std::chrono::milliseconds(static_cast<int64_t>(idle_ttl_s * 1000));

  // Signals are taken by sigwait below, so every thread starts with them
  // blocked.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto server = linattn::LinattnServer::Start(options);
  if (!server.ok()) {
    spdlog::error("cannot start: {}", server.status().ToString());
    return 1;
  }
  spdlog::info(
      "linattn-server listening on {} (compute threads {}, max sessions {}, "
      "max state memory {} bytes, idle ttl {} s)",
      (*server)->address(), omp_get_max_threads(),
      options.sessions.max_sessions, options.sessions.max_state_bytes,
      idle_ttl_s);
  if (!port_file.empty()) {
    std::ofstream(port_file) << (*server)->port() << "\n";
  }

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  spdlog::info("signal {}: draining (grace period {} s)", signal_number,
               grace_s);
  (*server)->Drain(
      std::chrono::milliseconds(static_cast<int64_t>(grace_s * 1000)));
  const linattn::SchedulerStats stats = (*server)->scheduler().stats();
  spdlog::info(
      "stopped: {} decode steps in {} batches, {} prefills ({} tokens) in {} "
      "batches",
      stats.steps, stats.step_batches, stats.prefills, stats.prefill_tokens,
      stats.prefill_batches);
  return 0;
}
