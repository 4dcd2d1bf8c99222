#include "clients/load/load.h"

#include <grpcpp/alarm.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <iterator>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "clients/cli/remote.h"
#include "clients/common/shared_region.h"
#include "core/attention/chunkwise.h"
#include "core/attention/recurrent.h"
#include "core/session/snapshot.h"
#include "core/util/status_macros.h"

namespace linattn {

const char* CodeName(grpc::StatusCode code) {
  static const char* kNames[] = {"OK",
                                 "CANCELLED",
                                 "UNKNOWN",
                                 "INVALID_ARGUMENT",
                                 "DEADLINE_EXCEEDED",
                                 "NOT_FOUND",
                                 "ALREADY_EXISTS",
                                 "PERMISSION_DENIED",
                                 "RESOURCE_EXHAUSTED",
                                 "FAILED_PRECONDITION",
                                 "ABORTED",
                                 "OUT_OF_RANGE",
                                 "UNIMPLEMENTED",
                                 "INTERNAL",
                                 "UNAVAILABLE",
                                 "DATA_LOSS",
                                 "UNAUTHENTICATED"};
  const int i = static_cast<int>(code);
  return i >= 0 && i < 17 ? kNames[i] : "UNKNOWN";
}

namespace {

using SteadyClock = std::chrono::steady_clock;

// The inputs of every (session, token): rows of a pool of random tokens
// (uniform in [-1, 1], from the seed), row chosen by a hash of (session,
// token). The verifier rebuilds the same pool; filling a message is a copy,
// so the load generator spends its share of the cores on gRPC, not on
// random numbers.
class InputPool {
 public:
  static constexpr uint64_t kRows = 4096;

  // Rows of q, k (qk floats each), v (vv), and for the gated and delta
  // rules gg log-gates in [−0.1, 0] and bb β in [0, 1].
  InputPool(uint64_t seed, const AttentionSpec& spec)
      : heads_(spec.num_heads),
        qk_(uint64_t{spec.num_heads} * spec.key_dim),
        vv_(uint64_t{spec.num_heads} * spec.value_dim),
        gg_(uint64_t{spec.num_heads} * GatesPerHead(spec)),
        bb_(HasBeta(spec.rule) ? spec.num_heads : 0),
        row_(2 * qk_ + vv_ + gg_ + bb_),
        data_(kRows * row_) {
    uint64_t x = seed * 0x9e3779b97f4a7c15ull;
    for (float& f : data_) {
      f = static_cast<float>(
          static_cast<double>(SplitMix(x) >> 40) / double(1ull << 23) - 1.0);
    }
    for (uint64_t r = 0; r < kRows; ++r) {
      float* row = data_.data() + r * row_ + 2 * qk_ + vv_;
      for (uint64_t i = 0; i < gg_; ++i) row[i] = -0.05f * (row[i] + 1.0f);
      for (uint64_t i = gg_; i < gg_ + bb_; ++i)
        row[i] = 0.5f * (row[i] + 1.0f);
    }
  }

  // Token `token` of session `session`: q, k (qk floats each), v (vv), and
  // its gates (gg) and β (bb) where the rule takes them.
  void Token(uint32_t session, uint64_t token, float* q, float* k, float* v,
             float* g = nullptr, float* beta = nullptr) const {
    uint64_t x = (uint64_t(session) << 40) ^ token;
    const float* row = data_.data() + (SplitMix(x) % kRows) * row_;
    std::memcpy(q, row, qk_ * sizeof(float));
    std::memcpy(k, row + qk_, qk_ * sizeof(float));
    std::memcpy(v, row + 2 * qk_, vv_ * sizeof(float));
    if (g != nullptr) std::memcpy(g, row + 2 * qk_ + vv_, gg_ * sizeof(float));
    if (beta != nullptr) {
      std::memcpy(beta, row + 2 * qk_ + vv_ + gg_, bb_ * sizeof(float));
    }
  }
  uint64_t heads() const { return heads_; }
  uint64_t qk() const { return qk_; }
  uint64_t vv() const { return vv_; }
  uint64_t gg() const { return gg_; }
  uint64_t bb() const { return bb_; }

 private:
  static uint64_t SplitMix(uint64_t& x) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

  const uint64_t heads_, qk_, vv_, gg_, bb_, row_;
  std::vector<float> data_;
};

// The sessions' spec these options give.
absl::StatusOr<AttentionSpec> LoadSpec(const LoadOptions& o) {
  AttentionSpec spec{
      .num_heads = o.heads, .key_dim = o.dim, .value_dim = o.dim};
  LINATTN_ASSIGN_OR_RETURN(spec.rule, ParseUpdateRule(o.rule));
  if (spec.rule != UpdateRule::kLinear) {
    // The gated and delta rules take q and k as given; the delta rules'
    // keys are L2-normalised, as DeltaNet's are.
    spec.feature_map = FeatureMapKind::kIdentity;
    spec.unnormalized = true;
    spec.qk_l2norm = HasBeta(spec.rule);
  } else {
    LINATTN_ASSIGN_OR_RETURN(spec.feature_map, ParseFeatureMap(o.feature_map));
    // identity has no normalised form (its weights can cancel in z).
    spec.unnormalized =
        o.unnormalized || spec.feature_map == FeatureMapKind::kIdentity;
  }
  if (spec.feature_map == FeatureMapKind::kCosine) {
    spec.horizon = o.horizon != 0 ? o.horizon : o.prefill + o.steps;
  }
  if (absl::Status s = ValidateSpec(spec); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the session spec these options give is not valid: ", s.message()));
  }
  return spec;
}

// Room for `n` floats of one tensor in the form `bytes` says: the
// "<name>_bytes" string (packed little-endian float32) or the repeated
// field, sized once.
float* TensorRoom(bool bytes, uint64_t n,
                  google::protobuf::RepeatedField<float>* floats,
                  std::string* packed) {
  if (bytes) {
    packed->resize(n * sizeof(float));
    return reinterpret_cast<float*>(packed->data());
  }
  floats->Resize(static_cast<int>(n), 0.0f);
  return floats->mutable_data();
}

// A response tensor in whichever form it came: the repeated field, or the
// bytes (packed little-endian float32) beside it.
std::span<const float> TensorOf(
    const google::protobuf::RepeatedField<float>& floats,
    const std::string& packed) {
  if (!packed.empty()) {
    return {reinterpret_cast<const float*>(packed.data()),
            packed.size() / sizeof(float)};
  }
  return {floats.data(), static_cast<size_t>(floats.size())};
}

// Where a Prefill's tensors sit in a unit's shared-memory region: q, k, v,
// g, beta, output, denominator one after another (bytes).
struct SharedLayout {
  uint64_t q, k, v, g, beta, output, denominator, end;
};
SharedLayout SharedLayoutOf(const InputPool& pool, uint64_t T) {
  SharedLayout l;
  l.q = 0;
  l.k = l.q + T * pool.qk() * sizeof(float);
  l.v = l.k + T * pool.qk() * sizeof(float);
  l.g = l.v + T * pool.vv() * sizeof(float);
  l.beta = l.g + T * pool.gg() * sizeof(float);
  l.output = l.beta + T * pool.bb() * sizeof(float);
  l.denominator = l.output + T * pool.vv() * sizeof(float);
  l.end = l.denominator + T * pool.heads() * sizeof(float);
  return l;
}

// The Prefill request of session s's first `tokens` inputs; with `region`,
// the tensors go there (shared_memory) instead of into the message.
void BuildPrefill(const LoadOptions& o, const InputPool& pool, uint32_t s,
                  const std::string& id, const ClientSharedRegion* region,
                  v1::PrefillRequest* request) {
  request->set_session_id(id);
  request->set_tokens(o.prefill);
  const bool b = o.tensors_as_bytes;
  const uint64_t T = o.prefill;
  float *q, *k, *v, *g, *beta;
  if (region != nullptr) {
    const SharedLayout l = SharedLayoutOf(pool, T);
    v1::SharedMemoryTensors* shm = request->mutable_shared_memory();
    shm->set_path(region->path());
    shm->set_q_offset(l.q);
    shm->set_k_offset(l.k);
    shm->set_v_offset(l.v);
    if (pool.gg() != 0) shm->set_g_offset(l.g);
    if (pool.bb() != 0) shm->set_beta_offset(l.beta);
    shm->set_output_offset(l.output);
    shm->set_denominator_offset(l.denominator);
    q = region->floats(l.q);
    k = region->floats(l.k);
    v = region->floats(l.v);
    g = region->floats(l.g);
    beta = region->floats(l.beta);
  } else {
    q = TensorRoom(b, T * pool.qk(), request->mutable_q(),
                   request->mutable_q_bytes());
    k = TensorRoom(b, T * pool.qk(), request->mutable_k(),
                   request->mutable_k_bytes());
    v = TensorRoom(b, T * pool.vv(), request->mutable_v(),
                   request->mutable_v_bytes());
    g = TensorRoom(b, T * pool.gg(), request->mutable_g(),
                   request->mutable_g_bytes());
    beta = TensorRoom(b, T * pool.bb(), request->mutable_beta(),
                      request->mutable_beta_bytes());
  }
  for (uint64_t t = 0; t < T; ++t) {
    pool.Token(s, t, q + t * pool.qk(), k + t * pool.qk(), v + t * pool.vv(),
               g + t * pool.gg(), beta + t * pool.bb());
  }
}

// Fills a DecodeRequest with token `token` of session s.
// With `expect`, the step names the position it follows (token), so a
// step resent after a failover is never applied twice.
void FillStep(const InputPool& pool, uint32_t s, const std::string& id,
              uint64_t token, bool expect, bool bytes,
              v1::DecodeRequest* request) {
  request->set_session_id(id);
  if (expect) {
    request->set_expected_position(token);
  } else {
    request->clear_expected_position();
  }
  pool.Token(s, token,
             TensorRoom(bytes, pool.qk(), request->mutable_q(),
                        request->mutable_q_bytes()),
             TensorRoom(bytes, pool.qk(), request->mutable_k(),
                        request->mutable_k_bytes()),
             TensorRoom(bytes, pool.vv(), request->mutable_v(),
                        request->mutable_v_bytes()),
             TensorRoom(bytes, pool.gg(), request->mutable_g(),
                        request->mutable_g_bytes()),
             TensorRoom(bytes, pool.bb(), request->mutable_beta(),
                        request->mutable_beta_bytes()));
}

struct SessionRecord {
  std::string id;
  uint32_t index = 0;  // whose inputs it gets (InputPool's session)
  // Its position when the run began (resumed sessions), plus the steps a
  // failover found applied without their answer.
  uint64_t start = 0;
  uint64_t steps_done = 0;
  // Failover: a step landed without its answer, so its output is missing
  // from `outputs` (the state is still checked, with --check).
  bool gap = false;
  bool prefilled = false;
  std::vector<float> outputs;  // steps_done × H × d_v (sampled sessions only)
};

double Percentile(std::vector<uint32_t>& v, double p) {
  if (v.empty()) return 0;
  const size_t i =
      std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  std::nth_element(v.begin(), v.begin() + i, v.end());
  return v[i];
}

// One load run on gRPC's callback API: every session (or group of sessions,
// with --batch) is a Driver (optional Prefills, then a Decode or DecodeBatch
// stream, one message in flight), and at most `concurrency` drivers are
// active; each finishing driver starts the next
// session from its completion callback. No thread blocks per stream.
class LoadRun {
 public:
  LoadRun(const LoadOptions& o, const InputPool& pool,
          v1::AttentionService::Stub& stub, std::vector<SessionRecord>& records,
          uint32_t verify)
      : o_(o), stub_(stub), records_(records), verify_(verify), pool_(pool) {}

  // `concurrency` units at once; a unit is a session, or with batch > 1 a
  // group of `batch` sessions sharing one DecodeBatch stream.
  void Execute(uint32_t concurrency, uint32_t batch) {
    batch_ = std::max<uint32_t>(batch, 1);
    const uint32_t sessions = static_cast<uint32_t>(records_.size());
    units_ = (sessions + batch_ - 1) / batch_;
    concurrency_ = std::min(concurrency, units_);
    start_ = SteadyClock::now();
    deadline_ = start_ + std::chrono::duration_cast<SteadyClock::duration>(
                             std::chrono::duration<double>(o_.duration_s));
    std::thread progress([this] { Progress(); });
    std::thread resync;
    if (o_.failover) resync = std::thread([this] { ResyncLoop(); });
    for (uint32_t i = 0; i < concurrency_; ++i) StartNext();
    {
      std::unique_lock<std::mutex> lock(mu_);
      all_done_.wait(lock, [this] { return finished_ == units_; });
      end_ = SteadyClock::now();
      stop_progress_ = true;
    }
    progress_cv_.notify_all();
    progress.join();
    if (resync.joinable()) resync.join();
  }

  double elapsed_seconds() const {
    return std::chrono::duration<double>(end_ - start_).count();
  }
  uint64_t steps_done() const { return steps_done_; }
  uint64_t prefill_tokens() const { return prefill_tokens_; }
  bool duration_reached() const { return duration_reached_; }
  std::map<std::string, uint64_t> errors() const { return errors_; }
  std::vector<uint32_t> latencies() const { return latencies_; }
  std::map<std::string, uint64_t> retried() const { return retried_; }
  uint64_t unanswered_steps() const { return unanswered_steps_; }
  std::vector<uint32_t> prefill_latencies() const { return prefill_latencies_; }
  double prefill_seconds() const {
    return std::chrono::duration<double>(last_prefill_ - first_prefill_)
        .count();
  }

 private:
  // What a unit of the load runs: one session's stream, or a group's.
  class Unit {
   public:
    virtual ~Unit() = default;
    virtual void Begin() = 0;
  };

  // Sessions [first, first + count) on one stream: a Decode stream of one
  // session, or (kBatched) a DecodeBatch stream whose every message carries
  // one step of each session in the group. Each session's optional Prefill
  // goes first, one session after another.
  template <bool kBatched>
  class Driver : public Unit,
                 public grpc::ClientBidiReactor<
                     std::conditional_t<kBatched, v1::DecodeBatchRequest,
                                        v1::DecodeRequest>,
                     std::conditional_t<kBatched, v1::DecodeBatchResponse,
                                        v1::DecodeResponse>> {
   public:
    // `t0`: the steps of each session already done (a stream reopened
    // after a failover).
    Driver(LoadRun* run, uint32_t first, uint32_t count, uint64_t t0 = 0)
        : run_(run), first_(first), count_(count), t_(t0) {}

    void Begin() override { PrefillNext(0); }

    void OnWriteDone(bool ok) override {
      if (ok) this->StartRead(&response_);
    }

    void OnReadDone(bool ok) override {
      if (!ok) {
        // The server ended the stream (OnDone follows at once with its
        // status) or a response could not be parsed (the server then waits
        // for the next step, and only a cancel ends the call).
        read_failed_ = true;
        alarm_.Set(std::chrono::system_clock::now() + std::chrono::seconds(2),
                   [this](bool fired) {
                     if (fired) ctx_.TryCancel();
                   });
        return;
      }
      const int64_t latency =
          std::chrono::duration_cast<std::chrono::microseconds>(
              SteadyClock::now() - scheduled_)
              .count();
      for (uint32_t i = 0; i < count_; ++i) {
        const uint32_t s = first_ + i;
        SessionRecord& rec = run_->records_[s];
        if (s < run_->verify_) {
          const std::span<const float> out =
              TensorOf(Response(i).output(), Response(i).output_bytes());
          if (out.size() == run_->pool_.vv()) {
            rec.outputs.insert(rec.outputs.end(), out.begin(), out.end());
          } else {
            // Not one step's output: the verifier, which compares
            // rec.outputs with its own, must never read past them.
            run_->RecordError(grpc::StatusCode::DATA_LOSS);
          }
        }
        ++rec.steps_done;
        run_->RecordStep(latency);
      }
      ++t_;
      NextStep();
    }

    void OnDone(const grpc::Status& status) override {
      alarm_.Cancel();
      // A stream that broke off (a proxy resets it when its replica dies,
      // and the read watchdog cancels it) is a failover's too.
      const grpc::StatusCode code =
          read_failed_ && status.error_code() == grpc::StatusCode::CANCELLED
              ? grpc::StatusCode::UNAVAILABLE
              : status.error_code();
      if (!status.ok() && run_->Failover(first_, count_, t_, code)) {
        return;  // a new stream continues these sessions
      }
      if (!status.ok() && run_->FailoverRunOver(code)) {
        // Broken off after the run's end: nothing is left to continue, and
        // --check holds the acknowledged steps to account.
      } else if (read_failed_ &&
                 status.error_code() == grpc::StatusCode::CANCELLED) {
        run_->RecordError(grpc::StatusCode::DATA_LOSS);  // unreadable reply
      } else if (!status.ok()) {
        run_->RecordError(status.error_code());
      }
      run_->UnitDone();
    }

   private:
    const v1::DecodeResponse& Response(uint32_t i) const {
      if constexpr (kBatched) {
        return response_.steps(static_cast<int>(i));
      } else {
        return response_;
      }
    }

    void PrefillNext(uint32_t i) {
      const LoadOptions& o = run_->o_;
      if (o.prefill == 0 || i == count_) {
        // The prefills' tensors are not needed again. Released now, a run
        // holds one unit's at a time (units live until the run ends), and
        // the next unit's prefill reuses their memory rather than faulting
        // in fresh pages. The last call is complete: this runs from its
        // callback (or with no prefill, when they are empty).
        v1::PrefillRequest().Swap(&prefill_request_);
        v1::PrefillResponse().Swap(&prefill_response_);
        prefill_ctx_.reset();
        region_.reset();
        OpenStream();
        return;
      }
      SessionRecord& rec = run_->records_[first_ + i];
      prefill_request_.Clear();
      prefill_response_.Clear();
      if (o.shared_memory && !region_.has_value()) {
        absl::StatusOr<ClientSharedRegion> region = ClientSharedRegion::Create(
            "linattn-load", SharedLayoutOf(run_->pool_, o.prefill).end);
        if (!region.ok()) {  // memory: RunLoad made one region already
          run_->RecordError(grpc::StatusCode::RESOURCE_EXHAUSTED);
          run_->UnitDone();
          return;
        }
        region_.emplace(*std::move(region));
      }
      BuildPrefill(o, run_->pool_, rec.index, rec.id,
                   region_.has_value() ? &*region_ : nullptr,
                   &prefill_request_);
      prefill_ctx_ = std::make_unique<grpc::ClientContext>();
      NameSession(*prefill_ctx_, rec.id);
      const auto sent = SteadyClock::now();
      run_->stub_.async()->Prefill(
          prefill_ctx_.get(), &prefill_request_, &prefill_response_,
          [this, i, sent, &rec](grpc::Status status) {
            if (!status.ok()) {
              run_->RecordError(status.error_code());
              run_->UnitDone();
              return;
            }
            rec.prefilled = true;
            run_->RecordPrefill(sent, SteadyClock::now(), run_->o_.prefill);
            PrefillNext(i + 1);
          });
    }

    void OpenStream() {
      ctx_.set_deadline(
          std::chrono::system_clock::now() +
          std::chrono::duration_cast<std::chrono::system_clock::duration>(
              run_->deadline_ - SteadyClock::now()) +
          std::chrono::seconds(5));
      // A DecodeBatch stream is routed by its first session: behind a
      // proxy, the group's other sessions are taken over by the replica it
      // reaches.
      NameSession(ctx_, run_->records_[first_].id);
      if constexpr (kBatched) {
        run_->stub_.async()->DecodeBatch(&ctx_, this);
      } else {
        run_->stub_.async()->Decode(&ctx_, this);
      }
      stream_start_ = SteadyClock::now();
      this->StartCall();
      NextStep();
    }

    // Closed loop: send now. Open loop: send at this stream's share of the
    // rate (count_ steps per message), measuring latency from the scheduled
    // time.
    void NextStep() {
      const LoadOptions& o = run_->o_;
      if (t_ >= o.steps) {
        this->StartWritesDone();
        return;
      }
      const auto now = SteadyClock::now();
      if (now >= run_->deadline_) {
        run_->duration_reached_ = true;
        this->StartWritesDone();
        return;
      }
      scheduled_ = now;
      if (o.rate > 0) {
        scheduled_ =
            stream_start_ + std::chrono::duration_cast<SteadyClock::duration>(
                                std::chrono::duration<double>(
                                    t_ * run_->concurrency_ * count_ / o.rate));
        if (scheduled_ > now) {
          alarm_.Set(std::chrono::system_clock::now() + (scheduled_ - now),
                     [this](bool) { SendStep(); });
          return;
        }
      }
      SendStep();
    }

    void SendStep() {
      for (uint32_t i = 0; i < count_; ++i) {
        const uint64_t token =
            run_->o_.prefill + run_->records_[first_ + i].start + t_;
        v1::DecodeRequest* step;
        if constexpr (kBatched) {
          step = i < uint32_t(request_.steps_size())
                     ? request_.mutable_steps(static_cast<int>(i))
                     : request_.add_steps();
        } else {
          step = &request_;
        }
        FillStep(run_->pool_, run_->records_[first_ + i].index,
                 run_->records_[first_ + i].id, token, run_->o_.failover,
                 run_->o_.tensors_as_bytes, step);
      }
      this->StartWrite(&request_);
    }

    LoadRun* const run_;
    const uint32_t first_, count_;
    grpc::ClientContext ctx_;
    std::unique_ptr<grpc::ClientContext> prefill_ctx_;
    v1::PrefillRequest prefill_request_;
    v1::PrefillResponse prefill_response_;
    std::optional<ClientSharedRegion> region_;  // --shared-memory's prefills
    std::conditional_t<kBatched, v1::DecodeBatchRequest, v1::DecodeRequest>
        request_;
    std::conditional_t<kBatched, v1::DecodeBatchResponse, v1::DecodeResponse>
        response_;
    grpc::Alarm alarm_;  // the open loop's next send, or the read watchdog
    bool read_failed_ = false;
    uint64_t t_;
    SteadyClock::time_point stream_start_, scheduled_;
  };

  // The codes a stream ends with when its replica left, a proxy reset it,
  // or its session moved.
  static bool FailoverCode(grpc::StatusCode code) {
    return code == grpc::StatusCode::UNAVAILABLE ||
           code == grpc::StatusCode::ABORTED ||
           code == grpc::StatusCode::FAILED_PRECONDITION ||
           // This tool cancels no stream itself (its read watchdog's cancel
           // arrives as UNAVAILABLE): a proxy reset it as its replica left.
           code == grpc::StatusCode::CANCELLED;
  }

  // --failover: a stream of sessions [first, first + count) that ended
  // with `code` after `t` steps each is continued by a new one, once the
  // server says where each session stands. False when the error is not a
  // failover's (or the run is over): it counts as an error.
  bool Failover(uint32_t first, uint32_t count, uint64_t t,
                grpc::StatusCode code) {
    if (!o_.failover || t >= o_.steps || SteadyClock::now() >= deadline_ ||
        !FailoverCode(code)) {
      return false;
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++retried_[CodeName(code)];
    resyncs_.push_back({first, count, t});
    resync_cv_.notify_all();
    return true;
  }

  // With --failover, a stream that broke off as a failover's do after the
  // run's duration ended: not an error (a SIGSTOPped replica's streams
  // break when it resumes, which may be after the end).
  bool FailoverRunOver(grpc::StatusCode code) const {
    return o_.failover && SteadyClock::now() >= deadline_ && FailoverCode(code);
  }

  // Asks where each session of a broken stream stands (through the proxy:
  // the replica that serves it now), then continues it on a new stream.
  // Runs on its own thread: the calls block (a takeover waits for the old
  // owner's lease), gRPC's callback threads must not.
  void ResyncLoop() {
    for (;;) {
      Resync item;
      {
        std::unique_lock<std::mutex> lock(mu_);
        resync_cv_.wait(
            lock, [this] { return !resyncs_.empty() || finished_ == units_; });
        if (resyncs_.empty()) return;
        item = resyncs_.front();
        resyncs_.pop_front();
      }
      bool lost = false;
      bool over = false;
      for (uint32_t i = 0; i < item.count && !lost && !over; ++i) {
        SessionRecord& rec = records_[item.first + i];
        for (;;) {
          if (SteadyClock::now() >= deadline_) {
            over = true;
            break;
          }
          grpc::ClientContext ctx;
          ctx.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::seconds(5));
          NameSession(ctx, rec.id);
          v1::GetSessionRequest req;
          req.set_session_id(rec.id);
          v1::Session session;
          const grpc::Status st = stub_.GetSession(&ctx, req, &session);
          if (!st.ok()) {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            continue;
          }
          const uint64_t acknowledged = rec.start + rec.steps_done;
          if (session.position() < acknowledged) {
            // An acknowledged step is gone: the failure this tool exists
            // to find.
            RecordError(grpc::StatusCode::DATA_LOSS);
            lost = true;
          } else if (session.position() > acknowledged) {
            const uint64_t extra = session.position() - acknowledged;
            rec.start += extra;
            rec.gap = true;
            unanswered_steps_ += extra;
          }
          break;
        }
      }
      if (lost || over) {
        if (over) duration_reached_ = true;
        UnitDone();
        continue;
      }
      Unit* unit;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (item.count == 1 && batch_ <= 1) {
          units_owned_.push_back(
              std::make_unique<Driver<false>>(this, item.first, 1, item.t));
        } else {
          units_owned_.push_back(std::make_unique<Driver<true>>(
              this, item.first, item.count, item.t));
        }
        unit = units_owned_.back().get();
      }
      unit->Begin();
    }
  }

  // Starts the next unit: a session (batch ≤ 1) or a group of `batch`.
  void StartNext() {
    const uint32_t u = next_unit_.fetch_add(1);
    if (u >= units_) return;
    Unit* unit;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (batch_ <= 1) {
        units_owned_.push_back(std::make_unique<Driver<false>>(this, u, 1));
      } else {
        const uint32_t first = u * batch_;
        const uint32_t count = std::min<uint32_t>(
            batch_, static_cast<uint32_t>(records_.size()) - first);
        units_owned_.push_back(
            std::make_unique<Driver<true>>(this, first, count));
      }
      unit = units_owned_.back().get();
    }
    if (SteadyClock::now() >= deadline_) {
      duration_reached_ = true;
      UnitDone();
      return;
    }
    unit->Begin();
  }

  void UnitDone() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++finished_;
      if (finished_ == units_) {
        all_done_.notify_all();
        resync_cv_.notify_all();
      }
    }
    StartNext();
  }

  void RecordStep(int64_t latency_us) {
    ++steps_done_;
    std::lock_guard<std::mutex> lock(mu_);
    latencies_.push_back(static_cast<uint32_t>(latency_us));
  }
  void RecordError(grpc::StatusCode code) {
    std::lock_guard<std::mutex> lock(mu_);
    ++errors_[CodeName(code)];
  }
  void RecordPrefill(SteadyClock::time_point sent, SteadyClock::time_point done,
                     uint64_t tokens) {
    prefill_tokens_ += tokens;
    std::lock_guard<std::mutex> lock(mu_);
    first_prefill_ = std::min(first_prefill_, sent);
    last_prefill_ = std::max(last_prefill_, done);
    prefill_latencies_.push_back(static_cast<uint32_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(done - sent)
            .count()));
  }

  void Progress() {
    uint64_t last = 0;
    std::unique_lock<std::mutex> lock(mu_);
    while (!progress_cv_.wait_for(lock, std::chrono::seconds(1),
                                  [this] { return stop_progress_; })) {
      if (!o_.progress) continue;
      uint64_t n_errors = 0;
      for (const auto& [code, n] : errors_) n_errors += n;
      const uint64_t now_steps = steps_done_;
      std::fprintf(
          stderr, "[%6.1fs] %llu steps, %llu steps/s, %llu errors\n",
          std::chrono::duration<double>(SteadyClock::now() - start_).count(),
          static_cast<unsigned long long>(now_steps),
          static_cast<unsigned long long>(now_steps - last),
          static_cast<unsigned long long>(n_errors));
      last = now_steps;
    }
  }

  const LoadOptions& o_;
  v1::AttentionService::Stub& stub_;
  std::vector<SessionRecord>& records_;
  const uint32_t verify_;
  const InputPool& pool_;
  uint32_t concurrency_ = 1;
  SteadyClock::time_point start_, end_, deadline_;
  uint32_t batch_ = 1;  // sessions per DecodeBatch message (≤ 1: Decode)
  uint32_t units_ = 0;  // sessions, or groups of batch_ sessions
  std::atomic<uint32_t> next_unit_{0};
  std::atomic<uint64_t> steps_done_{0}, prefill_tokens_{0};
  std::atomic<bool> duration_reached_{false};

  struct Resync {
    uint32_t first = 0, count = 0;
    uint64_t t = 0;
  };
  std::atomic<uint64_t> unanswered_steps_{0};

  std::mutex mu_;
  std::condition_variable all_done_, progress_cv_, resync_cv_;
  std::deque<Resync> resyncs_;                           // guarded by mu_
  std::map<std::string, uint64_t> retried_;              // guarded by mu_
  size_t finished_ = 0;                                  // guarded by mu_
  bool stop_progress_ = false;                           // guarded by mu_
  std::vector<std::unique_ptr<Unit>> units_owned_;       // guarded by mu_
  std::map<std::string, uint64_t> errors_;               // guarded by mu_
  std::vector<uint32_t> latencies_, prefill_latencies_;  // guarded by mu_
  SteadyClock::time_point first_prefill_ = SteadyClock::time_point::max();
  SteadyClock::time_point last_prefill_ = SteadyClock::time_point::min();
};

}  // namespace

uint32_t Streams(const LoadOptions& o) {
  const uint32_t per_stream = std::max<uint32_t>(o.batch, 1);
  const uint32_t units = (o.sessions + per_stream - 1) / per_stream;
  return o.concurrency == 0 ? units : std::min(o.concurrency, units);
}

bool IsLoopbackAddress(const std::string& address) {
  // A unix socket reaches only processes on this machine.
  if (address.rfind("unix:", 0) == 0) return true;
  const size_t colon = address.rfind(':');
  std::string host = address.substr(0, colon);
  if (host.rfind("ipv4:", 0) == 0) host = host.substr(5);
  if (host == "localhost" || host == "[::1]" || host == "::1") return true;
  return host.rfind("127.", 0) == 0;
}

absl::StatusOr<LoadSummary> RunLoad(const LoadOptions& o) {
  if (!IsLoopbackAddress(o.server) && !o.allow_non_loopback) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--server: ", o.server,
        " is not a loopback address; load runs target this machine only "
        "(--allow-non-loopback to override)"));
  }
  if (o.sessions == 0 || o.steps == 0) {
    return absl::InvalidArgumentError(
        "--sessions and --steps: must be at least 1");
  }
  if (o.duration_s <= 0 || o.rate < 0) {
    return absl::InvalidArgumentError("--duration must be > 0 and --rate >= 0");
  }
  if (!o.session_prefix.empty() && o.prefill != 0) {
    return absl::InvalidArgumentError(
        "--session-prefix: runs that continue sessions decode only (--prefill "
        "0), so that every state can be checked bit for bit");
  }
  if (!o.only.empty() &&
      (o.session_prefix.empty() || o.only.size() != o.sessions)) {
    return absl::InvalidArgumentError(
        "--only: needs --session-prefix, and is the list of the sessions run "
        "(--sessions is its length)");
  }
  if (o.shared_memory) {
    if (o.prefill == 0 || !absl::StartsWith(o.server, "unix:")) {
      return absl::InvalidArgumentError(
          "--shared-memory: prefills' tensors through a memfd need --prefill "
          "and a server on a unix socket (--server unix:PATH)");
    }
    // Refused here rather than unit by unit when memfds are not available.
    LINATTN_RETURN_IF_ERROR(
        ClientSharedRegion::Create("linattn-load", sizeof(float)).status());
  }
  if (o.failover && o.session_prefix.empty()) {
    return absl::InvalidArgumentError(
        "--failover: needs --session-prefix (a broken stream continues its "
        "sessions from where the server says they stand)");
  }
  if (!o.ledger.empty() && o.session_prefix.empty()) {
    return absl::InvalidArgumentError(
        "--ledger: needs --session-prefix (sessions the run keeps)");
  }
  LINATTN_ASSIGN_OR_RETURN(AttentionSpec spec, LoadSpec(o));
  const uint64_t qk = uint64_t(o.heads) * o.dim, vv = qk;
  const uint32_t concurrency = Streams(o);
  const uint32_t verify = std::min(o.verify, o.sessions);

  RemoteAttention remote(o.server, o.connection);
  LINATTN_ASSIGN_OR_RETURN(bool serving,
                           remote.Healthy("", std::chrono::seconds(5)));
  if (!serving)
    return absl::UnavailableError(absl::StrCat(o.server, " is not SERVING"));

  std::vector<SessionRecord> records(o.sessions);
  // Every session this run creates is deleted when it ends, however it
  // ends (a failure halfway through creating them included), unless the
  // run keeps them (--session-prefix).
  struct Cleanup {
    RemoteAttention& remote;
    std::vector<SessionRecord>& records;
    bool keep;
    ~Cleanup() {
      if (keep) return;
      for (const SessionRecord& rec : records) {
        if (!rec.id.empty()) (void)remote.DeleteSession(rec.id);
      }
    }
  } cleanup{remote, records, !o.session_prefix.empty()};
  for (uint32_t s = 0; s < o.sessions; ++s) {
    records[s].index = o.only.empty() ? s : o.only[s];
    const std::string id =
        o.session_prefix.empty()
            ? ""
            : absl::StrCat(o.session_prefix, "-", records[s].index);
    auto session = remote.CreateSession(spec, std::nullopt, id);
    if (absl::IsAlreadyExists(session.status())) {
      // Continued from where it is.
      session = remote.GetSession(id);
      if (session.ok() &&
          (session->spec().num_heads() != o.heads ||
           session->spec().key_dim() != o.dim ||
           session->spec().feature_map() != FeatureMapName(spec.feature_map) ||
           session->spec().rule() != UpdateRuleName(spec.rule))) {
        return absl::FailedPreconditionError(
            absl::StrCat("--session-prefix: session '", id,
                         "' exists with another spec than these options give"));
      }
      if (session.ok()) records[s].start = session->position();
    }
    if (!session.ok()) return session.status();
    records[s].id = session->session_id();
    spec.epsilon =
        session->spec().epsilon();  // the server's default, for the verifier
  }

  const InputPool pool(o.seed, spec);
  LoadRun run(o, pool, remote.stub(), records, verify);
  run.Execute(concurrency, o.batch);
  const double elapsed_s = run.elapsed_seconds();

  LoadSummary summary;
  summary.seconds = elapsed_s;
  summary.steps = run.steps_done();
  summary.prefill_tokens = run.prefill_tokens();
  summary.steps_per_second = summary.steps / summary.seconds;
  summary.duration_reached = run.duration_reached();
  summary.rate_missed = o.rate > 0 && summary.steps_per_second < 0.95 * o.rate;
  summary.errors = run.errors();
  summary.retried = run.retried();
  summary.unanswered_steps = run.unanswered_steps();
  std::vector<uint32_t> lat = run.latencies();
  std::vector<uint32_t> prefill_latencies = run.prefill_latencies();
  summary.p50_us = Percentile(lat, 0.50);
  summary.p90_us = Percentile(lat, 0.90);
  summary.p99_us = Percentile(lat, 0.99);
  summary.max_us = lat.empty() ? 0 : *std::max_element(lat.begin(), lat.end());
  if (!prefill_latencies.empty()) {
    summary.prefill_seconds = run.prefill_seconds();
    summary.prefill_tokens_per_second =
        summary.prefill_tokens / summary.prefill_seconds;
    summary.prefill_p50_us = Percentile(prefill_latencies, 0.5);
    summary.prefill_max_us =
        *std::max_element(prefill_latencies.begin(), prefill_latencies.end());
  }

  // Recompute the sampled sessions locally. Decode-only sessions run the
  // same kernel as the server, so they must match bit for bit. After a
  // prefill, both sides carry fp32 rounding of the chunkwise order, each
  // within a bound of the truth (tests/attention/test_util.h and
  // rule_bounds.h derive them), so the two are within twice that:
  //  * linear rule: e·Σ_j|w_j||v_j|, e = (3n + 2d_φ + 16)·u. For normalised
  //    read-outs Σ|w||v| / Σw ≤ max|v| = 1 here; unnormalised, the sum
  //    itself is computed by a second local pass over |v| (and |q|, |k| for
  //    identity, whose features are signed).
  //  * gated rule: u·((4n + 2d_k + 2C + 32)·N + 4·N_g), N the same pass
  //    over |q|, |k|, |v| with the session's gates, N_g ≤ that pass with
  //    open gates (each term's L·e^{−L} ≤ 1).
  //  * delta rules (L2-normalised keys, β ≤ 1, α ≤ 1: no step grows an
  //    error): ‖q‖·Δ_t + (2d_k + 8)·u·‖q‖‖S_t‖ with Δ_t = Δ_{t−1} +
  //    u·(4(d_k + C) + 16 + 4·B_t)·(2‖S_{t−1}‖ + β‖v‖), the norms taken from
  //    a local token-by-token pass.
  LINATTN_ASSIGN_OR_RETURN(Attention attention, Attention::Create(spec));
  const bool exact = o.prefill == 0;
  const uint64_t gg = pool.gg(), bb = pool.bb();
  const uint64_t C = ChunkwiseOptions{}.chunk_size;
  constexpr double u = 0x1.0p-24;
  auto run_local = [&](const SequenceInput& in, uint64_t prefix, uint64_t steps,
                       float* y) -> absl::Status {
    std::vector<float> den((prefix + steps) * o.heads);
    std::vector<uint8_t> avail((prefix + steps) * o.heads);
    AttentionState state = attention.NewState();
    if (prefix > 0) {
      SequenceInput head = in;
      head.tokens = prefix;
      ChunkwiseRunner runner;
      LINATTN_RETURN_IF_ERROR(
          runner.Run(attention, state, head, {y, den.data(), avail.data()}));
    }
    SequenceInput tail = TokenOf(spec, in, prefix);
    tail.tokens = steps;
    return StepSequence(attention, state, tail,
                        {y + prefix * vv, den.data() + prefix * o.heads,
                         avail.data() + prefix * o.heads});
  };
  // The delta rules' bound per output row (t, h), from a local pass.
  auto delta_bounds = [&](const SequenceInput& in, uint64_t total,
                          std::vector<double>* bound) -> absl::Status {
    AttentionState state = attention.NewState();
    std::vector<float> y(vv), den(o.heads);
    std::vector<uint8_t> avail(o.heads);
    std::vector<double> error(o.heads, 0.0), norm(o.heads, 0.0),
        window(o.heads, 0.0);
    bound->assign(total * o.heads, 0.0);
    for (uint64_t t = 0; t < total; ++t) {
      const SequenceInput token = TokenOf(spec, in, t);
      LINATTN_RETURN_IF_ERROR(
          Step(attention, state, token, {y.data(), den.data(), avail.data()}));
      for (uint32_t h = 0; h < o.heads; ++h) {
        if (token.g != nullptr) {
          window[h] += std::abs(double(token.g[h]));
          if (t >= C)
            window[h] -= std::abs(double(in.g[(t - C) * o.heads + h]));
        }
        double v_norm = 0, s_norm = 0;
        for (uint32_t c = 0; c < o.dim; ++c) {
          v_norm += double(token.v[h * o.dim + c]) * token.v[h * o.dim + c];
        }
        const float* sh = state.s(h);
        for (uint64_t e = 0; e < uint64_t{o.dim} * o.dim; ++e) {
          s_norm += double(sh[e]) * sh[e];
        }
        const double kappa =
            4.0 * (o.dim + C) + 16 + 4 * std::max(window[h], 0.0);
        error[h] +=
            u * kappa * (2 * norm[h] + token.beta[h] * std::sqrt(v_norm));
        norm[h] = std::sqrt(s_norm);
        // ‖q‖ ≤ 1: L2-normalised, scale 1.
        (*bound)[t * o.heads + h] = error[h] + (2.0 * o.dim + 8) * u * norm[h];
      }
    }
    return absl::OkStatus();
  };
  for (uint32_t s = 0; s < verify; ++s) {
    const SessionRecord& rec = records[s];
    // A step applied without its answer has no output here.
    if (rec.steps_done == 0 || rec.gap) continue;
    const uint64_t prefix = rec.prefilled ? o.prefill : 0;
    // A continued session's earlier steps are recomputed too (step by step,
    // as the server ran them).
    const uint64_t total = prefix + rec.start + rec.steps_done;
    std::vector<float> q(total * qk), k(total * qk), v(total * vv),
        g(total * gg), beta(total * bb);
    for (uint64_t t = 0; t < total; ++t) {
      pool.Token(rec.index, t, &q[t * qk], &k[t * qk], &v[t * vv],
                 g.data() + t * gg, beta.data() + t * bb);
    }
    SequenceInput in{q.data(), k.data(), v.data(), total};
    if (gg != 0) in.g = g.data();
    if (bb != 0) in.beta = beta.data();
    std::vector<float> y(total * vv);
    LINATTN_RETURN_IF_ERROR(
        run_local(in, prefix, rec.start + rec.steps_done, y.data()));
    // Σ|w||v| per output (linear, unnormalised; gated: N and the open-gate
    // pass), or the delta rules' bound per row.
    std::vector<float> magnitude, open_magnitude;
    std::vector<double> row_bound;
    auto abs_of = [](std::vector<float> x) {
      for (float& f : x) f = std::abs(f);
      return x;
    };
    if (!exact && HasBeta(spec.rule)) {
      LINATTN_RETURN_IF_ERROR(delta_bounds(in, total, &row_bound));
    } else if (!exact && spec.unnormalized) {
      const bool signed_features =
          spec.feature_map == FeatureMapKind::kIdentity;
      const std::vector<float> aq = signed_features ? abs_of(q) : q;
      const std::vector<float> ak = signed_features ? abs_of(k) : k;
      const std::vector<float> av = abs_of(v);
      SequenceInput abs_in = in;
      abs_in.q = aq.data();
      abs_in.k = ak.data();
      abs_in.v = av.data();
      magnitude.resize(total * vv);
      LINATTN_RETURN_IF_ERROR(run_local(
          abs_in, prefix, rec.start + rec.steps_done, magnitude.data()));
      if (gg != 0) {
        const std::vector<float> open(g.size(), 0.0f);
        abs_in.g = open.data();
        open_magnitude.resize(total * vv);
        LINATTN_RETURN_IF_ERROR(run_local(
            abs_in, prefix, rec.start + rec.steps_done, open_magnitude.data()));
      }
    }
    const float* expected = y.data() + (prefix + rec.start) * vv;
    bool match = true;
    if (exact) {
      match = std::memcmp(expected, rec.outputs.data(),
                          rec.outputs.size() * sizeof(float)) == 0;
    } else {
      for (size_t i = 0; i < rec.outputs.size() && match; ++i) {
        const uint64_t at = (prefix + rec.start) * vv + i;  // in y
        const double n = double(at / vv + 1);               // tokens seen
        double bound;
        // The magnitude passes are fp32 themselves, within a relative
        // error ≪ 1% of the true sums: 1% covers them.
        if (!row_bound.empty()) {
          bound = 1.01 * row_bound[at / o.dim] +
                  2 * u * std::abs(double(expected[i]));
        } else if (!open_magnitude.empty()) {
          bound = 1.01 * u *
                  ((4 * n + 2.0 * o.dim + 2.0 * C + 32) * magnitude[at] +
                   4 * open_magnitude[at]);
        } else {
          const double e =
              (3.0 * total + 2.0 * attention.feature_dim() + 16) * u;
          bound = e * (magnitude.empty() ? 1.0 : 1.01 * magnitude[at]);
        }
        match = std::abs(double(expected[i]) - rec.outputs[i]) <= 2.0 * bound;
      }
    }
    ++summary.verified_sessions;
    if (!match) ++summary.mismatched_sessions;
  }
  if (!o.ledger.empty()) {
    nlohmann::json ledger = nlohmann::json::object();
    if (std::ifstream in(o.ledger); in) {
      const std::string text((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
      // An empty file (a fresh `mktemp`) is an empty ledger.
      if (text.find_first_not_of(" \t\r\n") != std::string::npos) {
        ledger =
            nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
      }
      if (!ledger.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--ledger: ", o.ledger, " is not a JSON object"));
      }
    }
    for (const SessionRecord& rec : records) {
      const uint64_t acknowledged = rec.start + rec.steps_done;
      const uint64_t before = ledger.value(rec.id, uint64_t{0});
      ledger[rec.id] = std::max(before, acknowledged);
    }
    std::ofstream out(o.ledger + ".tmp");
    out << ledger.dump(1) << "\n";
    out.close();
    if (!out || std::rename((o.ledger + ".tmp").c_str(), o.ledger.c_str())) {
      return absl::InternalError(
          absl::StrCat("--ledger: cannot write ", o.ledger));
    }
  }
  return summary;
}

absl::StatusOr<LedgerCheck> CheckLedger(const LoadOptions& o) {
  if (o.ledger.empty()) {
    return absl::InvalidArgumentError("--check: needs --ledger FILE");
  }
  std::ifstream in(o.ledger);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("--ledger: cannot read ", o.ledger));
  }
  const nlohmann::json ledger =
      nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!ledger.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ledger: ", o.ledger, " is not a JSON object"));
  }
  RemoteAttention remote(o.server, o.connection);
  LINATTN_ASSIGN_OR_RETURN(bool serving,
                           remote.Healthy("", std::chrono::seconds(30)));
  if (!serving)
    return absl::UnavailableError(absl::StrCat(o.server, " is not SERVING"));
  const uint64_t qk = uint64_t(o.heads) * o.dim, vv = qk;
  LINATTN_ASSIGN_OR_RETURN(const AttentionSpec spec, LoadSpec(o));
  const InputPool pool(o.seed, spec);
  LedgerCheck check;
  for (const auto& [id, value] : ledger.items()) {
    if (!value.is_number_unsigned()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--ledger: the position of '", id, "' is not a whole number"));
    }
    const uint64_t acknowledged = value.get<uint64_t>();
    // Session i of the run is <prefix>-i: its inputs are row i's.
    const size_t dash = id.rfind('-');
    uint32_t index = 0;
    if (dash == std::string::npos ||
        !absl::SimpleAtoi(id.substr(dash + 1), &index)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--ledger: '", id, "' is not a <prefix>-<index> session id"));
    }
    ++check.sessions;
    check.acknowledged += acknowledged;
    auto blob = remote.Snapshot(id);
    if (!blob.ok()) {
      ++check.missing;
      check.problems.push_back(absl::StrCat(id, ": ", blob.status().ToString(),
                                            " (acknowledged position ",
                                            acknowledged, ")"));
      continue;
    }
    auto parsed = ParseSnapshot(*blob);
    if (!parsed.ok()) return parsed.status();
    const uint64_t position = parsed->state.position();
    check.recovered += position;
    if (position < acknowledged) {
      ++check.behind;
      check.problems.push_back(absl::StrCat(id, ": at position ", position,
                                            ", but steps up to ", acknowledged,
                                            " were acknowledged"));
      continue;
    }
    // The same steps, locally, one by one as the server decoded them.
    LINATTN_ASSIGN_OR_RETURN(Attention attention,
                             Attention::Create(parsed->spec));
    AttentionState state = attention.NewState();
    std::vector<float> q(qk), k(qk), v(vv), g(pool.gg()), beta(pool.bb()),
        y(vv), den(o.heads);
    std::vector<uint8_t> avail(o.heads);
    if (parsed->spec.num_heads != o.heads || parsed->spec.key_dim != o.dim ||
        parsed->spec.value_dim != o.dim) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--check: session '", id, "' has another shape than --heads/--dim"));
    }
    for (uint64_t t = 0; t < position; ++t) {
      pool.Token(index, t, q.data(), k.data(), v.data(), g.data(), beta.data());
      SequenceInput token{q.data(), k.data(), v.data(), 1};
      if (!g.empty()) token.g = g.data();
      if (!beta.empty()) token.beta = beta.data();
      LINATTN_RETURN_IF_ERROR(
          Step(attention, state, token, {y.data(), den.data(), avail.data()}));
    }
    if (state.size() != parsed->state.size() ||
        std::memcmp(state.data(), parsed->state.data(),
                    state.size() * sizeof(float)) != 0) {
      ++check.mismatched;
      check.problems.push_back(
          absl::StrCat(id, ": the state at position ", position,
                       " differs from the local recomputation"));
    }
  }
  return check;
}

std::string LedgerCheckText(const LedgerCheck& c) {
  std::string out;
  for (const std::string& p : c.problems) absl::StrAppend(&out, p, "\n");
  absl::StrAppend(
      &out,
      absl::StrFormat("checked %u sessions: %u missing, %u behind their "
                      "acknowledged position, %u with a state that differs; "
                      "positions: %llu acknowledged, %llu recovered\n%s\n",
                      c.sessions, c.missing, c.behind, c.mismatched,
                      static_cast<unsigned long long>(c.acknowledged),
                      static_cast<unsigned long long>(c.recovered),
                      c.ok() ? "OK" : "FAILED"));
  return out;
}

nlohmann::json SummaryJson(const LoadSummary& s, const LoadOptions& o) {
  return {{"server", o.server},
          {"sessions", o.sessions},
          {"steps_per_session", o.steps},
          {"prefill_tokens_per_session", o.prefill},
          {"heads", o.heads},
          {"dim", o.dim},
          {"feature_map", o.feature_map},
          {"rule", o.rule},
          {"concurrency", Streams(o)},
          {"batch", std::max<uint32_t>(o.batch, 1)},
          {"mode", o.rate > 0 ? "open" : "closed"},
          {"target_rate", o.rate},
          {"steps", s.steps},
          {"prefill_tokens", s.prefill_tokens},
          {"seconds", s.seconds},
          {"steps_per_second", s.steps_per_second},
          {"latency_us",
           {{"p50", s.p50_us},
            {"p90", s.p90_us},
            {"p99", s.p99_us},
            {"max", s.max_us}}},
          {"prefill",
           {{"seconds", s.prefill_seconds},
            {"tokens_per_second", s.prefill_tokens_per_second},
            {"latency_us",
             {{"p50", s.prefill_p50_us}, {"max", s.prefill_max_us}}}}},
          {"errors", s.errors},
          {"retried", s.retried},
          {"unanswered_steps", s.unanswered_steps},
          {"verified_sessions", s.verified_sessions},
          {"mismatched_sessions", s.mismatched_sessions},
          {"duration_reached", s.duration_reached},
          {"rate_missed", s.rate_missed},
          {"ok", s.ok()}};
}

namespace {

// The summary's last line.
std::string Verdict(const LoadSummary& s, const LoadOptions& o) {
  if (!s.ok()) return "FAILED";
  if (s.rate_missed) {
    return absl::StrFormat(
        "OK, but the target rate was missed: %.0f of %.0f steps/s",
        s.steps_per_second, o.rate);
  }
  if (s.duration_reached) return "OK (a timed run: --duration ended it)";
  return "OK";
}

}  // namespace

std::string SummaryText(const LoadSummary& s, const LoadOptions& o) {
  std::string errors;
  for (const auto& [code, n] : s.errors)
    absl::StrAppend(&errors, " ", code, "=", n);
  std::string retried;
  for (const auto& [code, n] : s.retried)
    absl::StrAppend(&retried, " ", code, "=", n);
  if (!retried.empty()) {
    retried = absl::StrCat(
        "failover: streams reopened after", retried, "; ", s.unanswered_steps,
        " step(s) found applied past the acknowledged position (unanswered, "
        "or another client's)\n");
  }
  return absl::StrFormat(
      "%u sessions × %u steps (H=%u, d=%u, %s, %s loop) against %s\n"
      "steps: %llu in %.2f s = %.0f steps/s%s\n"
      "step latency: p50 %.0f µs, p90 %.0f µs, p99 %.0f µs, max %.0f µs\n%s"
      "%serrors:%s\n"
      "verified: %u sessions recomputed locally, %u mismatched\n"
      "%s\n",
      o.sessions, o.steps, o.heads, o.dim, o.feature_map,
      o.rate > 0 ? "open" : "closed", o.server,
      static_cast<unsigned long long>(s.steps), s.seconds, s.steps_per_second,
      s.prefill_tokens > 0
          ? absl::StrCat(" (after ", s.prefill_tokens, " prefill tokens)")
          : "",
      s.p50_us, s.p90_us, s.p99_us, s.max_us,
      s.prefill_tokens > 0
          ? absl::StrFormat("prefill: %llu tokens in %.2f s = %.0f tokens/s "
                            "(p50 %.1f ms per "
                            "request)\n",
                            static_cast<unsigned long long>(s.prefill_tokens),
                            s.prefill_seconds, s.prefill_tokens_per_second,
                            s.prefill_p50_us / 1e3)
          : "",
      retried, errors.empty() ? " none" : errors, s.verified_sessions,
      s.mismatched_sessions, Verdict(s, o));
}

}  // namespace linattn
