// GenerationEngine's iterations (generation.h): the planned rows through
// one batched forward per model, the sampled tokens emitted, and every
// change of a session's context recorded (RoundCommit) before it is
// acknowledged; a request that fails puts its session back.
#include <omp.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "core/scheduler/generation.h"
#include "core/util/parallel_for.h"

namespace linattn {

void GenerationEngine::RestoreBackup(ModelSession& s, Job& job) {
  s.state() = std::move(job.backup);
  s.pending_token() = job.backup_pending;
  s.sampler() = job.backup_sampler;
  s.Publish();
  // Generated tokens were recorded as they were sampled: the context goes
  // back on disk too.
  if (job.kind == Job::Kind::kGenerate && job.completion_tokens > 0) {
    RecordContext(s);
  }
}

void GenerationEngine::RecordContext(ModelSession& s) {
  if (!records_.durable()) return;
  records_.Begin();
  records_.records().AddModelState(s);
  rewound_.push_back({s.id(), s.incarnation()});
}

void GenerationEngine::Record(
    Queue& q, Job& job, std::span<const int32_t> tokens,
    std::optional<SamplerPosition> stream,
    std::function<void(Callbacks&)> on_commit,
    std::function<void(const absl::Status&, Callbacks&)> on_failure,
    Callbacks& callbacks) {
  if (stream) {
    // The stream moves with the tokens it drew.
    on_commit = [&q, stream, then = std::move(on_commit)](Callbacks& cbs) {
      q.session->sampler() = *stream;
      then(cbs);
    };
  }
  if (!records_.durable()) {
    on_commit(callbacks);
    return;
  }
  const uint32_t request = records_.Begin();
  records_.records().AddTokens(*q.session, tokens);
  if (stream) records_.records().AddSampler(*q.session, *stream);
  job.awaiting_commit = true;
  awaiting_.push_back(
      Awaiting{&q, &job, std::move(on_commit), std::move(on_failure), request});
}

void GenerationEngine::CommitRecords(Callbacks& callbacks) {
  DurableStore* const store = options_.store;
  if (store == nullptr) return;
  RoundCommit commit(store);
  std::vector<Awaiting> awaiting;
  std::vector<std::pair<std::string, uint64_t>> rewound;
  {
    std::lock_guard<std::mutex> lock(mu_);
    commit = std::exchange(records_, RoundCommit(store));
    awaiting.swap(awaiting_);
    rewound.swap(rewound_);
  }
  // Creates staged by forks and restores go too, before any of their
  // sessions is fed (a staged create is read when committed).
  if (!commit.HasWork() && awaiting.empty()) return;
  commit.Commit();
  std::lock_guard<std::mutex> lock(mu_);
  if (!commit.status().ok()) {
    // A context that went back could not be recorded: the session's
    // snapshot file will be.
    for (const auto& [id, incarnation] : rewound) {
      store->SnapshotSoon(id, incarnation);
    }
  }
  for (Awaiting& a : awaiting) {
    a.job->awaiting_commit = false;
    // A session handed over to another replica meanwhile fails alone.
    if (absl::Status s = commit.Outcome(a.request); !s.ok()) {
      a.on_failure(s, callbacks);
    } else {
      a.on_commit(callbacks);
    }
  }
}

bool GenerationEngine::RunOnce() {
  Callbacks callbacks;
  Batch batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return false;
    bool runnable = false;
    for (const auto& [id, q] : queues_) runnable |= Runnable(q);
    if (!runnable) return false;
    Plan(batch, callbacks);
  }
  // What Plan changed is recorded (and staged creates with it) before any
  // answer goes out and before this iteration feeds anything.
  CommitRecords(callbacks);
  for (auto& cb : callbacks) cb();
  callbacks.clear();
  if (batch.total == 0) return true;
  const auto started = std::chrono::steady_clock::now();
  iterations_++;
  uint64_t seen = max_rows_seen_.load();
  while (batch.total > seen &&
         !max_rows_seen_.compare_exchange_weak(seen, batch.total)) {
  }
  // The executor gives the team back whole after this iteration.
  omp_set_num_threads(batch.total <= options_.single_thread_rows
                          ? 1
                          : executor_->max_threads());
  std::map<const Model*, absl::Status> results;
  for (auto& [model, rows] : batch.rows) {
    // Generated token j of a paced Generate is about to join its state
    // (Job::rollback): the step writes the state after it into rollback
    // slot j % 2 (ForwardItem::into), which then trades places with the
    // session's, so the slot holds the state from before the token without
    // a copy. (Start gave the slots their shape; the slot's old content,
    // from before token j − 2, is no longer needed: pacing keeps token
    // j − 1 delivered or under way.)
    auto rolls_back = [](const Job& job) {
      return job.kind == Job::Kind::kGenerate && job.control->paced() &&
             job.completion_tokens > 0 && job.take == 1;
    };
    std::vector<ForwardItem> items;
    items.reserve(rows.size());
    for (const Row& r : rows) {
      Job& job = *r.job;
      ModelSession& s = *r.queue->session;
      const bool last = job.fed + job.take == job.feed.size();
      const bool wants = last && job.kind == Job::Kind::kGenerate;
      if (wants) job.logits.resize(model->config().vocab_size);
      items.push_back(ForwardItem{
          .state = &s.state(),
          .tokens =
              std::span<const int32_t>(job.feed.data() + job.fed, job.take),
          .logits = wants ? job.logits.data() : nullptr,
          .into = rolls_back(job)
                      ? &job.rollback[job.completion_tokens % 2].state
                      : nullptr});
    }
    results[model] = runners_.at(model)->Run(items);
    if (results[model].ok()) {
      // The next tokens, each from its job's own sampler, sampled here and
      // spread over the team rather than one by one under mu_ (Finish
      // takes them). (A named reference: clang cannot capture a structured
      // binding.)
      const auto& group = rows;
      ParallelFor(group.size(), group.size() > 1, [&](uint64_t i) {
        Job& job = *group[i].job;
        if (items[i].logits != nullptr) {
          job.sampled = job.sampler->Sample(job.logits);
        }
      });
      for (const Row& r : rows) {
        Job& job = *r.job;
        if (!rolls_back(job)) continue;
        const uint64_t j = job.completion_tokens;
        Job::Rollback& slot = job.rollback[j % 2];
        std::swap(slot.state, r.queue->session->state());
        slot.token = job.feed[0];
        slot.index = j;
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [model, rows] : batch.rows) {
      Batch one;
      one.rows[model] = rows;
      Finish(one, results[model], callbacks);
    }
  }
  CommitRecords(callbacks);
  for (auto& cb : callbacks) cb();
  if (options_.on_iteration) {
    options_.on_iteration(batch.total,
                          std::chrono::duration<double>(
                              std::chrono::steady_clock::now() - started)
                              .count());
  }
  return true;
}

void GenerationEngine::Finish(Batch& batch, const absl::Status& status,
                              Callbacks& callbacks) {
  for (auto& [model, rows] : batch.rows) {
    for (const Row& r : rows) {
      Queue& q = *r.queue;
      ModelSession& s = *q.session;
      Job& job = *r.job;
      if (!status.ok()) {
        RestoreBackup(s, job);
        job.Fail(status, callbacks);
        Pop(q);
        continue;
      }
      job.fed += job.take;
      s.Publish();
      if (job.fed < job.feed.size()) continue;
      if (job.kind == Job::Kind::kAppend) {
        if (absl::Status gone = job.caller.Check(); !gone.ok()) {
          RestoreBackup(s, job);  // the caller left before the commit
          job.Fail(gone, callbacks);
          Pop(q);
          continue;
        }
        s.pending_token() = job.final_pending;
        CommitAppend(q, job, callbacks);
        continue;
      }
      absl::StatusOr<SampledToken> token =
          job.sampled.has_value() ? *std::move(job.sampled)
                                  : job.sampler->Sample(job.logits);
      job.sampled.reset();
      if (!token.ok()) {
        RestoreBackup(s, job);
        job.Fail(token.status(), callbacks);
        Pop(q);
        continue;
      }
      OnToken(q, job, *token, callbacks);
    }
  }
}

void GenerationEngine::OnToken(Queue& q, Job& job, const SampledToken& token,
                               Callbacks& callbacks) {
  ModelSession& s = *q.session;
  job.completion_tokens++;
  generated_tokens_++;
  GenerateEvent e;
  e.token_id = token.id;
  if (job.params.logprobs) {
    e.logprob = token.logprob;
    e.top_logprobs = token.top;
  }
  std::string reason;
  const auto& eos = s.model().config().eos_token_id;
  const bool is_eos = eos && token.id == *eos;
  if (is_eos) {
    reason = "eos";  // ends the text; its own bytes (if any) are not text
  } else if (job.completion_tokens == job.params.max_tokens) {
    reason = "length";
  }
  const std::string bytes =
      is_eos ? std::string() : s.model().tokenizer().TokenBytes(token.id);
  TextStream::Piece piece = job.text->Next(bytes, !reason.empty());
  if (piece.stopped) reason = "stop";
  e.text = std::move(piece.text);
  e.prompt_tokens = job.prompt_tokens;
  e.completion_tokens = job.completion_tokens;
  // The token joins the context (the first with the prompt, which is fed
  // by now) before its message goes out.
  std::vector<int32_t> joined;
  if (job.completion_tokens == 1) joined = job.joining;
  joined.push_back(token.id);
  std::optional<SamplerPosition> stream;
  if (job.params.temperature > 0.0f) {
    stream = SamplerPosition{job.params.seed, job.sampler->draws(), true};
  }
  if (reason.empty()) {
    job.feed.assign(1, token.id);
    job.fed = 0;
    e.position = s.state().position() + 1;
    Record(
        q, job, joined, stream,
        [this, &job, e](Callbacks& cbs) {
          Emit(
              job, [cb = job.on_event, e] { cb(e); }, cbs);
        },
        [this, &q, &job](const absl::Status& status, Callbacks& cbs) {
          EndUnrecorded(q, job, status, cbs);
        },
        callbacks);
    return;
  }
  s.pending_token() = token.id;
  e.finished = true;
  e.finish_reason = reason;
  Record(
      q, job, joined, stream,
      [this, &q, &job, e](Callbacks& cbs) mutable {
        ModelSession& session = *q.session;
        session.Publish(/*stepped=*/true);
        e.position = session.position();
        Emit(
            job, [cb = job.on_event, e] { cb(e); }, cbs);
        job.state =
            job.waiting ? Job::State::kFinalHeld : Job::State::kFinalSent;
        // Paced, Plan ends it once the final message is delivered.
        if (!job.control->paced()) Pop(q);
      },
      [this, &q, &job](const absl::Status& status, Callbacks& cbs) {
        q.session->pending_token().reset();
        EndUnrecorded(q, job, status, cbs);
      },
      callbacks);
}

void GenerationEngine::EndUnrecorded(Queue& q, Job& job,
                                     const absl::Status& status,
                                     Callbacks& callbacks) {
  ModelSession& s = *q.session;
  // The token just sampled is not in the context on disk, so it is not in
  // the context at all; the ones before it (and the prompt) are, unless it
  // was the first.
  job.completion_tokens--;
  if (job.completion_tokens == 0 || job.control->atomic()) {
    RestoreBackup(s, job);
    job.Fail(status, callbacks);
    Pop(q);
    return;
  }
  // The last recorded token is fed already: the context holds it.
  s.Publish(/*stepped=*/true);
  GenerateEvent e;
  e.finished = true;
  e.status = status;
  e.prompt_tokens = job.prompt_tokens;
  e.completion_tokens = job.completion_tokens;
  e.position = s.position();
  // It carries no token: nothing for a paced job to wait for but the turn
  // of the message before it.
  Emit(
      job, [cb = job.on_event, e] { cb(e); }, callbacks, /*counts=*/false);
  job.state = job.waiting ? Job::State::kFinalHeld : Job::State::kFinalSent;
  if (!job.control->paced()) Pop(q);
}

}  // namespace linattn
