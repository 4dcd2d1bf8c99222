#include "core/scheduler/scheduler.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/str_cat.h"
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

void Scheduler::StepGroup(std::vector<GroupStep> steps, Done done) {
  // A group that would fail its round's whole batch (StepBatch refuses a
  // state twice) is refused here, alone.
  if (steps.empty()) {
    std::move(done)(
        absl::InvalidArgumentError("steps: at least one step is needed"));
    return;
  }
  std::unordered_map<const Session*, size_t> seen;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].session == nullptr) {
      std::move(done)(absl::InvalidArgumentError(
          absl::StrCat("steps[", i, "]: no session")));
      return;
    }
    if (auto [it, fresh] = seen.emplace(steps[i].session.get(), i); !fresh) {
      std::move(done)(absl::InvalidArgumentError(absl::StrCat(
          "steps[", i, "]: the same session as steps[", it->second, "]")));
      return;
    }
  }
  Request r{Kind::kStepGroup, nullptr, {}, {}, nullptr, std::move(done)};
  r.group = std::move(steps);
  Enqueue(std::move(r));
}

void Scheduler::ForEachSession(const Request& r,
                               const absl::FunctionRef<void(Session&)>& f) {
  if (r.kind != Kind::kStepGroup) {
    f(*r.session);
    return;
  }
  for (const GroupStep& step : r.group) f(*step.session);
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
      ForEachSession(request, [](Session& s) { s.pending().fetch_add(1); });
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
      // session already in the round wait for the next one. A deferred
      // request claims its sessions too, so nothing queued behind it on any
      // of them can overtake it.
      std::unordered_set<const Session*> in_round;
      deferred.clear();
      while (!queue_.empty() && round.size() < options_.max_round) {
        Request r = std::move(queue_.front());
        queue_.pop_front();
        bool free = true;
        ForEachSession(r, [&](Session& s) { free &= !in_round.contains(&s); });
        ForEachSession(r, [&](Session& s) { in_round.insert(&s); });
        if (free) {
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
    if (r.kind == Kind::kWork) continue;
    if (r.kind == Kind::kStepGroup) {
      // All of the group's steps join the batch, or none does.
      for (size_t j = 0; j < r.group.size() && results[i].ok(); ++j) {
        const GroupStep& g = r.group[j];
        if (absl::Status v =
                g.session->attention().ValidateInput(g.session->state(), g.in);
            !v.ok()) {
          results[i] = absl::Status(
              v.code(), absl::StrCat("steps[", j, "].", v.message()));
        }
      }
      if (!results[i].ok()) continue;
      for (const GroupStep& g : r.group) {
        steps.push_back(
            {&g.session->attention(), &g.session->state(), g.in, g.out});
        step_index.push_back(i);
      }
      continue;
    }
    Session& s = *r.session;
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
    ForEachSession(round[i], [](Session& s) {
      s.Publish();
      s.pending().fetch_sub(1);
    });
    std::move(round[i].done)(std::move(results[i]));
  }
}

}  // namespace linattn
