#include "clients/load/driver.h"

#include <grpcpp/alarm.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>

#include "clients/cli/remote.h"
#include "clients/load/report.h"

namespace linattn {

namespace {

using SteadyClock = std::chrono::steady_clock;

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

  // The next unit starts before this one counts as finished: once the last
  // one counts, Execute returns and this run may be gone, so nothing may
  // touch it after the count (a callback thread that did was writing into
  // the verifier's stack frame).
  void UnitDone() {
    StartNext();
    std::lock_guard<std::mutex> lock(mu_);
    ++finished_;
    if (finished_ == units_) {
      all_done_.notify_all();
      resync_cv_.notify_all();
    }
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

DriveResult Drive(const LoadOptions& o, const InputPool& pool,
                  v1::AttentionService::Stub& stub,
                  std::vector<SessionRecord>& records, uint32_t verify) {
  LoadRun run(o, pool, stub, records, verify);
  run.Execute(Streams(o), o.batch);
  DriveResult r;
  r.seconds = run.elapsed_seconds();
  r.steps = run.steps_done();
  r.prefill_tokens = run.prefill_tokens();
  r.duration_reached = run.duration_reached();
  r.errors = run.errors();
  r.retried = run.retried();
  r.unanswered_steps = run.unanswered_steps();
  r.latencies_us = run.latencies();
  r.prefill_latencies_us = run.prefill_latencies();
  if (!r.prefill_latencies_us.empty())
    r.prefill_seconds = run.prefill_seconds();
  return r;
}

}  // namespace linattn
