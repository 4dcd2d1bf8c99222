// `linattn`: the command-line client (docs/design.md §3).
//   linattn explain --preset general|negative [--feature-map MAP]
//     [--prefix N] [--json]
//   linattn attend --q Q.npy --k K.npy --v V.npy --out Y.npy [options]
//   linattn generate [--server ADDR] [--max-tokens N] [--temperature T]
//     [--seed S] "prompt"
//   linattn health [--server ADDR]
//   linattn sessions list|delete [--server ADDR] [ID ...]
// --server defaults to $LINATTN_SERVER, else 127.0.0.1:50051 (the server
// `make run` starts).
// Every command that talks to a server also takes the connection flags of
// clients/common/connection.h: --tls-ca, --tls-cert, --tls-key,
// --tls-server-name and --api-key-file (or LINATTN_API_KEY).
#include <cstdio>
#include <cstring>
#include <iostream>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "clients/cli/attend.h"
#include "clients/cli/explain.h"
#include "clients/cli/generate.h"
#include "clients/cli/remote.h"
#include "clients/cli/sessions.h"
#include "clients/common/connection.h"
#include "core/util/flag_checks.h"

namespace {

int Fail(const absl::Status& status) {
  std::cerr << "linattn: error: " << status.message() << "\n";
  return 1;
}

// Connection flags that cannot be used (a file missing, a certificate
// without its key) are usage errors, reported before any call.
int UsageError(const absl::Status& status) {
  std::cerr << "linattn: error: " << status.message() << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"linattn: linear-attention explorer and client"};
  app.set_version_flag("--version", "linattn " LINATTN_VERSION);
  app.require_subcommand(1);

  linattn::ExplainOptions explain;
  bool json = false;
  int prefix = 0;
  CLI::App* ex = app.add_subcommand(
      "explain",
      "Show the seed's worked module: φ(q), φ(k_i), running z and S, "
      "numerator, denominator, output, reference and softmax");
  ex->add_option("--preset", explain.preset,
                 "general | negative (default: general)")
      ->check(CLI::IsMember({"general", "negative"}));
  ex->add_option("--feature-map", explain.feature_map,
                 "elu1 | relu | identity | cosine | favor (default: elu1)")
      ->check(CLI::IsMember(linattn::ExplainFeatureMaps()));
  CLI::Option* prefix_opt = ex->add_option(
      "--prefix", prefix, "number of keys summed (default: all)");
  ex->add_flag("--json", json, "print one JSON object");
  std::string explain_server;
  ex->add_option("--server", explain_server,
                 "host:port or unix:PATH: step the prefix in a server session "
                 "and read its "
                 "state through Inspect");
  // Each subcommand has its own ConnectionOptions (AddConnectionFlags).
  linattn::ConnectionOptions explain_connection;
  linattn::AddConnectionFlags(ex, &explain_connection);

  std::string health_server, health_service;
  double health_timeout = 2.0;
  CLI::App* he = app.add_subcommand(
      "health", "Check a server's grpc.health.v1 status; exit 0 when SERVING");
  linattn::AddServerFlag(he, &health_server);
  he->add_option("--service", health_service,
                 "service name (default: the whole server)");
  he->add_option("--timeout", health_timeout, "seconds (default: 2)");
  linattn::ConnectionOptions health_connection;
  linattn::AddConnectionFlags(he, &health_connection);

  linattn::GenerateOptions generate;
  CLI::App* ge = app.add_subcommand(
      "generate",
      "Stream a model's continuation of a prompt from a server's "
      "GenerationService");
  ge->add_option("prompt", generate.prompt, "the prompt text");
  linattn::AddServerFlag(ge, &generate.server);
  ge->add_option("--model", generate.model,
                 "model name (default: the server's first)");
  ge->add_option("--session", generate.session_id,
                 "continue this session instead of starting a new one");
  ge->add_flag("--keep", generate.keep,
               "keep the new session and print its id (stderr); `linattn "
               "sessions delete` removes it");
  ge->add_option("--max-tokens", generate.max_tokens, "default: 64")
      ->check(linattn::NumberAtLeast(1, 1 << 20));
  ge->add_option("--temperature", generate.temperature,
                 "0 = greedy, after the penalties (default: 0.8)")
      ->check(linattn::NumberAtLeast(0));
  ge->add_option("--top-k", generate.top_k, "0 = no limit (default: 40)");
  ge->add_option("--top-p", generate.top_p, "1 = no limit (default: 0.95)")
      ->check(linattn::NumberAtLeast(0, 1));
  ge->add_option("--min-p", generate.min_p,
                 "keep tokens at least this times as likely as the most "
                 "likely; 0 = no limit (default: 0.05)")
      ->check(linattn::NumberAtLeast(0, 1));
  ge->add_option("--presence-penalty", generate.presence_penalty,
                 "subtracted once from the logit of each token generated so "
                 "far, -2..2 (default: 0)")
      ->check(linattn::NumberAtLeast(-2, 2));
  ge->add_option("--frequency-penalty", generate.frequency_penalty,
                 "subtracted per occurrence, -2..2 (default: 0)")
      ->check(linattn::NumberAtLeast(-2, 2));
  ge->add_option("--repeat-penalty", generate.repeat_penalty,
                 "divides positive (multiplies negative) logits of tokens in "
                 "the window, (0, 10]; 1 = none (default: 1.1)")
      ->check(linattn::NumberAtLeast(0.01, 10));
  ge->add_option("--repeat-last-n", generate.repeat_last_n,
                 "--repeat-penalty's window: the last N tokens of the prompt "
                 "and continuation; -1 = all, 0 = none (default: 64)")
      ->check(linattn::NumberAtLeast(-1, 1 << 16));
  ge->add_option("--seed", generate.seed,
                 "sampling seed: the same seed, prompt and model give the same "
                 "text (default: 0)");
  ge->add_option("--stop", generate.stop, "stop before this text (repeatable)");
  ge->add_flag("--usage", generate.usage,
               "print token counts, time to first token and speed (stderr)");
  linattn::AddConnectionFlags(ge, &generate.connection);

  linattn::AttendOptions attend;
  std::string decay;
  CLI::App* at = app.add_subcommand(
      "attend",
      "Linear attention over float32 .npy files: Q, K (T, H, d_k), "
      "V (T, H, d_v) -> Y (T, H, d_v), NaN where unavailable");
  at->add_option("--q", attend.q_path, "queries .npy (T, H, d_k)")->required();
  at->add_option("--k", attend.k_path, "keys .npy (T, H, d_k)")->required();
  at->add_option("--v", attend.v_path, "values .npy (T, H, d_v)")->required();
  at->add_option("--out", attend.out_path, "output .npy (T, H, d_v)")
      ->required();
  at->add_option("--rule", attend.rule,
                 "update rule: linear | gated | delta | gated_delta | rwkv7 | "
                 "rwkv6 (default: linear; docs/design.md §1)")
      ->check(CLI::IsMember(
          {"linear", "gated", "delta", "gated_delta", "rwkv7", "rwkv6"}));
  at->add_option("--g", attend.g_path,
                 "log-gates .npy, ≤ 0 (gated, gated_delta, rwkv7, rwkv6): "
                 "(T, H), or (T, H, d_k) with --gate key (rwkv7's and "
                 "rwkv6's only shape)");
  at->add_option("--beta", attend.beta_path,
                 "β .npy in [0, 2] (delta, gated_delta): (T, H)");
  at->add_option("--a", attend.a_path,
                 "rwkv7's a .npy (T, H, d_k): S ← (diag(e^g) + b aᵀ) S + k vᵀ");
  at->add_option("--b", attend.b_path, "rwkv7's b .npy (T, H, d_k)");
  at->add_option("--bonus", attend.bonus_path,
                 "rwkv6's bonus u .npy (H, d_k): o = (S + diag(u) k vᵀ)ᵀq "
                 "from the state before the token");
  at->add_option("--gate", attend.gate,
                 "gated rule's gates: head (one per head, default) | key (one "
                 "per key channel)")
      ->check(CLI::IsMember({"head", "key"}));
  at->add_flag("--qk-l2norm", attend.qk_l2norm,
               "gated and delta rules: L2-normalise q and k per head");
  at->add_option("--scale", attend.scale,
                 "gated and delta rules: multiply q by this (default 1)");
  at->add_option("--feature-map", attend.feature_map,
                 "elu1 | relu | identity | favor | cosine (default: elu1; "
                 "identity for the gated and delta rules)")
      ->check(CLI::IsMember({"elu1", "relu", "identity", "favor", "cosine"}));
  at->add_option("--mode", attend.mode,
                 "evaluation order: recurrent | chunkwise | quadratic locally, "
                 "decode | prefill with --server (default: chunkwise, or "
                 "prefill with --server)")
      ->check(CLI::IsMember(
          {"recurrent", "chunkwise", "quadratic", "decode", "prefill"}));
  at->add_option(
      "--server", attend.server,
      "host:port (or unix:PATH) of a linattn-server: runs in a server "
      "session (modes decode and prefill; with those modes the default is "
      "$LINATTN_SERVER, else 127.0.0.1:50051)");
  at->add_option("--chunk", attend.chunk,
                 "chunk size C of the chunkwise order (default: 64)")
      ->check(linattn::NumberAtLeast(1, 4096));
  at->add_option("--decay", decay,
                 "γ per head, comma-separated (one value = every head)");
  float epsilon = 0;
  CLI::Option* epsilon_opt = at->add_option(
      "--epsilon", epsilon,
      "ε added to the denominator (default: 0 locally, the server's default "
      "with --server)");
  at->add_flag("--unnormalized", attend.unnormalized,
               "y = φ(q)ᵀS, no denominator");
  at->add_option("--feature-dim", attend.feature_dim,
                 "FAVOR+ feature count m (default 2·d_k)");
  at->add_option("--seed", attend.seed, "FAVOR+ random-feature seed");
  at->add_option("--horizon", attend.horizon,
                 "cosFormer horizon M (default T)");
  linattn::AddConnectionFlags(at, &attend.connection);

  std::string sessions_server;
  bool sessions_json = false;
  std::vector<std::string> delete_ids;
  CLI::App* se = app.add_subcommand(
      "sessions", "List or delete a server's sessions (both services)");
  se->require_subcommand(1);
  CLI::App* se_list = se->add_subcommand("list", "One line per session");
  linattn::AddServerFlag(se_list, &sessions_server);
  se_list->add_flag("--json", sessions_json, "print one JSON array");
  linattn::ConnectionOptions list_connection;
  linattn::AddConnectionFlags(se_list, &list_connection);
  CLI::App* se_delete =
      se->add_subcommand("delete", "Delete sessions by id (either service)");
  linattn::AddServerFlag(se_delete, &sessions_server);
  se_delete->add_option("ids", delete_ids, "session ids")->required();
  linattn::ConnectionOptions delete_connection;
  linattn::AddConnectionFlags(se_delete, &delete_connection);

  // A first word that is not an option names a command: say so plainly
  // when it is not one (CLI11 would only say that a command is required).
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    std::string names;
    for (const CLI::App* sub : app.get_subcommands({})) {
      known |= sub->get_name() == argv[1];
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known) {
      std::cerr << "linattn: unknown command '" << argv[1]
                << "' (commands: " << names << "; see linattn --help)\n";
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help, --version: 0; usage: 2
  }

  if (ex->parsed()) {
    if (prefix_opt->count() > 0) explain.prefix = prefix;
    // Without --server nothing is connected to, and connection settings
    // from the environment are not looked at.
    if (!explain_server.empty()) {
      if (absl::Status s = linattn::ResolveConnection(&explain_connection);
          !s.ok()) {
        return UsageError(s);
      }
    }
    auto result = explain_server.empty()
                      ? linattn::Explain(explain)
                      : linattn::ExplainOnServer(explain, explain_server,
                                                 explain_connection);
    if (!result.ok()) return Fail(result.status());
    if (json) {
      std::cout << linattn::ExplainJson(*result).dump(2) << "\n";
    } else {
      std::cout << linattn::FormatExplainText(*result);
    }
    return 0;
  }
  if (at->parsed()) {
    for (absl::string_view part :
         absl::StrSplit(decay, ',', absl::SkipEmpty())) {
      float g = 0;
      if (!absl::SimpleAtof(part, &g)) {
        return Fail(absl::InvalidArgumentError(
            std::string("--decay: not a number: '") + std::string(part) + "'"));
      }
      attend.decay.push_back(g);
    }
    if (epsilon_opt->count() > 0) attend.epsilon = epsilon;
    if (attend.server.empty() &&
        (attend.mode == "decode" || attend.mode == "prefill")) {
      attend.server = linattn::DefaultServer();
    }
    if (!attend.server.empty()) {
      if (absl::Status s = linattn::ResolveConnection(&attend.connection);
          !s.ok()) {
        return UsageError(s);
      }
    }
    if (absl::Status s = linattn::Attend(attend); !s.ok()) return Fail(s);
    return 0;
  }
  if (ge->parsed()) {
    if (absl::Status s = linattn::ResolveConnection(&generate.connection);
        !s.ok()) {
      return UsageError(s);
    }
    if (absl::Status s = linattn::Generate(generate, std::cout, std::cerr);
        !s.ok()) {
      return Fail(s);
    }
    return 0;
  }
  if (se_list->parsed()) {
    if (absl::Status s = linattn::ResolveConnection(&list_connection);
        !s.ok()) {
      return UsageError(s);
    }
    if (absl::Status s = linattn::ListSessions(sessions_server, sessions_json,
                                               std::cout, list_connection);
        !s.ok()) {
      return Fail(s);
    }
    return 0;
  }
  if (se_delete->parsed()) {
    if (absl::Status s = linattn::ResolveConnection(&delete_connection);
        !s.ok()) {
      return UsageError(s);
    }
    if (absl::Status s = linattn::DeleteSessions(sessions_server, delete_ids,
                                                 std::cout, delete_connection);
        !s.ok()) {
      return Fail(s);
    }
    return 0;
  }
  if (he->parsed()) {
    if (absl::Status s = linattn::ResolveConnection(&health_connection);
        !s.ok()) {
      return UsageError(s);
    }
    linattn::RemoteAttention remote(health_server, health_connection);
    auto serving = remote.Healthy(
        health_service,
        std::chrono::milliseconds(int64_t(health_timeout * 1000)));
    if (!serving.ok()) return Fail(serving.status());
    std::cout << (*serving ? "SERVING" : "NOT_SERVING") << "\n";
    return *serving ? 0 : 1;
  }
  return 0;
}
