#include "server/observability.h"

#include <prometheus/text_serializer.h>

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "server/logging.h"

namespace linattn {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Histogram;

// Seconds, from a decode step on a fast core (tens of microseconds) to a
// long prefill or a whole generation.
const Histogram::BucketBoundaries& LatencyBuckets() {
  static const Histogram::BucketBoundaries b = {
      0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
      0.1,     0.25,   0.5,     1,      2.5,   5,      10,    30,   60,    300};
  return b;
}

const Histogram::BucketBoundaries& SizeBuckets() {
  static const Histogram::BucketBoundaries b = {
      1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 16384, 65536};
  return b;
}

Histogram* NewHistogram(prometheus::Registry& registry, const std::string& name,
                        const std::string& help,
                        const Histogram::BucketBoundaries& buckets) {
  return &BuildHistogram().Name(name).Help(help).Register(registry).Add(
      {}, buckets);
}

prometheus::Gauge* NewGauge(prometheus::Registry& registry,
                            const std::string& name, const std::string& help,
                            const prometheus::Labels& labels = {}) {
  return &BuildGauge().Name(name).Help(help).Register(registry).Add(labels);
}

// A counter that mirrors a cumulative count read at scrape time.
void Feed(prometheus::Counter* counter, uint64_t now, uint64_t before) {
  if (now > before) counter->Increment(static_cast<double>(now - before));
}

}  // namespace

Observability::Observability(bool metrics)
    : metrics_(metrics), registry_(std::make_shared<prometheus::Registry>()) {
  prometheus::Registry& r = *registry_;
  requests_ = &BuildCounter()
                   .Name("linattn_requests_total")
                   .Help(
                       "Calls and requests finished, by service (a gRPC "
                       "service, or http), method (an RPC, or an HTTP "
                       "route) and status code")
                   .Register(r);
  request_seconds_ =
      &BuildHistogram()
           .Name("linattn_request_duration_seconds")
           .Help(
               "Time from a call's start to its status (streams: their "
               "whole length), by service and method")
           .Register(r);
  evictions_ = &BuildCounter()
                    .Name("linattn_evictions_total")
                    .Help("Sessions deleted for idleness (--idle-ttl), by kind")
                    .Register(r);
  decode_step_ = NewHistogram(
      r, "linattn_decode_step_seconds",
      "Attention decode steps: from a Decode or DecodeBatch message to its "
      "answer",
      LatencyBuckets());
  prefill_ = NewHistogram(
      r, "linattn_prefill_seconds",
      "Prefills: attention Prefill calls and model Append calls, whole",
      LatencyBuckets());
  first_token_ = NewHistogram(
      r, "linattn_time_to_first_token_seconds",
      "Generate (gRPC) and completions, chats and responses (HTTP): from "
      "the request to its first generated token",
      LatencyBuckets());
  between_tokens_ = NewHistogram(
      r, "linattn_time_between_tokens_seconds",
      "Time between consecutive generated tokens of one generation",
      LatencyBuckets());
  round_seconds_ = NewHistogram(r, "linattn_scheduler_round_seconds",
                                "Attention scheduler rounds: their length",
                                LatencyBuckets());
  round_size_ = NewHistogram(
      r, "linattn_scheduler_round_requests",
      "Attention scheduler rounds: requests (sessions) in each", SizeBuckets());
  iteration_seconds_ =
      NewHistogram(r, "linattn_generation_iteration_seconds",
                   "Generation iterations (one batched forward): their length",
                   LatencyBuckets());
  iteration_rows_ =
      NewHistogram(r, "linattn_generation_iteration_rows",
                   "Generation iterations: rows (decode tokens and prompt "
                   "pieces) in each",
                   SizeBuckets());
  durable_commit_ = NewHistogram(
      r, "linattn_durable_commit_seconds",
      "Durable sessions: a round's or iteration's records written (and "
      "synced, per --durability) to the state dir or the state store",
      LatencyBuckets());
  auto& sessions = BuildGauge()
                       .Name("linattn_sessions")
                       .Help("Sessions in the table, by kind")
                       .Register(r);
  sessions_attention_ = &sessions.Add({{"kind", "attention"}});
  sessions_model_ = &sessions.Add({{"kind", "model"}});
  struct GaugeDef {
    prometheus::Gauge** slot;
    const char* name;
    const char* help;
  };
  for (const GaugeDef& g : {
           GaugeDef{&tenants_, "linattn_tenants",
                    "Tenants holding at least one session"},
           GaugeDef{&state_bytes_, "linattn_state_bytes",
                    "Bytes of session state in use (charged against "
                    "--max-state-memory)"},
           GaugeDef{&state_budget_, "linattn_state_budget_bytes",
                    "The state memory budget (--max-state-memory)"},
           GaugeDef{&usage_, "linattn_kv_cache_usage_perc",
                    "State in use over the budget, 0 to 1 (the model-server "
                    "protocol's KV-cache utilization)"},
           GaugeDef{&waiting_, "linattn_num_requests_waiting",
                    "Compute requests queued and not yet started (the "
                    "model-server protocol's queued requests)"},
           GaugeDef{&running_, "linattn_num_requests_running",
                    "Compute requests under way (the model-server "
                    "protocol's running requests)"},
           GaugeDef{&in_flight_, "linattn_calls_in_flight",
                    "gRPC calls and HTTP requests under way (streams "
                    "included)"},
       }) {
    *g.slot = NewGauge(r, g.name, g.help);
  }
  auto& prefill_tokens = BuildCounter()
                             .Name("linattn_prefill_tokens_total")
                             .Help("Tokens prefilled, by service")
                             .Register(r);
  prefill_tokens_attention_ = &prefill_tokens.Add({{"service", "attention"}});
  prefill_tokens_model_ = &prefill_tokens.Add({{"service", "generation"}});
  auto& decode_tokens =
      BuildCounter()
          .Name("linattn_decode_tokens_total")
          .Help(
              "Tokens decoded (attention steps; generated tokens), by "
              "service")
          .Register(r);
  decode_tokens_attention_ = &decode_tokens.Add({{"service", "attention"}});
  decode_tokens_model_ = &decode_tokens.Add({{"service", "generation"}});
  auto counter = [&r](const std::string& name, const std::string& help) {
    return &BuildCounter().Name(name).Help(help).Register(r).Add({});
  };
  durable_commits_ = counter("linattn_durable_commits_total",
                             "Durable sessions: groups of records committed");
  durable_failed_ = counter(
      "linattn_durable_commit_failures_total",
      "Durable sessions: commits that failed (their requests failed whole)");
  durable_bytes_ = counter("linattn_durable_bytes_total",
                           "Durable sessions: bytes of records written");
  snapshots_written_ =
      counter("linattn_snapshots_written_total",
              "Durable sessions: session snapshots written (compaction, "
              "hand-overs, drain)");
}

Observability::~Observability() = default;

void Observability::CallEnded(const CallRecord& call) {
  const bool grpc = call.protocol == "grpc";
  (grpc ? grpc_calls_ : http_requests_).fetch_add(1);
  if (call.failed) (grpc ? grpc_failed_ : http_failed_).fetch_add(1);
  if (metrics_) {
    requests_
        ->Add({{"service", call.service_label},
               {"method", call.method_label},
               {"code", call.status}})
        .Increment();
    request_seconds_
        ->Add({{"service", call.service_label}, {"method", call.method_label}},
              LatencyBuckets())
        .Observe(call.seconds);
  }
  if (!AccessLogOn()) return;
  // Ids are at most 128 characters; a longer one (refused) is cut, so a
  // hostile id cannot make the log line large.
  std::string session = call.session;
  if (session.size() > 128) session = session.substr(0, 128) + "...";
  LogAccess({{"protocol", std::string(call.protocol)},
             {"method", call.method},
             {"session", session},
             {"tenant", call.tenant},
             {"status", call.status},
             {"code", call.code},
             {"latency_ms", call.seconds * 1e3},
             {"tokens_in", call.tokens_in},
             {"tokens_out", call.tokens_out},
             {"peer", call.peer}});
}

void Observability::DecodeStep(double s) {
  if (metrics_) decode_step_->Observe(s);
}
void Observability::Prefill(double s) {
  if (metrics_) prefill_->Observe(s);
}
void Observability::FirstToken(double s) {
  if (metrics_) first_token_->Observe(s);
}
void Observability::BetweenTokens(double s) {
  if (metrics_) between_tokens_->Observe(s);
}
void Observability::SchedulerRound(size_t requests, double s) {
  if (!metrics_) return;
  round_size_->Observe(static_cast<double>(requests));
  round_seconds_->Observe(s);
}
void Observability::GenerationIteration(size_t rows, double s) {
  if (!metrics_) return;
  iteration_rows_->Observe(static_cast<double>(rows));
  iteration_seconds_->Observe(s);
}
void Observability::DurableCommit(double s) {
  if (metrics_) durable_commit_->Observe(s);
}
void Observability::Evicted(absl::string_view kind, uint64_t sessions) {
  if (sessions == 0 || !metrics_) return;
  evictions_->Add({{"kind", std::string(kind)}})
      .Increment(static_cast<double>(sessions));
}

std::string Observability::Scrape() {
  {
    std::lock_guard<std::mutex> lock(scrape_mu_);
    ServerReadings now;
    if (reader_) reader_(now);
    sessions_attention_->Set(
        static_cast<double>(now.engine.attention_sessions));
    sessions_model_->Set(static_cast<double>(now.engine.model_sessions));
    tenants_->Set(static_cast<double>(now.engine.tenants));
    state_bytes_->Set(static_cast<double>(now.engine.state_bytes));
    state_budget_->Set(static_cast<double>(now.engine.state_budget_bytes));
    usage_->Set(now.engine.state_budget_bytes == 0
                    ? 0.0
                    : static_cast<double>(now.engine.state_bytes) /
                          static_cast<double>(now.engine.state_budget_bytes));
    waiting_->Set(static_cast<double>(now.engine.waiting));
    running_->Set(static_cast<double>(now.engine.running));
    in_flight_->Set(static_cast<double>(now.calls_in_flight));
    // The cumulative counts since start, fed as increments.
    const Engine::Readings& e = now.engine;
    const std::array<uint64_t, kFedCounters> counts = {
        e.attention.steps,
        e.attention.prefill_tokens,
        e.generation_stats.prompt_tokens,
        e.generation_stats.generated_tokens,
        e.store.commits,
        e.store.failed_commits,
        e.store.bytes,
        e.store.snapshots_written};
    prometheus::Counter* const counters[kFedCounters] = {
        decode_tokens_attention_, prefill_tokens_attention_,
        prefill_tokens_model_,    decode_tokens_model_,
        durable_commits_,         durable_failed_,
        durable_bytes_,           snapshots_written_};
    for (size_t i = 0; i < kFedCounters; ++i) {
      Feed(counters[i], counts[i], fed_[i]);
    }
    fed_ = counts;
  }
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

Observability::Totals Observability::totals() const {
  return {grpc_calls_.load(), grpc_failed_.load(), http_requests_.load(),
          http_failed_.load()};
}

HttpCallNote& CurrentHttpCall() {
  thread_local HttpCallNote note;
  return note;
}

std::string HttpRouteLabel(absl::string_view method, absl::string_view path) {
  static const char* const kFixed[] = {"/",
                                       "/health",
                                       "/metrics",
                                       "/v1/models",
                                       "/v1/explain",
                                       "/v1/explain/options",
                                       "/tokenize",
                                       "/detokenize",
                                       "/v1/completions",
                                       "/v1/chat/completions",
                                       "/v1/responses",
                                       "/v1/sessions",
                                       "/v1/sessions/restore"};
  for (const char* fixed : kFixed) {
    if (path == fixed) return absl::StrCat(method, " ", path);
  }
  std::vector<absl::string_view> parts =
      absl::StrSplit(path, '/', absl::SkipEmpty());
  // /v1/{models|responses|sessions}/{id}[/{fork|append|state}]
  if (parts.size() >= 3 && parts[0] == "v1" &&
      (parts[1] == "models" || parts[1] == "responses" ||
       parts[1] == "sessions")) {
    if (parts.size() == 3) {
      return absl::StrCat(method, " /v1/", parts[1], "/{id}");
    }
    if (parts.size() == 4 && parts[1] == "sessions" &&
        (parts[3] == "fork" || parts[3] == "append" || parts[3] == "state")) {
      return absl::StrCat(method, " /v1/sessions/{id}/", parts[3]);
    }
  }
  return "other";
}

}  // namespace linattn
