#include "core/scheduler/generation.h"

#include <algorithm>
#include <cassert>

#include "absl/strings/str_cat.h"
#include "core/session/snapshot.h"
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
  // What Start charged for positions the request did not reach goes back
  // (a shrink, which cannot fail; a session deleted meanwhile is left be).
  ModelSession& s = *q.session;
  (void)sessions_->Recharge(s, s.model().state_bytes_at(s.state().position()),
                            Tenant::Server(), [] { return std::string(); });
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

}  // namespace linattn
