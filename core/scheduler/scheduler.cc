#include "core/scheduler/scheduler.h"

#include <algorithm>
#include <unordered_set>

#include "core/attention/recurrent.h"

namespace linattn {

Scheduler::Scheduler(SchedulerOptions options)
    : options_(options),
      runner_(options.chunkwise),
      worker_([this] { WorkerLoop(); }) {}

Scheduler::~Scheduler() {
  Shutdown();
  if (worker_.joinable()) worker_.join();
}

void Scheduler::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Scheduler::Step(std::shared_ptr<Session> session, SequenceInput in,
                     SequenceOutput out, Done done) {
  Enqueue({Kind::kStep, std::move(session), in, out, nullptr, std::move(done)});
}

void Scheduler::Prefill(std::shared_ptr<Session> session, SequenceInput in,
                        SequenceOutput out, Done done) {
  Enqueue(
      {Kind::kPrefill, std::move(session), in, out, nullptr, std::move(done)});
}

void Scheduler::Run(std::shared_ptr<Session> session, StateWork work,
                    Done done) {
  Enqueue({Kind::kWork,
           std::move(session),
           {},
           {},
           std::move(work),
           std::move(done)});
}

void Scheduler::Enqueue(Request request) {
  bool accepted = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      request.session->pending().fetch_add(1);
      queue_.push_back(std::move(request));
      accepted = true;
    }
  }
  if (accepted) {
    work_cv_.notify_one();
    return;
  }
  std::move(request.done)(
      absl::UnavailableError("the server is shutting down"));
}

void Scheduler::WorkerLoop() {
  std::vector<Request> round;
  std::vector<Request> deferred;
  while (true) {
    round.clear();
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [this] { return !queue_.empty() || stopping_; });
      if (queue_.empty()) return;  // stopping, and everything has run
      // One request per session, in arrival order; later requests of a
      // session already in the round wait for the next one.
      std::unordered_set<const Session*> in_round;
      deferred.clear();
      while (!queue_.empty() && round.size() < options_.max_round) {
        Request r = std::move(queue_.front());
        queue_.pop_front();
        if (in_round.insert(r.session.get()).second) {
          round.push_back(std::move(r));
        } else {
          deferred.push_back(std::move(r));
        }
      }
      for (auto it = deferred.rbegin(); it != deferred.rend(); ++it) {
        queue_.push_front(std::move(*it));
      }
    }
    RunRound(round);
  }
}

void Scheduler::RunRound(std::vector<Request>& round) {
  std::vector<absl::Status> results(round.size());
  std::vector<StepItem> steps;
  std::vector<size_t> step_index;
  std::vector<PrefillItem> prefills;
  std::vector<size_t> prefill_index;
  uint64_t prefill_tokens = 0;
  for (size_t i = 0; i < round.size(); ++i) {
    Request& r = round[i];
    Session& s = *r.session;
    if (r.kind == Kind::kWork) continue;
    // Each request is checked alone, so a bad one cannot fail its batch.
    results[i] = s.attention().ValidateInput(s.state(), r.in);
    if (!results[i].ok()) continue;
    if (r.kind == Kind::kStep) {
      steps.push_back({&s.attention(), &s.state(), r.in, r.out});
      step_index.push_back(i);
    } else {
      prefills.push_back({&s.attention(), &s.state(), r.in, r.out});
      prefill_index.push_back(i);
      prefill_tokens += r.in.tokens;
    }
  }
  if (!steps.empty()) {
    const absl::Status s = StepBatch(steps);
    for (size_t i : step_index) results[i] = s;
  }
  if (!prefills.empty()) {
    const absl::Status s = runner_.Run(prefills);
    for (size_t i : prefill_index) results[i] = s;
  }
  for (size_t i = 0; i < round.size(); ++i) {
    if (round[i].kind == Kind::kWork) {
      results[i] = std::move(round[i].work)(*round[i].session);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.rounds;
    stats_.steps += steps.size();
    stats_.step_batches += steps.empty() ? 0 : 1;
    stats_.largest_step_batch =
        std::max<uint64_t>(stats_.largest_step_batch, steps.size());
    stats_.prefills += prefills.size();
    stats_.prefill_batches += prefills.empty() ? 0 : 1;
    stats_.prefill_tokens += prefill_tokens;
  }
  for (size_t i = 0; i < round.size(); ++i) {
    round[i].session->Publish();
    round[i].session->pending().fetch_sub(1);
    std::move(round[i].done)(std::move(results[i]));
  }
}

}  // namespace linattn
