// AttentionService's Decode and DecodeBatch streams: bidi reactors that
// read one message, run its step (group) through the engine, write its
// response, then read the next; the server's drain can end them all.
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/util/status_macros.h"
#include "server/attention_service.h"
#include "server/attention_tensors.h"
#include "server/status.h"

namespace linattn {

// What Decode and DecodeBatch streams share: one message in flight; after
// its response is written, the next request is read. (The first read is
// started by the derived constructor, once the reactor is whole.)
//
// A stream can be aborted from outside (the server's grace period ended):
// waiting for a message it finishes at once; with a step running or a
// response being written, it finishes as soon as that is done, because the
// scheduler writes into the reactor's buffers until then.
class AttentionServiceImpl::OpenStream {
 public:
  virtual ~OpenStream() = default;
  virtual void Abort(const grpc::Status& status) = 0;
};

template <typename Request, typename Response>
class AttentionServiceImpl::StepStreamReactor
    : public grpc::ServerBidiReactor<Checked<Request>, Response>,
      public OpenStream {
 public:
  StepStreamReactor(AttentionServiceImpl* service,
                    grpc::CallbackServerContext* ctx)
      : service_(service), call_(&ContextOf(ctx)), liveness_(LivenessOf(ctx)) {}

  // Makes the stream reachable by AbortStreams; called once the reactor is
  // whole (by the handler that created it, before gRPC can call OnDone).
  void Register() {
    std::lock_guard<std::recursive_mutex> lock(service_->streams_mu_);
    service_->streams_.insert(this);
  }

  void Abort(const grpc::Status& status) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (finished_) return;
    if (busy_) {
      abort_ = status;  // finished when the step or write completes
      return;
    }
    finished_ = true;
    lock.unlock();
    this->Finish(status);
  }

  void OnReadDone(bool ok) final {
    if (!ok) {  // the client closed its side (or the call was cancelled)
      FinishOnce(grpc::Status::OK);
      return;
    }
    if (!read_.status.ok()) {  // the message could not be parsed
      FinishOnce(ToGrpcStatus(read_.status));
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_) return;
      busy_ = true;
    }
    step_start_ = std::chrono::steady_clock::now();
    if (absl::Status s = StartStep(); !s.ok()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        busy_ = false;
      }
      AddRetryHint(call_, s);
      FinishOnce(ToGrpcStatus(s));
    }
  }

  void OnWriteDone(bool ok) final {
    std::unique_lock<std::mutex> lock(mu_);
    busy_ = false;
    if (finished_) return;
    if (!ok || abort_) {
      finished_ = true;
      const grpc::Status status =
          abort_ ? *abort_
                 : grpc::Status(grpc::StatusCode::CANCELLED,
                                "the client went away");
      lock.unlock();
      this->Finish(status);
      return;
    }
    lock.unlock();
    this->StartRead(&read_);
  }

  void OnDone() final {
    {
      std::lock_guard<std::recursive_mutex> lock(service_->streams_mu_);
      service_->streams_.erase(this);
    }
    delete this;
  }

 protected:
  // Checks the request just read and submits its step; the step's
  // completion calls StepDone. An error ends the stream with it.
  virtual absl::Status StartStep() = 0;

  // From the step's completion: a step that failed ends the stream with its
  // error (or the abort); a step that was applied always has its response
  // written, even when the stream is being aborted (OnWriteDone then
  // finishes it), so a client learns of every step that changed its
  // session.
  void StepDone(const absl::Status& status) {
    if (Observability* o = service_->gate()->observability();
        o != nullptr && status.ok()) {
      o->DecodeStep(std::chrono::duration<double>(
                        std::chrono::steady_clock::now() - step_start_)
                        .count());
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (!status.ok()) {
      busy_ = false;
      finished_ = true;
      const grpc::Status out = abort_ ? *abort_ : ToGrpcStatus(status);
      lock.unlock();
      this->Finish(out);
      return;
    }
    lock.unlock();
    this->StartWrite(&response_);
  }

  void FinishOnce(const grpc::Status& status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_) return;
      finished_ = true;
    }
    this->Finish(status);
  }

  AttentionServiceImpl* const service_;
  CallContext* const call_;  // the stream's: its tenant, for the access log
  // When the message in flight was read (one at a time).
  std::chrono::steady_clock::time_point step_start_;
  const CallLiveness liveness_;  // a step of a stream that ended is dropped
  Checked<Request> read_;
  const Request& request_ = read_.message;
  Response response_;

 private:
  std::mutex mu_;
  bool busy_ = false;      // a step or a write is in flight
  bool finished_ = false;  // Finish was called
  std::optional<grpc::Status> abort_;
};

// One Decode stream: read a token, step it on the scheduler, write the
// result, read the next. A bad message ends the stream with its status and
// leaves the session as it was.
class AttentionServiceImpl::DecodeReactor final
    : public StepStreamReactor<v1::DecodeRequest, v1::DecodeResponse> {
 public:
  DecodeReactor(AttentionServiceImpl* service, grpc::CallbackServerContext* ctx)
      : StepStreamReactor(service, ctx) {
    StartRead(&read_);
  }

 private:
  absl::Status StartStep() override {
    LINATTN_ASSIGN_OR_RETURN(
        session_,
        service_->sessions_->Find(request_.session_id(), call_->tenant));
    call_->NoteSession(request_.session_id());
    call_->tokens_in.fetch_add(1, std::memory_order_relaxed);
    const AttentionSpec& spec = session_->spec();
    LINATTN_ASSIGN_OR_RETURN(const SequenceInput in,
                             InputOf(spec, 1, request_));
    LINATTN_RETURN_IF_ERROR(service_->gate()->limiter().Take(call_->tenant, 1));
    response_.Clear();
    const auto [output, denominator] =
        OutputOf(!request_.q_bytes().empty(), spec.num_heads, spec.value_dim,
                 &response_);
    available_.assign(spec.num_heads, 0);
    const SequenceOutput out{output, denominator, available_.data()};
    service_->sessions_->Step(
        session_, in, out,
        [this](absl::Status status) {
          if (status.ok()) {
            CopyAvailable(available_, response_.mutable_available());
            response_.set_position(session_->state().position());
          }
          StepDone(status);
        },
        liveness_,
        request_.has_expected_position()
            ? std::optional<uint64_t>(request_.expected_position())
            : std::nullopt);
    return absl::OkStatus();
  }

  std::vector<uint8_t> available_;
  std::shared_ptr<AttentionSession> session_;
};

grpc::ServerBidiReactor<Checked<v1::DecodeRequest>, v1::DecodeResponse>*
AttentionServiceImpl::OpenDecode(grpc::CallbackServerContext* ctx) {
  auto* reactor = new DecodeReactor(this, ctx);
  reactor->Register();
  return reactor;
}

// One DecodeBatch stream: each message is a step group on the scheduler.
// Everything that can be checked before it runs is checked here, so a bad
// message ends the stream naming steps[i] before anything is queued.
class AttentionServiceImpl::DecodeBatchReactor final
    : public StepStreamReactor<v1::DecodeBatchRequest,
                               v1::DecodeBatchResponse> {
 public:
  DecodeBatchReactor(AttentionServiceImpl* service,
                     grpc::CallbackServerContext* ctx)
      : StepStreamReactor(service, ctx) {
    StartRead(&read_);
  }

 private:
  absl::Status StartStep() override {
    LINATTN_ASSIGN_OR_RETURN(std::vector<Scheduler::GroupStep> group,
                             Prepare());
    LINATTN_RETURN_IF_ERROR(service_->gate()->limiter().Take(
        call_->tenant, static_cast<double>(group.size())));
    service_->sessions_->Step(
        std::move(group),
        [this](absl::Status status) {
          if (status.ok()) {
            for (int i = 0; i < response_.steps_size(); ++i) {
              v1::DecodeResponse& r = *response_.mutable_steps(i);
              CopyAvailable(available_[i], r.mutable_available());
              r.set_position(sessions_[i]->state().position());
            }
          }
          sessions_.clear();
          StepDone(status);
        },
        liveness_);
    return absl::OkStatus();
  }

  // The step group of request_, with response_ sized to receive it.
  absl::StatusOr<std::vector<Scheduler::GroupStep>> Prepare() {
    // An empty group and a session twice are refused by the scheduler
    // (Scheduler::StepGroup), where every step group enters core.
    const int n = request_.steps_size();
    sessions_.clear();
    std::vector<Scheduler::GroupStep> group;
    group.reserve(n);
    response_.Clear();
    available_.resize(n);
    for (int i = 0; i < n; ++i) {
      const v1::DecodeRequest& step = request_.steps(i);
      auto prefix = [i](const absl::Status& s) {
        return absl::Status(s.code(),
                            absl::StrCat("steps[", i, "].", s.message()));
      };
      auto found = service_->sessions_->Find(step.session_id(), call_->tenant);
      if (!found.ok()) return prefix(found.status());
      call_->NoteSession(step.session_id());
      call_->tokens_in.fetch_add(1, std::memory_order_relaxed);
      const AttentionSpec& spec = (*found)->spec();
      absl::StatusOr<SequenceInput> in = InputOf(spec, 1, step);
      if (!in.ok()) return prefix(in.status());
      v1::DecodeResponse& r = *response_.add_steps();
      const auto [output, denominator] =
          OutputOf(!step.q_bytes().empty(), spec.num_heads, spec.value_dim, &r);
      available_[i].assign(spec.num_heads, 0);
      group.push_back({*found,
                       *in,
                       {output, denominator, available_[i].data()},
                       step.has_expected_position()
                           ? std::optional<uint64_t>(step.expected_position())
                           : std::nullopt});
      sessions_.push_back(*std::move(found));
    }
    return group;
  }

  std::vector<std::vector<uint8_t>> available_;
  std::vector<std::shared_ptr<AttentionSession>> sessions_;
};

grpc::ServerBidiReactor<Checked<v1::DecodeBatchRequest>,
                        v1::DecodeBatchResponse>*
AttentionServiceImpl::OpenDecodeBatch(grpc::CallbackServerContext* ctx) {
  auto* reactor = new DecodeBatchReactor(this, ctx);
  reactor->Register();
  return reactor;
}

void AttentionServiceImpl::AbortStreams(const absl::Status& status) {
  // Held while aborting: a stream's OnDone (which deletes it) waits, so
  // every pointer stays valid; recursive in case gRPC runs OnDone inline.
  std::lock_guard<std::recursive_mutex> lock(streams_mu_);
  const std::vector<OpenStream*> open(streams_.begin(), streams_.end());
  for (OpenStream* stream : open) stream->Abort(ToGrpcStatus(status));
}

}  // namespace linattn
