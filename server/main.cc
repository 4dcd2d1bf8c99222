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
#include "core/util/byte_size.h"
#include "core/util/malloc_settings.h"
#include "core/util/openmp_spin.h"
#include "server/flags.h"
#include "server/logging.h"
#include "server/model_check.h"
#include "server/server.h"
#include "spdlog/spdlog.h"

namespace {

using linattn::LinattnServer;
using linattn::ServerFlags;

// What the operator reads once the server serves: where, with what limits,
// and where its sessions live (a server whose sessions a restart loses
// says so); the bound ports go to the files that asked for them.
void AnnounceStart(LinattnServer& server, const ServerFlags& f) {
  const linattn::ServerOptions& options = f.options;
  spdlog::info(
      "linattn-server {} listening on {} (compute threads {}, max sessions "
      "{}, max state memory {}, idle ttl {} s)",
      LINATTN_VERSION, server.address(), omp_get_max_threads(),
      options.sessions.max_sessions,
      linattn::FormatByteSize(options.sessions.max_state_bytes), f.idle_ttl_s);
  if (server.http_port() != 0) {
    spdlog::info("HTTP on port {}", server.http_port());
  }
  if (!options.durable.dir.empty()) {
    spdlog::info("sessions are durable in {} (--durability {})",
                 std::filesystem::absolute(options.durable.dir).string(),
                 f.durability);
  } else if (options.shared.url.empty()) {
    spdlog::warn(
        "sessions live in memory only: a restart loses them (--state-dir "
        "DIR keeps them; `make run` keeps them in "
        "$XDG_STATE_HOME/linattn)");
  }
  if (!f.http_port_file.empty()) {
    std::ofstream(f.http_port_file) << server.http_port() << "\n";
  }
  if (!f.port_file.empty()) {
    std::ofstream(f.port_file) << server.port() << "\n";
  }
}

// SIGHUP reloads what is read from files; sessions and calls go on.
void Reload(LinattnServer& server, const linattn::ServerOptions& options) {
  if (options.tls.enabled()) {
    const absl::Status s = server.ReloadTls();
    if (s.ok()) {
      spdlog::info("SIGHUP: TLS certificate reloaded: {}",
                   server.tls()->Describe());
    } else {
      spdlog::error("SIGHUP: keeping the TLS certificate in use: {}",
                    std::string(s.message()));
    }
  }
  if (!options.api_keys_file.empty()) {
    const absl::Status s = server.ReloadKeys();
    if (s.ok()) {
      spdlog::info("SIGHUP: API keys reloaded from {}", options.api_keys_file);
    } else {
      spdlog::error("SIGHUP: keeping the API keys in use: {}",
                    std::string(s.message()));
    }
  }
}

// Serves until SIGTERM or SIGINT, then drains on a thread of its own while
// a second signal exits at once (status 1). `signals` are blocked in every
// thread and taken here.
void ServeUntilSignal(LinattnServer& server, const ServerFlags& f,
                      const sigset_t& signals) {
  int signal_number = 0;
  for (;;) {
    sigwait(&signals, &signal_number);
    if (signal_number == SIGHUP) {
      Reload(server, f.options);
      continue;
    }
    if (signal_number != SIGUSR1) break;
  }
  spdlog::info(
      "signal {}: draining (grace period {} s; a second signal "
      "exits at once)",
      signal_number, f.grace_s);
  const pthread_t main_thread = pthread_self();
  std::atomic<bool> drained{false};
  std::thread drain([&] {
    server.Drain(
        std::chrono::milliseconds(static_cast<int64_t>(f.grace_s * 1000)));
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
}

// What the server did, at exit.
void LogSummary(LinattnServer& server) {
  const linattn::SchedulerStats stats = server.scheduler().stats();
  const linattn::GenerationStats gen = server.generation().stats();
  const linattn::Observability::Totals calls = server.observability().totals();
  spdlog::info(
      "stopped: attention: {} decode steps in {} batches, {} prefills ({} "
      "tokens) in {} batches; generation: {} generate and {} append "
      "requests, {} prompt tokens, {} tokens generated in {} iterations; "
      "calls: {} gRPC ({} failed), {} HTTP ({} failed)",
      stats.steps, stats.step_batches, stats.prefills, stats.prefill_tokens,
      stats.prefill_batches, gen.generates, gen.appends, gen.prompt_tokens,
      gen.generated_tokens, gen.iterations, calls.grpc_calls, calls.grpc_failed,
      calls.http_requests, calls.http_failed);
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
  ServerFlags flags;
  linattn::DefineServerFlags(app, flags);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; a usage error exits 2, as is usual.
    return app.exit(e) == 0 ? 0 : 2;
  }
  linattn::SetUpLogging(flags.log_level, flags.log_json,
                        flags.access_log == "on");
  if (absl::Status s = linattn::ResolveServerFlags(flags); !s.ok()) {
    std::fprintf(stderr, "%s\nRun with --help for more information.\n",
                 std::string(s.message()).c_str());
    return 2;
  }
  // Model loading's threads.
  if (flags.workers > 0) omp_set_num_threads(flags.workers);
  if (flags.check) return linattn::CheckModels(flags.options, stdout);

  // Signals are taken by sigwait, so every thread starts with them
  // blocked. SIGUSR1 is the drain thread telling the main thread it is done.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGUSR1);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto server = LinattnServer::Start(flags.options);
  if (!server.ok()) {
    spdlog::error("cannot start: {}", std::string(server.status().message()));
    return 1;
  }
  AnnounceStart(**server, flags);
  ServeUntilSignal(**server, flags, signals);
  LogSummary(**server);
  return 0;
}
