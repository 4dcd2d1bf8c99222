#include "core/scheduler/scheduler.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/attention/recurrent.h"

namespace linattn {

namespace {

// A batch function's error as its request reports it: a step group's
// "items[j]." is its "steps[j].", and a single request drops "items[i].".
absl::Status AsRequest(absl::Status s, bool group) {
  if (s.ok() || !absl::StartsWith(s.message(), "items[")) return s;
  if (group) {
    return absl::Status(s.code(),
                        absl::StrCat("steps[", s.message().substr(6)));
  }
  const size_t end = s.message().find("].");
  if (end == absl::string_view::npos) return s;
  return absl::Status(s.code(), s.message().substr(end + 2));
}

}  // namespace

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

namespace {

// The finiteness of tokens [from, from + tokens) of `in`, with errors naming
// the element's index in the whole request. Only for naming a value the
// chunkwise gather found bad: the happy path reads the input once, there.
absl::Status CheckSliceFinite(const AttentionSpec& spec,
                              const SequenceInput& in, uint64_t from,
                              uint64_t tokens) {
  const uint64_t qk = uint64_t{spec.num_heads} * spec.key_dim;
  const uint64_t vv = uint64_t{spec.num_heads} * spec.value_dim;
  for (auto [field, data, width] :
       {std::tuple<const char*, const float*, uint64_t>{"q", in.q, qk},
        {"k", in.k, qk},
        {"v", in.v, vv}}) {
    const float* first = data + from * width;
    const uint64_t n = tokens * width;
    if (AllFinite(first, n)) continue;
    for (uint64_t i = 0; i < n; ++i) {
      if (!std::isfinite(first[i])) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, "[", from * width + i, "]: must be finite, got ", first[i]));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

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

namespace {

absl::Status CheckPosition(const AttentionSession& session,
                           std::optional<uint64_t> expected) {
  if (!expected.has_value() || *expected == session.state().position()) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "expected_position: session '", session.id(), "' is at position ",
      session.state().position(), ", not ", *expected,
      "; nothing changed (another request moved it: read its position with "
      "GetSession)"));
}

}  // namespace

void Scheduler::RunRound(std::vector<Request>& round,
                         std::vector<Request>& unfinished) {
  std::vector<absl::Status> results(round.size());
  std::vector<bool> done(round.size(), true);
  std::vector<StepItem> steps;
  std::vector<size_t> step_index;
  std::vector<size_t> prefill_requests;
  uint64_t prefill_tokens = 0;
  uint64_t prefills_finished = 0;
  // Callers that have gone are answered before anything of theirs runs.
  std::vector<bool> skip(round.size(), false);
  for (size_t i = 0; i < round.size(); ++i) {
    results[i] = round[i].caller.Check();
    skip[i] = !results[i].ok();
  }
  for (size_t i = 0; i < round.size(); ++i) {
    Request& r = round[i];
    if (skip[i] || r.kind == Kind::kWork) continue;
    if (r.kind == Kind::kPrefill) {
      prefill_requests.push_back(i);
      continue;
    }
    // Shapes and positions here; the values are checked by StepBatch, and a
    // batch that fails is run again request by request (below).
    if (r.kind == Kind::kStepGroup) {
      for (size_t j = 0; j < r.group.size() && results[i].ok(); ++j) {
        const GroupStep& g = r.group[j];
        absl::Status v = CheckPosition(*g.session, g.expected_position);
        if (v.ok()) {
          v = g.session->attention().ValidateInput(g.session->state(), g.in,
                                                   /*check_values=*/false);
        }
        if (!v.ok()) {
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
    AttentionSession& s = *r.session;
    results[i] = CheckPosition(s, r.expected_position);
    if (!results[i].ok()) continue;
    results[i] =
        s.attention().ValidateInput(s.state(), r.in, /*check_values=*/false);
    if (!results[i].ok()) continue;
    steps.push_back({&s.attention(), &s.state(), r.in, r.out});
    step_index.push_back(i);
  }
  // Prefills: the round's token budget shared evenly, the shortest first so
  // that what they leave goes to the longer ones.
  std::sort(prefill_requests.begin(), prefill_requests.end(),
            [&](size_t a, size_t b) {
              return round[a].in.tokens - round[a].prefilled <
                     round[b].in.tokens - round[b].prefilled;
            });
  uint64_t budget = std::max<uint64_t>(1, options_.prefill_tokens_per_round);
  // With several tenants prefilling, the budget is first shared among the
  // tenants the same way (what one needs less of goes to the others), then
  // within each: a tenant with hundreds of prefills takes its share, not
  // hundreds of shares.
  struct TenantShare {
    uint64_t demand = 0, left = 0;
    size_t requests = 0;
  };
  std::unordered_map<std::string_view, TenantShare> tenants;
  for (size_t i : prefill_requests) {
    TenantShare& t = tenants[OwnerOf(round[i])];
    t.demand += round[i].in.tokens - round[i].prefilled;
    ++t.requests;
  }
  if (tenants.size() > 1) {
    std::vector<TenantShare*> by_demand;
    for (auto& [owner, t] : tenants) by_demand.push_back(&t);
    std::sort(by_demand.begin(), by_demand.end(),
              [](const TenantShare* a, const TenantShare* b) {
                return a->demand < b->demand;
              });
    uint64_t left = budget;
    for (size_t n = 0; n < by_demand.size(); ++n) {
      TenantShare& t = *by_demand[n];
      t.left = std::min(t.demand, left / (by_demand.size() - n));
      left -= t.left;
    }
  }
  uint64_t workspace = 0;  // of the chunkwise round, for the slices so far
  std::vector<PrefillItem> prefills;
  std::vector<size_t> prefill_index;
  for (size_t n = 0; n < prefill_requests.size(); ++n) {
    const size_t i = prefill_requests[n];
    Request& r = round[i];
    TenantShare* tenant = tenants.size() > 1 ? &tenants[OwnerOf(r)] : nullptr;
    uint64_t share =
        tenant != nullptr
            ? std::max<uint64_t>(1, tenant->left / tenant->requests--)
            : budget / (prefill_requests.size() - n);
    // Its chunkwise jobs: round_chunks at most per head in one Run.
    const Attention& attention = r.session->attention();
    const uint64_t C = std::max<uint32_t>(1, options_.chunkwise.chunk_size);
    const uint64_t per_chunk = uint64_t{attention.num_heads()} *
                               runner_.WorkspaceBytesPerJob(attention.spec());
    const uint64_t room = options_.prefill_workspace_bytes > workspace
                              ? options_.prefill_workspace_bytes - workspace
                              : 0;
    uint64_t chunks = room / std::max<uint64_t>(per_chunk, 1);
    if (chunks == 0) {
      if (!prefills.empty()) {
        done[i] = false;  // its turn is next round
        continue;
      }
      chunks = 1;
    }
    if (chunks < options_.chunkwise.round_chunks) {
      share = std::min(share, chunks * C);
    }
    if (!StartPrefill(r, share, &results[i])) {
      done[i] = false;  // waits for memory
      continue;
    }
    if (!results[i].ok() || r.in.tokens == 0) continue;
    budget -= std::min(budget, r.slice);
    if (tenant != nullptr) tenant->left -= std::min(tenant->left, r.slice);
    workspace += per_chunk * std::min<uint64_t>(options_.chunkwise.round_chunks,
                                                (r.slice + C - 1) / C);
    const AttentionSpec& spec = r.session->spec();
    const uint64_t vv = uint64_t{spec.num_heads} * spec.value_dim;
    const uint64_t t0 = r.prefilled;
    SequenceInput slice = TokenOf(spec, r.in, t0);
    slice.tokens = r.slice;
    prefills.push_back({&r.session->attention(), &*r.copy, slice,
                        SequenceOutput{r.out.output + t0 * vv,
                                       r.out.denominator + t0 * spec.num_heads,
                                       r.out.available + t0 * spec.num_heads}});
    prefill_index.push_back(i);
  }
  if (!prefills.empty()) {
    std::vector<absl::Status> refused(prefills.size());
    const absl::Status s =
        runner_.Run(prefills, PrefillCommit::kInPlace, refused);
    for (size_t p = 0; p < prefills.size(); ++p) {
      const size_t i = prefill_index[p];
      Request& r = round[i];
      results[i] = AsRequest(s.ok() ? refused[p] : s, false);
      if (results[i].code() == absl::StatusCode::kInvalidArgument) {
        // A value that is not finite, named by its index in the slice: name
        // it in the whole request.
        const absl::Status named =
            CheckSliceFinite(r.session->spec(), r.in, r.prefilled, r.slice);
        if (!named.ok()) results[i] = named;
      }
      if (!results[i].ok()) continue;
      r.prefilled += r.slice;
      prefill_tokens += r.slice;
      if (r.prefilled < r.in.tokens) done[i] = false;
    }
  }
  // Prefills that finished commit now, if their callers are still there.
  std::vector<size_t> committing;
  for (size_t i : prefill_requests) {
    Request& r = round[i];
    if (!done[i] || !r.copy.has_value()) continue;
    if (results[i].ok()) results[i] = r.caller.Check();
    if (results[i].ok()) committing.push_back(i);
  }
  // With a durable store, the round's changes are recorded before any of
  // them is made (docs/design.md §4, "Durable sessions"): the steps' inputs
  // and the prefills' resulting states, as one group commit. A commit that
  // fails fails them all, and nothing changed.
  if (options_.store != nullptr && options_.store->shared()) {
    // A shared store replays each session's steps on their own: a request
    // the kernels would refuse (one of a DecodeBatch's members refused
    // refuses them all) is refused now, before anything of it is recorded.
    std::vector<StepItem> kept;
    std::vector<size_t> kept_index;
    for (size_t b = 0; b < steps.size();) {
      size_t e = b;
      while (e < steps.size() && step_index[e] == step_index[b]) ++e;
      const size_t i = step_index[b];
      const absl::Status c =
          CheckStepBatch(std::span<const StepItem>(steps).subspan(b, e - b));
      if (!c.ok()) {
        results[i] = AsRequest(c, round[i].kind == Kind::kStepGroup);
      } else {
        kept.insert(kept.end(), steps.begin() + b, steps.begin() + e);
        kept_index.insert(kept_index.end(), step_index.begin() + b,
                          step_index.begin() + e);
      }
      b = e;
    }
    steps.swap(kept);
    step_index.swap(kept_index);
  }
  if (options_.store != nullptr && (!steps.empty() || !committing.empty())) {
    DurableStore::Group group;
    std::vector<size_t> request_of;  // the group's request numbers
    for (size_t b = 0; b < steps.size();) {
      size_t e = b;
      while (e < steps.size() && step_index[e] == step_index[b]) ++e;
      const Request& r = round[step_index[b]];
      group.BeginRequest();
      request_of.push_back(step_index[b]);
      for (size_t j = b; j < e; ++j) {
        const AttentionSession& session =
            r.kind == Kind::kStepGroup ? *r.group[j - b].session : *r.session;
        group.AddStep(session, steps[j].token,
                      j == b ? static_cast<uint32_t>(e - b) : 0);
      }
      b = e;
    }
    for (size_t i : committing) {
      group.BeginRequest();
      request_of.push_back(i);
      group.AddState(*round[i].session, *round[i].copy);
    }
    std::vector<uint32_t> refused;
    if (absl::Status s = options_.store->Commit(std::move(group), &refused);
        !s.ok()) {
      for (size_t i : step_index) results[i] = s;
      for (size_t i : committing) results[i] = s;
      steps.clear();
      step_index.clear();
      committing.clear();
    } else if (!refused.empty()) {
      // Sessions handed over to another replica while these waited:
      // nothing of them was recorded, and nothing of them runs.
      std::vector<bool> out(round.size(), false);
      for (uint32_t n : refused) {
        const size_t i = request_of[n];
        out[i] = true;
        results[i] = absl::AbortedError(
            "session_id: the session was handed over to another replica "
            "while this request waited; nothing changed (send it again: the "
            "session's owner serves it)");
      }
      std::vector<StepItem> kept;
      std::vector<size_t> kept_index;
      for (size_t j = 0; j < steps.size(); ++j) {
        if (out[step_index[j]]) continue;
        kept.push_back(steps[j]);
        kept_index.push_back(step_index[j]);
      }
      steps.swap(kept);
      step_index.swap(kept_index);
      std::erase_if(committing, [&](size_t i) { return out[i]; });
    }
  }
  // A batch that fails has changed nothing (StepBatch checks everything,
  // overflow included, before it commits), so a failed batch of several
  // requests is run again one request at a time: only the request at fault
  // fails.
  bool one_thread = false;
  if (!steps.empty()) {
    uint64_t state_bytes = 0;
    for (const StepItem& step : steps) state_bytes += step.state->bytes();
    one_thread = state_bytes <= options_.single_thread_step_bytes;
    omp_set_num_threads(one_thread ? 1 : executor_->max_threads());
    const absl::Status s = StepBatch(steps);
    if (s.ok() || step_index.front() == step_index.back()) {
      for (size_t i : step_index) {
        results[i] = AsRequest(s, round[i].kind == Kind::kStepGroup);
      }
    } else {
      for (size_t b = 0; b < steps.size();) {
        size_t e = b;
        while (e < steps.size() && step_index[e] == step_index[b]) ++e;
        const size_t i = step_index[b];
        results[i] = AsRequest(
            StepBatch(std::span<const StepItem>(steps).subspan(b, e - b)),
            round[i].kind == Kind::kStepGroup);
        b = e;
      }
    }
    omp_set_num_threads(executor_->max_threads());
  }

  for (size_t i : committing) {
    round[i].session->state() = *std::move(round[i].copy);  // the commit
    ++prefills_finished;
  }
  for (size_t i : prefill_requests) {
    Request& r = round[i];
    if (!done[i] || !r.copy.has_value()) continue;
    r.copy.reset();
    r.copy_lease.Release();
    --prefills_under_way_;
  }
  // Prefills of callers that went between rounds drop their copies.
  for (size_t i = 0; i < round.size(); ++i) {
    Request& r = round[i];
    if (skip[i] && r.copy.has_value()) {
      r.copy.reset();
      r.copy_lease.Release();
      --prefills_under_way_;
    }
  }

  for (size_t i = 0; i < round.size(); ++i) {
    if (round[i].kind == Kind::kWork && !skip[i]) {
      try {
        results[i] = std::move(round[i].work)(*round[i].session);
      } catch (const std::bad_alloc&) {
        results[i] = absl::ResourceExhaustedError(
            "memory: an allocation for this request failed");
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.rounds;
    stats_.steps += steps.size();
    stats_.step_batches += steps.empty() ? 0 : 1;
    stats_.single_thread_step_batches += one_thread ? 1 : 0;
    stats_.largest_step_batch =
        std::max<uint64_t>(stats_.largest_step_batch, steps.size());
    stats_.prefills += prefills_finished;
    stats_.prefill_batches += prefills.empty() ? 0 : 1;
    stats_.prefill_tokens += prefill_tokens;
    stats_.prefill_workspace_bytes = runner_.workspace_bytes();
  }
  for (size_t i = 0; i < round.size(); ++i) {
    if (!done[i]) {
      unfinished.push_back(std::move(round[i]));
      continue;
    }
    // A step or prefill that succeeded changed its sessions (a prefill of
    // no tokens aside); other work only read them.
    const bool stepped =
        results[i].ok() && round[i].kind != Kind::kWork &&
        !(round[i].kind == Kind::kPrefill && round[i].in.tokens == 0);
    ForEachSession(round[i], [stepped](AttentionSession& s) {
      s.Publish(stepped);
      s.pending().fetch_sub(1);
    });
    std::move(round[i].done)(std::move(results[i]));
  }
}

}  // namespace linattn
