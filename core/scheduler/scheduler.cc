#include "core/scheduler/scheduler.h"

#include <omp.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/str_cat.h"

namespace linattn {

Scheduler::Scheduler(SchedulerOptions options)
    : options_(options),
      budget_(options.budget != nullptr ? options.budget
                                        : std::make_shared<MemoryBudget>(0)),
      runner_(options.chunkwise),
      executor_(options.executor != nullptr
                    ? options.executor
                    : std::make_shared<ComputeExecutor>()) {
  executor_->Add(this);
}

Scheduler::~Scheduler() {
  Shutdown();
  {
    std::unique_lock<std::mutex> lock(mu_);
    drained_cv_.wait(lock, [this] {
      return queue_.empty() && unfinished_.empty() && !round_running_;
    });
  }
  executor_->Remove(this);
}

void Scheduler::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  stopping_ = true;
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Scheduler::Step(std::shared_ptr<AttentionSession> session,
                     SequenceInput in, SequenceOutput out, Done done,
                     CallLiveness caller,
                     std::optional<uint64_t> expected_position) {
  Request r{Kind::kStep,     std::move(session), in, out, nullptr,
            std::move(done), std::move(caller)};
  r.expected_position = expected_position;
  Enqueue(std::move(r));
}

void Scheduler::StepGroup(std::vector<GroupStep> steps, Done done,
                          CallLiveness caller) {
  // A group that would fail its round's whole batch (StepBatch refuses a
  // state twice) is refused here, alone.
  if (steps.empty()) {
    std::move(done)(
        absl::InvalidArgumentError("steps: at least one step is needed"));
    return;
  }
  std::unordered_map<const AttentionSession*, size_t> seen;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].session == nullptr) {
      std::move(done)(absl::InvalidArgumentError(
          absl::StrCat("steps[", i, "]: no session")));
      return;
    }
    if (auto [it, fresh] = seen.emplace(steps[i].session.get(), i); !fresh) {
      std::move(done)(absl::InvalidArgumentError(absl::StrCat(
          "steps[", i, "].session_id: '", steps[i].session->id(),
          "' already has a step in this group (steps[", it->second, "])")));
      return;
    }
  }
  Request r{Kind::kStepGroup, nullptr,          {}, {}, nullptr,
            std::move(done),  std::move(caller)};
  r.group = std::move(steps);
  Enqueue(std::move(r));
}

void Scheduler::ForEachSession(
    const Request& r, const absl::FunctionRef<void(AttentionSession&)>& f) {
  if (r.kind != Kind::kStepGroup) {
    f(*r.session);
    return;
  }
  for (const GroupStep& step : r.group) f(*step.session);
}

void Scheduler::Prefill(std::shared_ptr<AttentionSession> session,
                        SequenceInput in, SequenceOutput out, Done done,
                        CallLiveness caller) {
  Request r{Kind::kPrefill,  std::move(session), in, out, nullptr,
            std::move(done), std::move(caller)};
  Enqueue(std::move(r));
}

void Scheduler::Run(std::shared_ptr<AttentionSession> session, StateWork work,
                    Done done, CallLiveness caller) {
  Request r{Kind::kWork,     std::move(session), {}, {}, std::move(work),
            std::move(done), std::move(caller)};
  Enqueue(std::move(r));
}

void Scheduler::Enqueue(Request request) {
  bool accepted = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      ForEachSession(request,
                     [](AttentionSession& s) { s.pending().fetch_add(1); });
      queue_.push_back(std::move(request));
      accepted = true;
    }
  }
  if (accepted) {
    executor_->Wake();
    return;
  }
  std::move(request.done)(
      absl::UnavailableError("the server is shutting down"));
}

Scheduler::Load Scheduler::load() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {queue_.size(), round_size_ + unfinished_.size()};
}

std::string_view Scheduler::OwnerOf(const Request& r) {
  const AttentionSession* s =
      r.kind == Kind::kStepGroup
          ? (r.group.empty() ? nullptr : r.group.front().session.get())
          : r.session.get();
  return s == nullptr ? std::string_view() : std::string_view(s->owner());
}

bool Scheduler::RunOnce() {
  round_.clear();
  std::vector<Request> unfinished;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Requests a round left unfinished go first: they are the oldest of
    // their sessions.
    for (auto it = unfinished_.rbegin(); it != unfinished_.rend(); ++it) {
      queue_.push_front(std::move(*it));
    }
    unfinished_.clear();
    if (queue_.empty()) {
      drained_cv_.notify_all();
      return false;
    }
    // One request per session, in arrival order; later requests of a
    // session already in the round wait for the next one. A deferred
    // request claims its sessions too, so nothing queued behind it on any
    // of them can overtake it.
    //
    // Tenants share a round: with g tenants queued, each takes at most
    // ⌈max_round / g⌉ places, its oldest first, and the rest of its
    // requests wait (claiming their sessions), so a tenant with thousands
    // queued cannot keep another's step out of the next round. (With one
    // tenant this is the arrival order, up to max_round.)
    std::unordered_map<std::string_view, size_t> taken;
    for (const Request& r : queue_) taken.emplace(OwnerOf(r), 0);
    const size_t share = (options_.max_round + taken.size() - 1) /
                         std::max<size_t>(1, taken.size());
    std::unordered_set<const AttentionSession*> in_round;
    std::vector<Request> deferred;
    size_t scanned = 0;
    const size_t queued = queue_.size();
    while (scanned < queued && round_.size() < options_.max_round) {
      Request r = std::move(queue_.front());
      queue_.pop_front();
      ++scanned;
      bool free = true;
      ForEachSession(
          r, [&](AttentionSession& s) { free &= !in_round.contains(&s); });
      ForEachSession(r, [&](AttentionSession& s) { in_round.insert(&s); });
      size_t& mine = taken[OwnerOf(r)];
      if (free && mine < share) {
        ++mine;
        round_.push_back(std::move(r));
      } else {
        deferred.push_back(std::move(r));
      }
    }
    for (auto it = deferred.rbegin(); it != deferred.rend(); ++it) {
      queue_.push_front(std::move(*it));
    }
    round_running_ = true;
    round_size_ = round_.size();
  }
  const auto start = std::chrono::steady_clock::now();
  const size_t requests = round_.size();
  RunRound(round_, unfinished);
  if (options_.on_round) {
    options_.on_round(requests, std::chrono::duration<double>(
                                    std::chrono::steady_clock::now() - start)
                                    .count());
  }
  bool drained;
  {
    std::lock_guard<std::mutex> lock(mu_);
    unfinished_ = std::move(unfinished);
    round_running_ = false;
    round_size_ = 0;
    drained = queue_.empty() && unfinished_.empty();
  }
  if (drained) drained_cv_.notify_all();
  return true;
}

bool Scheduler::StartPrefill(Request& r, uint64_t share, absl::Status* result) {
  AttentionSession& s = *r.session;
  if (!r.copy.has_value()) {
    // First slice: the whole request is checked (but for its values, which
    // each slice checks as it goes), then the session's state is copied.
    *result = s.attention().ValidateInput(s.state(), r.in,
                                          /*check_values=*/false);
    if (result->ok() && r.in.tokens != 0 &&
        (r.out.output == nullptr || r.out.denominator == nullptr ||
         r.out.available == nullptr)) {
      *result = absl::InvalidArgumentError("out: output buffers missing");
    }
    if (!result->ok() || r.in.tokens == 0) return true;
    auto lease = budget_->Lease(
        s.state_bytes(),
        absl::StrCat("prefill: needs a working copy of the session's state (",
                     s.state_bytes(), " bytes)"));
    if (!lease.ok()) {
      // Memory frees when a prefill under way commits; with none, it never
      // will.
      if (prefills_under_way_ > 0) return false;
      *result = lease.status();
      return true;
    }
    try {
      r.copy.emplace(s.state().Copy());
    } catch (const std::bad_alloc&) {
      *result = absl::ResourceExhaustedError(
          absl::StrCat("memory: allocating a working copy of ", s.state_bytes(),
                       " bytes for a prefill failed"));
      return true;
    }
    r.copy_lease = *std::move(lease);
    ++prefills_under_way_;
  }
  // The slice's values are checked by the chunkwise gather, as it reads
  // them.
  r.slice = std::max<uint64_t>(1, std::min(share, r.in.tokens - r.prefilled));
  return true;
}

}  // namespace linattn
