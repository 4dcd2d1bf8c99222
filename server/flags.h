// linattn-server's flags: each flag with its LINATTN_* environment
// variable, its check and its help text, and what the flags resolve to
// (ServerOptions, with units parsed and the defaults that depend on other
// flags filled in). docs/server.md documents every one of them
// (tests/docs/check_docs.py compares it with --help).
#ifndef LINATTN_SERVER_FLAGS_H_
#define LINATTN_SERVER_FLAGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "server/server.h"

namespace linattn {

// The flags as given, before they resolve into `options`.
struct ServerFlags {
  ServerOptions options;
  int workers = 0;
  std::string max_memory = "4GiB";
  std::string transport_memory = "1GiB";
  double idle_ttl_s = 3600;
  double grace_s = 10;
  std::string log_level = "info";
  bool log_json = false;
  std::string access_log = "on";
  std::string metrics = "on";
  // The built-in model's directory, relative to this binary (served when
  // no --model is given).
  std::string builtin;
  std::vector<std::string> models;
  std::vector<std::string> initial_states;  // [MODEL=]FILE
  bool check = false;  // --check: report on the models and exit
  std::string weights = "f32";
  std::string prefill_precision = "f32";
  std::string durability = "always";
  int64_t sync_interval_ms = 100;
  std::string replica_name;
  int64_t lease_ms = 2000;
  std::string port_file;
  std::string http_port_file;
  CLI::Option* http_listen = nullptr;  // given or not
};

// Every flag of linattn-server on `app`, writing into `flags`.
void DefineServerFlags(CLI::App& app, ServerFlags& flags);

// After parsing: fills flags.options from the rest. INVALID_ARGUMENT naming
// the flag for a value its own check could not refuse alone.
absl::Status ResolveServerFlags(ServerFlags& flags);

}  // namespace linattn

#endif  // LINATTN_SERVER_FLAGS_H_
