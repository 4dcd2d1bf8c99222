// linattn-load --server ADDR --sessions N --steps T [options]
// Prints a progress line per second on stderr and a summary (text, or one
// JSON object with --json) on stdout; exits 1 if any call failed or any
// sampled session's outputs differ from a local recomputation, 2 on a usage
// error. A run that --duration ends early is a timed run, not a failure; an
// open-loop run that falls short of --rate says so (and `rate_missed` in
// JSON). The sessions it creates are deleted however it ends. It connects
// as the flags of clients/common/connection.h say (TLS, mTLS, an API key).
#include <iostream>

#include "CLI/CLI.hpp"
#include "clients/common/connection.h"
#include "clients/load/generation_load.h"
#include "clients/load/load.h"
#include "core/util/flag_checks.h"
#include "core/util/malloc_settings.h"
#include "core/util/openmp_spin.h"

int main(int argc, char** argv) {
  // Usually beside the server it loads, on the same cores.
  linattn::UseShortOpenMpSpin(argv);
  linattn::UseServingMallocSettings();
  CLI::App app{"linattn-load: session-aware load generator for linattn-server"};
  app.set_version_flag("--version", "linattn-load " LINATTN_VERSION);
  linattn::LoadOptions o;
  linattn::GenerationLoadOptions g;
  std::string service = "attention";
  bool json = false;
  app.add_option("--service", service,
                 "attention: AttentionService sessions (Decode, DecodeBatch, "
                 "Prefill); generation: GenerationService model sessions "
                 "holding conversations (Append a user turn, Generate a "
                 "reply, repeat)")
      ->check(CLI::IsMember({"attention", "generation"}))
      ->capture_default_str();
  linattn::AddServerFlag(
      &app, &o.server,
      "host:port (loopback unless --allow-non-loopback), or unix:PATH");
  app.add_flag("--allow-non-loopback", o.allow_non_loopback,
               "permit a non-loopback target");
  app.add_option("--sessions", o.sessions, "sessions")->capture_default_str();
  app.add_option("--steps", o.steps, "decode steps per session")
      ->capture_default_str();
  app.add_option("--prefill", o.prefill, "tokens prefilled per session first")
      ->capture_default_str();
  app.add_option("--heads", o.heads, "heads per session")
      ->capture_default_str();
  app.add_option("--dim", o.dim, "key and value width per head")
      ->capture_default_str();
  app.add_option("--feature-map", o.feature_map,
                 "elu1 | relu | favor | cosine | identity (identity is "
                 "always unnormalized)")
      ->check(CLI::IsMember({"elu1", "relu", "favor", "cosine", "identity"}))
      ->capture_default_str();
  app.add_option("--rule", o.rule,
                 "update rule: linear | gated | delta | gated_delta | rwkv7 | "
                 "rwkv6 (the others with per-token gates, β and rwkv7's a "
                 "and b from the input pool, rwkv6 with a seeded bonus; "
                 "--feature-map is the linear rule's)")
      ->check(CLI::IsMember(
          {"linear", "gated", "delta", "gated_delta", "rwkv7", "rwkv6"}))
      ->capture_default_str();
  app.add_flag("--unnormalized", o.unnormalized,
               "sessions read out y = φ(q)ᵀS, no denominator");
  app.add_option("--horizon", o.horizon,
                 "cosine: the horizon M (default: prefill + steps)");
  app.add_option("--concurrency", o.concurrency,
                 "streams at once (0 = one per session, or per --batch group)")
      ->capture_default_str();
  app.add_option("--batch", o.batch,
                 "sessions per DecodeBatch message (0 or 1 = one Decode "
                 "stream per session)")
      ->capture_default_str();
  auto* gen = app.add_option_group(
      "Generation",
      "with --service generation (--sessions, --concurrency, "
      "--rate in turns/s, --duration, --verify and --seed too)");
  gen->add_option("--model", g.model,
                  "the served model (as ListModels names it; default: the "
                  "server's first)");
  gen->add_option("--turns", g.turns, "turns per session")
      ->capture_default_str();
  gen->add_option("--turn-tokens", g.turn_tokens,
                  "user token ids appended per turn (seeded)")
      ->capture_default_str();
  gen->add_option("--reply-tokens", g.reply_tokens, "max_tokens of each reply")
      ->capture_default_str();
  gen->add_option("--temperature", g.temperature,
                  "0 = greedy (verifiable); above 0 samples (then --verify 0)")
      ->check(CLI::Range(0.0, 100.0))
      ->capture_default_str();
  gen->add_option("--verify-model", g.verify_model_dir,
                  "the served model's directory, to replay greedy sessions in "
                  "this process (--verify of them; 4 unless given)");
  std::string verify_weights = "f32", verify_prefill = "f32";
  gen->add_option("--verify-weights", verify_weights,
                  "the server's --weights, for the local replay to pack the "
                  "model alike")
      ->check(CLI::IsMember({"f32", "bf16", "int8"}))
      ->capture_default_str();
  gen->add_option("--verify-prefill-precision", verify_prefill,
                  "the server's --prefill-precision, for the local replay's "
                  "chunkwise products")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  gen->add_option("--tie", g.tie,
                  "a server token within this many nats of the local "
                  "maximum logit passes verification")
      ->capture_default_str();
  std::string tensors = "bytes";
  app.add_option("--tensors", tensors,
                 "bytes: q, k, v, gates and outputs as packed little-endian "
                 "float32 (q_bytes, …); floats: as repeated float fields")
      ->check(CLI::IsMember({"bytes", "floats"}))
      ->capture_default_str();
  app.add_flag("--shared-memory", o.shared_memory,
               "prefills' tensors in a sealed memfd of each stream's, which "
               "the server reads and writes (a server with --shared-memory "
               "on a unix socket; --server unix:PATH)");
  app.add_option("--rate", o.rate,
                 "open loop: total steps/s (0 = closed loop); the summary "
                 "says when the run fell short of it")
      ->check(linattn::NumberAtLeast(0))
      ->capture_default_str();
  app.add_option("--duration", o.duration_s,
                 "bound on the whole run, seconds (a run it ends is a timed "
                 "run, not a failure)")
      ->check(linattn::NumberAtLeast(0.001))
      ->capture_default_str();
  app.add_option("--verify", o.verify, "sessions recomputed locally")
      ->capture_default_str();
  app.add_option("--seed", o.seed, "input seed")->capture_default_str();
  app.add_flag("--json", json, "print the summary as one JSON object");
  app.add_flag("!--no-progress", o.progress, "no progress lines on stderr");
  app.add_option("--session-prefix", o.session_prefix,
                 "name the sessions PREFIX-0 … PREFIX-(N-1), continue those "
                 "that exist from their position, and keep them all when the "
                 "run ends (the durable-session crash check; decode only)");
  app.add_option("--ledger", o.ledger,
                 "with --session-prefix: write each session's acknowledged "
                 "position to this JSON file (the larger of it and what the "
                 "file held); with --check: the file to check against");
  app.add_flag(
      "--failover", o.failover,
      "with --session-prefix: each step names the position it "
      "follows (expected_position), and a stream that breaks with "
      "UNAVAILABLE, CANCELLED or ABORTED (a replica behind the proxy died or "
      "handed its sessions over) or FAILED_PRECONDITION (another "
      "client moved a session) is continued on a new stream, from "
      "where GetSession says each session stands; a session found "
      "behind its acknowledged position fails the run");
  app.add_option("--only", o.only,
                 "with --session-prefix: run only the sessions PREFIX-i for "
                 "these i (comma-separated; --sessions is taken from the list)")
      ->delimiter(',');
  bool check = false;
  app.add_flag("--check", check,
               "check the server against --ledger instead of running load: "
               "every session there, at least at its acknowledged position, "
               "its state equal bit for bit to the local recomputation");
  linattn::AddConnectionFlags(&app, &o.connection);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help, --version: 0; usage: 2
  }

  if (absl::Status s = linattn::ResolveConnection(&o.connection); !s.ok()) {
    std::cerr << "linattn-load: error: " << s.message() << "\n";
    return 2;
  }
  o.tensors_as_bytes = tensors == "bytes";
  if (service == "generation") {
    if (!linattn::IsLoopbackAddress(o.server) && !o.allow_non_loopback) {
      std::cerr << "linattn-load: error: --server: " << o.server
                << " is not a loopback address (--allow-non-loopback)\n";
      return 2;
    }
    g.server = o.server;
    g.sessions = o.sessions;
    g.concurrency = o.concurrency;
    g.rate = o.rate;
    g.duration_s = o.duration_s;
    g.seed = o.seed;
    g.connection = o.connection;
    g.verify_weights = *linattn::ParseWeightType(verify_weights);
    g.verify_prefill_precision =
        *linattn::ParsePrefillPrecision(verify_prefill);
    if (app.count("--verify") > 0 || g.verify_model_dir.empty()) {
      g.verify = app.count("--verify") > 0 ? o.verify : 0;
    }
    auto summary = linattn::RunGenerationLoad(g);
    if (!summary.ok()) {
      std::cerr << "linattn-load: error: " << summary.status().message()
                << "\n";
      return 2;
    }
    const nlohmann::json j = linattn::GenerationSummaryJson(*summary, g);
    std::cout << (json ? j.dump() : j.dump(2)) << "\n";
    if (!summary->first_mismatch.empty()) {
      std::cerr << "linattn-load: mismatch: " << summary->first_mismatch
                << "\n";
    }
    return summary->ok() ? 0 : 1;
  }
  if (!o.only.empty()) o.sessions = static_cast<uint32_t>(o.only.size());
  if (check) {
    auto result = linattn::CheckLedger(o);
    if (!result.ok()) {
      std::cerr << "linattn-load: error: " << result.status().message() << "\n";
      return 2;
    }
    std::cout << linattn::LedgerCheckText(*result);
    return result->ok() ? 0 : 1;
  }
  auto summary = linattn::RunLoad(o);
  if (!summary.ok()) {
    std::cerr << "linattn-load: error: " << summary.status().message() << "\n";
    return 2;
  }
  if (json) {
    std::cout << linattn::SummaryJson(*summary, o).dump() << "\n";
  } else {
    std::cout << linattn::SummaryText(*summary, o);
  }
  return summary->ok() ? 0 : 1;
}
