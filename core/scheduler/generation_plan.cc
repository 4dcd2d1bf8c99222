// GenerationEngine's planning of an iteration (generation.h): each
// queue's head request advanced (control requests answered, compute
// requests started with their working copies), a Generate's side requests
// answered at a token boundary, cancels ended, and the iteration's rows
// chosen (iteration_planner.h).
#include <algorithm>
#include <string_view>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "core/scheduler/generation.h"
#include "core/scheduler/iteration_planner.h"
#include "core/session/snapshot.h"

namespace linattn {

bool GenerationEngine::Runnable(const Queue& q) const {
  if (q.jobs.empty()) return false;
  const Job& job = *q.jobs.front();
  const bool cancelled = job.control != nullptr && job.control->cancelled();
  if (!job.started() && job.memory_wait == leases_returned_.load() &&
      job.caller.Check().ok() && abort_.ok() && !cancelled) {
    return false;  // waits for a request under way to give memory back
  }
  if (job.kind != Job::Kind::kGenerate || !job.started() ||
      !job.control->paced() || HasSideRequest(q)) {
    return true;
  }
  if (!abort_.ok() || cancelled) return true;
  const uint64_t delivered = job.control->delivered();
  if (job.waiting && job.emitted <= delivered) return true;  // its turn
  if (job.finished_sampling()) {
    return !job.waiting && delivered >= job.emitted;  // to end
  }
  return job.completion_tokens <= delivered + 1;  // may compute the next
}

void GenerationEngine::Emit(Job& job, std::function<void()> event,
                            Callbacks& callbacks, bool counts) {
  if (job.control->paced() && job.emitted > job.control->delivered()) {
    job.waiting = std::move(event);  // one message is on its way already
    job.waiting_counts = counts;
    return;
  }
  callbacks.push_back(std::move(event));
  if (counts) job.emitted++;
}

uint64_t GenerationEngine::KeptTokens(const Job& job) {
  const uint64_t sampled = job.completion_tokens;
  if (job.control->atomic()) return 0;
  return job.control->paced() ? std::min(job.control->delivered(), sampled)
                              : sampled;
}

ModelContextRef GenerationEngine::Visible(const Queue& q) const {
  const ModelSession& s = *q.session;
  const ModelContextRef own{s.state(), s.pending_token(), s.sampler()};
  if (q.jobs.empty()) return own;
  const Job& job = *q.jobs.front();
  if (job.kind != Job::Kind::kGenerate || !job.started()) return own;
  // The branches of EndCancelled, reading instead of moving.
  const uint64_t sampled = job.completion_tokens;
  const uint64_t kept = KeptTokens(job);
  const ModelContextRef start{job.backup, job.backup_pending,
                              job.backup_sampler};
  if (kept == 0) return start;
  if (kept < sampled) {
    const Job::Rollback& r = job.rollback[kept % 2];
    if (r.index != kept) return start;
    return ModelContextRef{
        r.state, r.token,
        job.params.temperature > 0.0f
            ? SamplerPosition{job.params.seed, job.first_draw + kept, true}
            : s.sampler()};
  }
  // Every sampled token is kept: the last one is pending (not fed yet, or
  // the final one, which is never fed).
  if (job.finished_sampling()) return own;
  return ModelContextRef{s.state(), job.feed.back(), s.sampler()};
}

bool GenerationEngine::HasSideRequest(const Queue& q) const {
  if (q.jobs.size() < 2) return false;
  const Job& head = *q.jobs.front();
  if (head.kind != Job::Kind::kGenerate || !head.started() ||
      head.awaiting_commit) {
    return false;
  }
  const Job& next = *q.jobs[1];
  return next.kind == Job::Kind::kFork ||
         (next.kind == Job::Kind::kSnapshot && next.covered_seq == nullptr);
}

void GenerationEngine::AnswerSideRequests(Queue& q, Callbacks& callbacks) {
  while (HasSideRequest(q)) {
    Job& job = *q.jobs[1];
    if (absl::Status gone = job.caller.Check(); !gone.ok()) {
      job.Fail(gone, callbacks);
    } else if (job.kind == Job::Kind::kFork) {
      AnswerFork(job, *q.session, Visible(q), callbacks);
    } else {
      AnswerSnapshot(job, *q.session, Visible(q), callbacks);
    }
    q.jobs.erase(q.jobs.begin() + 1);
    q.session->pending().fetch_sub(1);
  }
}

void GenerationEngine::AnswerFork(Job& job, const ModelSession& s,
                                  const ModelContextRef& context,
                                  Callbacks& callbacks) {
  auto forked = sessions_->ForkModelSession(s, context, job.new_id,
                                            "new_session_id", job.tenant);
  absl::StatusOr<ModelSessionInfo> result =
      forked.ok() ? absl::StatusOr<ModelSessionInfo>(Describe(**forked))
                  : forked.status();
  // Callbacks run once this iteration's records are committed: the fork's
  // create among them.
  callbacks.push_back([cb = job.on_info, result, store = options_.store,
                       sessions = sessions_,
                       child = forked.ok() ? *forked : nullptr] {
    if (store != nullptr && child != nullptr) {
      if (absl::Status recorded = store->AwaitCreate(*sessions, *child);
          !recorded.ok()) {
        return cb(recorded);
      }
    }
    cb(result);
  });
}

void GenerationEngine::AnswerSnapshot(Job& job, const ModelSession& s,
                                      const ModelContextRef& context,
                                      Callbacks& callbacks) {
  // A hybrid's snapshot grows with its keys and values: one a client asked
  // for is refused, by name, before it is built when it could not be sent
  // (the store's own snapshots go to files and are never refused).
  const uint64_t limit = sessions_->options().max_message_bytes;
  if (job.covered_seq == nullptr && limit != 0) {
    const uint64_t size =
        ModelSnapshotBytesAt(s.model(), context.state.position()) + 64;
    if (size > limit) {
      callbacks.push_back([cb = job.on_snapshot, size, limit,
                           position = context.state.position()] {
        cb(absl::ResourceExhaustedError(absl::StrCat(
            "session_id: a snapshot of the session at position ", position,
            " is ", size,
            " bytes with its framing, more than one message may carry (", limit,
            " bytes, --max-message-bytes); Fork copies it within the "
            "server")));
      });
      return;
    }
  }
  std::string blob = SerializeModelSnapshot(s.model(), context.state,
                                            context.pending, context.sampler);
  // A snapshot for the store is taken at the head of the queue: every
  // record of the session the blob holds is committed by now (a request
  // ahead of this one waited for its commit).
  if (job.covered_seq != nullptr && options_.store != nullptr) {
    *job.covered_seq = options_.store->CoveredPosition(s);
  }
  callbacks.push_back(
      [cb = job.on_snapshot, blob = std::move(blob)] { cb(blob); });
}

void GenerationEngine::EndCancelled(Queue& q, Job& job, Callbacks& callbacks) {
  ModelSession& s = *q.session;
  const uint64_t sampled = job.completion_tokens;
  const uint64_t delivered = KeptTokens(job);
  bool changed = true;  // the context holds the prompt and delivered tokens
  if (delivered == 0 ||
      (delivered < sampled && job.rollback[delivered % 2].index != delivered)) {
    // Nothing reached the client: as it was. (The second condition cannot
    // hold while pacing keeps sampled ≤ delivered + 2; if it ever did, the
    // start is the one state known to be right.)
    RestoreBackup(s, job);
    changed = false;
  } else if (delivered < sampled) {
    // Tokens after the delivered ones were fed: back to the state from
    // before the last delivered one was fed, with it pending again.
    Job::Rollback& r = job.rollback[delivered % 2];
    s.state() = std::move(r.state);
    s.pending_token() = r.token;
    if (job.params.temperature > 0.0f) {
      // The stream goes back with the tokens: one draw per token.
      s.sampler() = {job.params.seed, job.first_draw + delivered, true};
    }
    RecordContext(s);  // the undelivered tokens were recorded
  } else if (!job.finished_sampling()) {
    // Every sampled token went out; the last is in the context, not fed.
    s.pending_token() = job.feed.back();
  } else {
    changed = false;  // it ended before the cancel, and was published then
  }
  s.Publish(changed);
  if (job.state != Job::State::kFinalSent) {  // else it has said so
    GenerateEvent e;
    e.finished = true;
    e.finish_reason = "cancelled";
    e.status = abort_;
    e.prompt_tokens = job.prompt_tokens;
    e.completion_tokens = delivered;
    e.position = s.position();
    callbacks.push_back([cb = job.on_event, e] { cb(e); });
  }
  Pop(q);
}

GenerationEngine::StartResult GenerationEngine::Start(Queue& q, Job& job,
                                                      Callbacks& callbacks) {
  ModelSession& s = *q.session;
  // Its working copies first: taken from the budget (or waited for), then
  // allocated. A backup of the state; a paced Generate keeps two more
  // (GenerationJob::rollback).
  const bool paced = job.kind == Job::Kind::kGenerate && job.control->paced();
  const uint64_t bytes = s.model().working_copy_bytes() * (paced ? 3 : 1);
  auto lease = sessions_->budget().Lease(
      bytes, absl::StrCat("memory: this request needs working copies of the "
                          "session's state (",
                          bytes, " bytes)"));
  absl::Status start = lease.status();
  // Whether waiting for requests under way could help: memory of the
  // server's that they give back, enough for this one at all.
  bool may_wait = !lease.ok() && sessions_->budget().CouldFit(bytes);
  if (start.ok()) {
    // A hybrid's keys and values grow with the context: the session's
    // charge covers every position this request may reach before it feeds
    // anything (Pop gives back what it did not reach).
    const uint64_t reach =
        s.context_position() + job.input.size() +
        (job.kind == Job::Kind::kGenerate ? job.params.max_tokens : 0);
    const uint64_t charge = s.model().state_bytes_at(reach);
    bool budget_short = false;
    start = sessions_->Recharge(
        s, charge, job.tenant,
        [&] {
          return absl::StrCat(
              "memory: this request may take the session to position ", reach,
              ", where its keys and values take ", s.model().kv_bytes_at(reach),
              " bytes (", charge - s.charged_bytes(), " more than it holds)");
        },
        &budget_short);
    // A tenant's quota is not given back by other tenants' requests, nor
    // is more than the whole budget.
    may_wait = budget_short && sessions_->budget().CouldFit(charge + bytes);
    if (!start.ok()) lease->Release();
  }
  if (!start.ok() && may_wait && leased_jobs_.load() > 0) {
    // Memory comes back when a request under way ends.
    job.memory_wait = leases_returned_.load();
    return StartResult::kWaitForMemory;
  }
  if (start.ok()) {
    job.lease.memory = *std::move(lease);
    job.lease.held = &leased_jobs_;
    job.lease.returned = &leases_returned_;
    leased_jobs_.fetch_add(1);
    try {
      job.backup = s.state().Copy();
      if (paced) {
        // The rollback slots (RunOnce's steps write into them).
        for (Job::Rollback& slot : job.rollback) {
          slot.state = s.model().NewState();
        }
      }
    } catch (const std::bad_alloc&) {
      start = absl::ResourceExhaustedError(
          "memory: allocating a backup of the session's state failed");
    }
  }
  if (!start.ok()) {
    job.Fail(start, callbacks);
    Pop(q);
    return StartResult::kEnded;
  }
  job.state = Job::State::kFeeding;
  (job.kind == Job::Kind::kAppend ? appends_ : generates_)++;
  prompt_tokens_ += job.input.size();
  job.backup_pending = s.pending_token();
  job.backup_sampler = s.sampler();
  if (s.pending_token()) job.feed.push_back(*s.pending_token());
  job.feed.insert(job.feed.end(), job.input.begin(), job.input.end());
  s.pending_token().reset();
  if (job.kind == Job::Kind::kAppend) {
    // The last token stays pending; the rest is fed.
    job.final_pending = job.feed.back();
    job.feed.pop_back();
    if (job.feed.empty()) {
      s.pending_token() = job.final_pending;
      CommitAppend(q, job, callbacks);
      return StartResult::kEnded;
    }
    return StartResult::kStarted;
  }
  job.prompt_tokens = job.input.size();
  if (job.params.resume_stream) {
    if (!s.sampler().set) {
      s.pending_token() = job.backup_pending;
      job.Fail(absl::FailedPreconditionError(
                   "sampling.resume_stream: the session has no random "
                   "stream to resume (no Generate of it has sampled at a "
                   "temperature above 0)"),
               callbacks);
      Pop(q);
      return StartResult::kEnded;
    }
    job.params.seed = s.sampler().seed;
    job.first_draw = s.sampler().draws;
  }
  job.sampler = std::make_unique<Sampler>(job.params, job.first_draw);
  job.text = std::make_unique<TextStream>(job.params.stop);
  if (job.feed.empty()) {
    const auto& bos = s.model().config().bos_token_id;
    if (!bos) {
      s.pending_token() = job.backup_pending;
      job.Fail(absl::InvalidArgumentError(
                   "prompt: empty, the session has no context, and the model "
                   "has no bos_token_id to start from"),
               callbacks);
      Pop(q);
      return StartResult::kEnded;
    }
    job.feed.push_back(static_cast<int32_t>(*bos));
    job.joining.assign(1, static_cast<int32_t>(*bos));
  } else {
    job.joining = job.input;
  }
  // The tokens this Generate feeds start its penalty window.
  job.sampler->Observe(job.feed);
  return StartResult::kStarted;
}

void GenerationEngine::CommitAppend(Queue& q, Job& job, Callbacks& callbacks) {
  Record(
      q, job, job.input, std::nullopt,
      [this, &q, &job](Callbacks& cbs) {
        ModelSession& s = *q.session;
        s.Publish(/*stepped=*/true);
        cbs.push_back([cb = job.on_info, info = Describe(s)] { cb(info); });
        Pop(q);
      },
      [this, &q, &job](const absl::Status& status, Callbacks& cbs) {
        RestoreBackup(*q.session, job);
        job.Fail(status, cbs);
        Pop(q);
      },
      callbacks);
}

bool GenerationEngine::Advance(Queue& q, std::vector<Row>& candidates,
                               Callbacks& callbacks) {
  ModelSession& s = *q.session;
  Job& job = *q.jobs.front();
  // Its change is on its way to disk: the session waits for it.
  if (job.awaiting_commit) return false;
  if (absl::Status gone = job.caller.Check(); !gone.ok()) {
    // The caller has gone: what is not committed is dropped. (A Generate's
    // caller going is a cancel, through its control.)
    if (job.started()) RestoreBackup(s, job);
    job.Fail(gone, callbacks);
    Pop(q);
    return true;
  }
  switch (job.kind) {
    case Job::Kind::kFork:
      AnswerFork(job, s, Visible(q), callbacks);
      Pop(q);
      return true;
    case Job::Kind::kSnapshot:
      AnswerSnapshot(job, s, Visible(q), callbacks);
      Pop(q);
      return true;
    case Job::Kind::kDelete: {
      DurableStore* const store = options_.store;
      const uint64_t before = store != nullptr ? store->last_ticket() : 0;
      const absl::Status deleted =
          sessions_->Delete(s.id(), SessionKind::kModel, Tenant::Server());
      const uint64_t after = store != nullptr ? store->last_ticket() : 0;
      callbacks.push_back([cb = job.on_delete, deleted, store, before, after] {
        if (store != nullptr && deleted.ok()) {
          if (absl::Status recorded = store->SyncThrough(before + 1, after);
              !recorded.ok()) {
            return cb(absl::Status(
                recorded.code(),
                absl::StrCat("state dir: the session is deleted, but "
                             "recording its deletion failed (",
                             recorded.message(), ")")));
          }
        }
        cb(deleted);
      });
      Pop(q);
      // Requests queued behind the delete find no session.
      const absl::Status gone = absl::NotFoundError(
          absl::StrCat("session_id: session '", s.id(), "' was deleted"));
      while (!q.jobs.empty()) {
        q.jobs.front()->Fail(gone, callbacks);
        Pop(q);
      }
      return false;
    }
    case Job::Kind::kAppend:
    case Job::Kind::kGenerate:
      break;
  }
  const bool cancelled = job.kind == Job::Kind::kGenerate &&
                         (!abort_.ok() || job.control->cancelled());
  if (!job.started() && cancelled) {
    // Ended before it began: nothing to take back.
    GenerateEvent e;
    e.finished = true;
    e.finish_reason = "cancelled";
    e.status = abort_;
    e.position = s.position();
    callbacks.push_back([cb = job.on_event, e] { cb(e); });
    Pop(q);
    return true;
  }
  if (!job.started()) {
    switch (Start(q, job, callbacks)) {
      case StartResult::kWaitForMemory:
        return false;
      case StartResult::kEnded:
        return !q.jobs.empty() && !q.jobs.front()->awaiting_commit;
      case StartResult::kStarted:
        break;
    }
  }
  if (job.kind == Job::Kind::kGenerate) {
    if (cancelled) {
      EndCancelled(q, job, callbacks);
      return true;
    }
    AnswerSideRequests(q, callbacks);
    if (job.waiting && job.emitted <= job.control->delivered()) {
      Emit(job, std::move(job.waiting), callbacks,
           job.waiting_counts);  // its turn now
      job.waiting = nullptr;
      if (job.state == Job::State::kFinalHeld) {
        job.state = Job::State::kFinalSent;
      }
    }
    if (!Runnable(q)) return false;  // waits for a delivery
    if (job.finished_sampling()) {   // its final message was delivered
      Pop(q);
      return true;
    }
  }
  candidates.push_back(Row{&q, &job});
  return false;
}

void GenerationEngine::Plan(Batch& batch, Callbacks& callbacks) {
  std::vector<Row> rows;
  for (auto& [id, q] : queues_) {
    while (!q.jobs.empty() && Advance(q, rows, callbacks)) {
    }
  }
  for (auto it = queues_.begin(); it != queues_.end();) {
    it = it->second.jobs.empty() ? queues_.erase(it) : std::next(it);
  }
  std::vector<PlanCandidate> candidates;
  candidates.reserve(rows.size());
  // Tenants take turns where not every row fits (iteration_planner.h).
  std::unordered_map<std::string_view, uint32_t> tenants;
  for (const Row& row : rows) {
    const std::string& owner = row.queue->session->owner();
    const uint32_t group =
        tenants.emplace(owner, static_cast<uint32_t>(tenants.size()))
            .first->second;
    candidates.push_back(
        {row.job->seq, row.job->feed.size() - row.job->fed, group});
  }
  const std::vector<uint32_t> take = PlanIteration(
      candidates,
      {.token_budget = options_.token_budget, .max_batch = options_.max_batch});
  for (size_t i = 0; i < rows.size(); ++i) {
    if (take[i] == 0) continue;
    rows[i].job->take = take[i];
    batch.total += take[i];
    batch.rows[&rows[i].queue->session->model()].push_back(rows[i]);
  }
}

}  // namespace linattn
