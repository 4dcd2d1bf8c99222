#include "core/scheduler/generation.h"

#include <omp.h>

#include <algorithm>
#include <cassert>
#include <chrono>
#include <string_view>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "core/scheduler/iteration_planner.h"
#include "core/session/snapshot.h"
#include "core/util/parallel_for.h"
#include "core/util/status_macros.h"

namespace linattn {
namespace {

// Checked when a request arrives, so that it fails before it is queued and
// names the request's field.
absl::Status CheckTokenIds(const Model& model, const std::vector<int32_t>& ids,
                           absl::string_view field) {
  const uint32_t vocab = model.config().vocab_size;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || static_cast<uint32_t>(ids[i]) >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "]: id ", ids[i],
                       " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

std::unique_ptr<SessionManager> OwnTable(const GenerationOptions& options) {
  if (options.sessions != nullptr) return nullptr;
  SessionManagerOptions table;
  table.max_sessions = std::max<uint64_t>(options.max_sessions, 1);
  table.max_state_bytes = options.memory_budget_bytes;
  return *SessionManager::Create(table);
}

}  // namespace

void GenerationJob::Fail(const absl::Status& status,
                         Callbacks& callbacks) const {
  if (on_info) callbacks.push_back([cb = on_info, status] { cb(status); });
  if (on_snapshot) {
    callbacks.push_back([cb = on_snapshot, status] { cb(status); });
  }
  if (on_delete) callbacks.push_back([cb = on_delete, status] { cb(status); });
  if (on_event && state != State::kFinalSent) {
    GenerateEvent e;
    e.finished = true;
    e.status = status;
    callbacks.push_back([cb = on_event, e] { cb(e); });
  }
}

GenerationEngine::GenerationEngine(
    std::vector<std::shared_ptr<const Model>> models, GenerationOptions options)
    : models_(std::move(models)),
      options_(options),
      own_sessions_(OwnTable(options)),
      sessions_(options.sessions != nullptr ? options.sessions
                                            : own_sessions_.get()),
      executor_(options.executor != nullptr
                    ? options.executor
                    : std::make_shared<ComputeExecutor>()),
      records_(options.store) {
  // Atomicity lives in the job (its backup); the runner keeps no copies.
  for (const auto& m : models_) {
    runners_[m.get()] = std::make_unique<ForwardRunner>(m, options_.forward);
  }
  executor_->Add(this);
}

GenerationEngine::~GenerationEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  executor_->Remove(this);
  // What is still queued ends with UNAVAILABLE; a request under way first
  // puts its session back (a Generate keeps what was delivered, as on a
  // cancel), since the table may outlive the engine.
  Callbacks callbacks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    abort_ = absl::UnavailableError("the server is stopping");
    for (auto& [id, q] : queues_) {
      if (!q.jobs.empty() && q.jobs.front()->started()) {
        Job& head = *q.jobs.front();
        if (head.kind == Job::Kind::kGenerate) {
          EndCancelled(q, head, callbacks);
        } else {
          RestoreBackup(*q.session, head);
          head.Fail(abort_, callbacks);
          Pop(q);
        }
      }
      while (!q.jobs.empty()) {
        q.jobs.front()->Fail(abort_, callbacks);
        Pop(q);
      }
    }
    // Jobs gave their working copies back to the table's budget above,
    // before an own table goes.
    queues_.clear();
  }
  for (auto& cb : callbacks) cb();
}

absl::StatusOr<std::shared_ptr<const Model>> GenerationEngine::FindModel(
    const std::string& name) const {
  if (models_.empty()) {
    return absl::NotFoundError(
        "model: this server serves no models (start it with --model DIR)");
  }
  if (name.empty()) return models_.front();
  for (const auto& m : models_) {
    if (m->name() == name) return m;
  }
  return absl::NotFoundError(absl::StrCat("model: no model '", name, "'"));
}

absl::StatusOr<std::shared_ptr<const Model>> GenerationEngine::ModelOf(
    const std::string& session_id, const Tenant& tenant) const {
  LINATTN_ASSIGN_OR_RETURN(auto session,
                           sessions_->FindModel(session_id, tenant));
  return session->shared_model();
}

ModelSessionInfo GenerationEngine::Describe(const ModelSession& s) {
  return ModelSessionInfo{s.id(), s.model().name(), s.position(),
                          s.state_bytes()};
}

absl::StatusOr<ModelSessionInfo> GenerationEngine::CreateSession(
    const std::string& model_name, const std::string& session_id,
    const Tenant& tenant) {
  LINATTN_ASSIGN_OR_RETURN(auto model, FindModel(model_name));
  LINATTN_ASSIGN_OR_RETURN(
      auto session, sessions_->CreateModelSession(model, session_id, tenant));
  if (options_.store != nullptr) {
    LINATTN_RETURN_IF_ERROR(options_.store->AwaitCreate(*sessions_, *session));
  }
  return Describe(*session);
}

absl::StatusOr<ModelSessionInfo> GenerationEngine::GetSession(
    const std::string& id, const Tenant& tenant) const {
  LINATTN_ASSIGN_OR_RETURN(auto session, sessions_->FindModel(id, tenant));
  return Describe(*session);
}

std::vector<ModelSessionInfo> GenerationEngine::ListSessions(
    const Tenant& tenant) const {
  std::vector<ModelSessionInfo> out;
  for (const auto& s : sessions_->List(SessionKind::kModel, tenant)) {
    out.push_back(Describe(static_cast<const ModelSession&>(*s)));
  }
  return out;
}

absl::StatusOr<ModelSessionInfo> GenerationEngine::Restore(
    const std::string& bytes, const std::string& session_id,
    const Tenant& tenant) {
  LINATTN_ASSIGN_OR_RETURN(ParsedModelSnapshot parsed,
                           ParseModelSnapshot(bytes, models_));
  LINATTN_ASSIGN_OR_RETURN(
      auto session, sessions_->AdoptModelSession(
                        parsed.model, std::move(parsed.state), parsed.pending,
                        parsed.sampler, session_id, "session_id", tenant));
  if (options_.store != nullptr) {
    LINATTN_RETURN_IF_ERROR(options_.store->AwaitCreate(*sessions_, *session));
  }
  return Describe(*session);
}

void GenerationEngine::Enqueue(const std::string& id,
                               std::unique_ptr<Job> job) {
  absl::Status error;
  {
    // Looked up under mu_, which a Delete running on the worker holds while
    // it removes the session: a request never joins a deleted session.
    // Acquired (pending raised under the table's lock), so idle eviction
    // cannot take it either.
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      error = absl::UnavailableError("the server is stopping");
    } else if (auto session = sessions_->AcquireModel(id, job->tenant);
               !session.ok()) {
      error = session.status();
    } else {
      Queue& q = queues_[id];
      if (q.jobs.empty()) q.session = *session;
      // A queue with requests belongs to the session in the table: only its
      // Delete (which empties the queue) removes it, and eviction spares a
      // session with requests.
      assert(q.session == *session);
      job->seq = next_seq_++;
      q.jobs.push_back(std::move(job));
    }
  }
  if (!error.ok()) {
    Callbacks callbacks;
    job->Fail(error, callbacks);
    for (auto& cb : callbacks) cb();
    return;
  }
  executor_->Wake();
}

void GenerationEngine::Pop(Queue& q) {
  q.jobs.pop_front();
  q.session->pending().fetch_sub(1);
}

void GenerationEngine::Append(const std::string& id,
                              std::vector<int32_t> tokens, InfoCallback done,
                              CallLiveness caller, const Tenant& tenant) {
  auto model = ModelOf(id, tenant);
  if (!model.ok()) return done(model.status());
  if (tokens.empty()) {
    return done(absl::InvalidArgumentError("tokens: no tokens to append"));
  }
  if (absl::Status s = CheckTokenIds(**model, tokens, "token_ids"); !s.ok()) {
    return done(s);
  }
  auto job = std::make_unique<Job>();
  job->kind = Job::Kind::kAppend;
  job->input = std::move(tokens);
  job->on_info = std::move(done);
  job->caller = std::move(caller);
  job->tenant = tenant;
  Enqueue(id, std::move(job));
}

void GenerationEngine::Generate(const std::string& id,
                                std::vector<int32_t> prompt,
                                SamplingParams params, EventCallback on_event,
                                std::shared_ptr<GenerateControl> control,
                                const Tenant& tenant) {
  auto fail = [&](absl::Status s) {
    GenerateEvent e;
    e.finished = true;
    e.status = std::move(s);
    on_event(e);
  };
  auto model = ModelOf(id, tenant);
  if (!model.ok()) return fail(model.status());
  if (absl::Status s = ValidateSampling(params); !s.ok()) return fail(s);
  if (absl::Status s = CheckTokenIds(**model, prompt, "prompt_token_ids");
      !s.ok()) {
    return fail(s);
  }
  auto job = std::make_unique<Job>();
  job->kind = Job::Kind::kGenerate;
  job->input = std::move(prompt);
  job->params = std::move(params);
  job->on_event = std::move(on_event);
  job->control =
      control ? std::move(control) : std::make_shared<GenerateControl>();
  job->tenant = tenant;
  Enqueue(id, std::move(job));
}

void GenerationEngine::Fork(const std::string& id, const std::string& new_id,
                            InfoCallback done, CallLiveness caller,
                            const Tenant& tenant) {
  auto job = std::make_unique<Job>();
  job->kind = Job::Kind::kFork;
  job->caller = std::move(caller);
  job->tenant = tenant;
  job->new_id = new_id;
  job->on_info = std::move(done);
  Enqueue(id, std::move(job));
}

void GenerationEngine::Snapshot(
    const std::string& id,
    std::function<void(absl::StatusOr<std::string>)> done, CallLiveness caller,
    const Tenant& tenant) {
  auto job = std::make_unique<Job>();
  job->kind = Job::Kind::kSnapshot;
  job->caller = std::move(caller);
  job->tenant = tenant;
  job->on_snapshot = std::move(done);
  Enqueue(id, std::move(job));
}

void GenerationEngine::SnapshotForStore(
    const std::string& id,
    std::function<void(absl::StatusOr<std::string>, uint64_t)> done) {
  auto job = std::make_unique<Job>();
  job->kind = Job::Kind::kSnapshot;
  job->tenant = Tenant::Server();
  job->covered_seq = std::make_shared<uint64_t>(0);
  job->on_snapshot = [done = std::move(done), seq = job->covered_seq](
                         absl::StatusOr<std::string> blob) {
    done(std::move(blob), *seq);
  };
  Enqueue(id, std::move(job));
}

void GenerationEngine::Delete(const std::string& id,
                              std::function<void(absl::Status)> done,
                              CallLiveness caller, const Tenant& tenant) {
  {
    // A Generate ahead of the delete is cancelled rather than waited for: a
    // paced one whose client stopped reading would otherwise hold the
    // delete for as long as its stream stays open. Only the deleter's own:
    // another tenant's Delete is NOT_FOUND and cancels nothing.
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = queues_.find(id);
        it != queues_.end() && sessions_->FindModel(id, tenant).ok()) {
      for (const auto& queued : it->second.jobs) {
        if (queued->kind == Job::Kind::kGenerate) {
          queued->control->cancelled_.store(true);
        }
      }
    }
  }
  auto job = std::make_unique<Job>();
  job->kind = Job::Kind::kDelete;
  job->on_delete = std::move(done);
  job->caller = std::move(caller);
  job->tenant = tenant;
  Enqueue(id, std::move(job));
}

void GenerationEngine::Cancel(GenerateControl& control) {
  control.cancelled_.store(true);
  executor_->Wake();
}

void GenerationEngine::Delivered(GenerateControl& control) {
  control.delivered_.fetch_add(1);
  executor_->Wake();
}

void GenerationEngine::AbortGenerations(const absl::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    abort_ = status;
  }
  executor_->Wake();
}

GenerationEngine::Load GenerationEngine::load() const {
  std::lock_guard<std::mutex> lock(mu_);
  Load load;
  for (const auto& [id, q] : queues_) {
    for (const auto& job : q.jobs) {
      ++(job->started() ? load.running : load.waiting);
    }
  }
  return load;
}

GenerationStats GenerationEngine::stats() const {
  return GenerationStats{.appends = appends_.load(),
                         .generates = generates_.load(),
                         .prompt_tokens = prompt_tokens_.load(),
                         .generated_tokens = generated_tokens_.load(),
                         .iterations = iterations_.load()};
}

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
  const uint64_t bytes = s.state_bytes() * (paced ? 3 : 1);
  auto lease = sessions_->budget().Lease(
      bytes, absl::StrCat("memory: this request needs working copies of the "
                          "session's state (",
                          bytes, " bytes)"));
  absl::Status start = lease.status();
  if (!lease.ok() && leased_jobs_.load() > 0) {
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
      [&q, &job](Callbacks& cbs) {
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
