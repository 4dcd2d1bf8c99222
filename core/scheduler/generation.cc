#include "core/scheduler/generation.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/session/session_manager.h"
#include "core/session/snapshot.h"
#include "core/util/status_macros.h"

namespace linattn {
namespace {

constexpr char kModelSnapshotMagic[8] = {'L', 'N', 'A', 'T',
                                         'M', 'S', 'N', 'P'};
constexpr uint32_t kModelSnapshotVersion = 1;

template <typename T>
void Put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

template <typename T>
bool Get(absl::string_view& in, T* value) {
  if (in.size() < sizeof(T)) return false;
  std::memcpy(value, in.data(), sizeof(T));
  in.remove_prefix(sizeof(T));
  return true;
}

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

}  // namespace

struct GenerationEngine::Job {
  enum class Kind { kAppend, kGenerate, kFork, kSnapshot, kDelete };
  Kind kind = Kind::kAppend;
  uint64_t seq = 0;
  std::vector<int32_t> input;
  SamplingParams params;
  EventCallback on_event;
  InfoCallback on_info;
  std::function<void(absl::StatusOr<std::string>)> on_snapshot;
  std::function<void(absl::Status)> on_delete;
  std::shared_ptr<GenerateControl> control;  // Generate: never null
  std::string new_id;
  CallLiveness caller;
  // The working copies' memory (backup, rollback), held while active; the
  // engine's counters say when it is given back.
  struct Lease {
    MemoryLease memory;
    std::atomic<uint64_t>* held = nullptr;
    std::atomic<uint64_t>* returned = nullptr;
    Lease() = default;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { Return(); }
    void Return() {
      if (held == nullptr) return;
      memory.Release();
      held->fetch_sub(1);
      returned->fetch_add(1);
      held = nullptr;
    }
  };
  Lease lease;
  // leases_returned_ when this job last found no memory (it is not runnable
  // until that moves); none yet = max.
  uint64_t memory_wait = UINT64_MAX;

  // Set when the request becomes the session's active one.
  bool active = false;
  std::vector<int32_t> feed;  // tokens to run through the model
  size_t fed = 0;
  std::optional<int32_t> final_pending;  // Append: the new pending token
  ModelState backup;
  std::optional<int32_t> backup_pending;
  uint64_t backup_position = 0;
  std::unique_ptr<Sampler> sampler;
  Utf8Stream utf8;
  std::string held;  // text that may be the start of a stop string
  uint64_t prompt_tokens = 0;
  uint64_t completion_tokens = 0;  // tokens sampled
  std::vector<float> logits;
  uint32_t take = 0;  // rows in the current iteration

  // Paced Generate (GenerateControl): of the tokens sampled, `emitted` have
  // gone to the event callback and the control says how many of those were
  // delivered. At most one emitted token waits for delivery; the next one
  // may be computed meanwhile (so compute overlaps the write) and waits in
  // `waiting` until then. A token is fed only once at most one sampled
  // token is undelivered, so a cancel has at most the last two fed tokens
  // to take back out: `rollback` holds the state from before each of the
  // last two generated tokens was fed (slot j % 2 for token j).
  uint64_t emitted = 0;
  std::function<void()> waiting;  // the next event, held for its turn
  struct Rollback {
    ModelState state;  // before generated token `index` was fed
    int32_t token = -1;
    uint64_t index = 0;  // 0 = empty
  };
  Rollback rollback[2];
  // The last token has been sampled; a paced request stays at the head of
  // its session until its final message is delivered (or fails to be).
  bool done = false;
  bool final_emitted = false;
};

namespace {

// Puts a session back where `job` found it.
template <typename Session, typename Job>
void RestoreBackup(Session& s, Job& job) {
  s.state = std::move(job.backup);
  s.pending = job.backup_pending;
  s.position = job.backup_position;
}

}  // namespace

struct GenerationEngine::Session {
  std::string id;
  std::shared_ptr<const Model> model;
  ModelState state;
  std::optional<int32_t> pending;
  uint64_t position = 0;  // cached: state position + pending
  std::deque<std::unique_ptr<Job>> jobs;
  std::chrono::steady_clock::time_point last_used =
      std::chrono::steady_clock::now();
};

struct GenerationEngine::Batch {
  struct Row {
    Session* session;
    Job* job;
  };
  std::map<const Model*, std::vector<Row>> rows;
  uint32_t total = 0;
};

GenerationEngine::GenerationEngine(
    std::vector<std::shared_ptr<const Model>> models, GenerationOptions options)
    : models_(std::move(models)),
      options_(options),
      budget_(options.budget != nullptr ? options.budget
                                        : std::make_shared<MemoryBudget>(
                                              options.memory_budget_bytes)) {
  // A failed iteration puts each request's session back from the request's
  // own backup (Finish), so the runner keeps none of its own.
  ForwardOptions forward = options_.forward;
  forward.backup = false;
  for (const auto& m : models_) {
    runners_[m.get()] = std::make_unique<ForwardRunner>(m, forward);
  }
  worker_ = std::thread([this] { WorkerLoop(); });
}

GenerationEngine::~GenerationEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  worker_.join();
  const absl::Status gone = absl::UnavailableError("the server is stopping");
  for (auto& [id, s] : sessions_) {
    for (auto& job : s->jobs) {
      if (job->on_info) job->on_info(gone);
      if (job->on_snapshot) job->on_snapshot(gone);
      if (job->on_delete) job->on_delete(gone);
      if (job->on_event && !job->final_emitted) {  // not said twice
        GenerateEvent e;
        e.finished = true;
        e.status = gone;
        job->on_event(e);
      }
    }
  }
  // Jobs give their working copies back to the budget, which may be the
  // engine's own and is destroyed before sessions_ would be.
  sessions_.clear();
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
    const std::string& session_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) {
    return NoSuchSession(session_id);
  }
  return it->second->model;
}

absl::StatusOr<std::string> GenerationEngine::NewId(
    const std::string& requested, absl::string_view field) const {
  return ChooseSessionId(
      requested,
      [this](absl::string_view id) {
        return sessions_.find(id) != sessions_.end();
      },
      field);
}

absl::Status GenerationEngine::Admit(const Model& model) {
  if (sessions_.size() >= options_.max_sessions) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "sessions: the server holds its limit of ", options_.max_sessions));
  }
  return budget_->Take(
      model.state_bytes(),
      absl::StrCat("memory: a session of '", model.name(), "' needs ",
                   model.state_bytes(), " bytes of state"));
}

void GenerationEngine::Remove(
    std::map<std::string, std::unique_ptr<Session>, std::less<>>::iterator it) {
  budget_->Give(it->second->model->state_bytes());
  sessions_.erase(it);
}

bool GenerationEngine::LeaseWorkingCopies(Session& s, Job& job,
                                          absl::Status* failed) {
  // A backup of the state; a paced Generate keeps two more (Job::rollback).
  const bool paced = job.kind == Job::Kind::kGenerate && job.control->paced();
  const uint64_t bytes = s.model->state_bytes() * (paced ? 3 : 1);
  auto lease = budget_->Lease(
      bytes, absl::StrCat("memory: this request needs working copies of the "
                          "session's state (",
                          bytes, " bytes)"));
  if (!lease.ok()) {
    // Memory comes back when a request under way ends; with none, never.
    if (leased_jobs_.load() > 0) {
      job.memory_wait = leases_returned_.load();
      return false;
    }
    *failed = lease.status();
    return true;
  }
  job.lease.memory = *std::move(lease);
  job.lease.held = &leased_jobs_;
  job.lease.returned = &leases_returned_;
  leased_jobs_.fetch_add(1);
  return true;
}

ModelSessionInfo GenerationEngine::Describe(const Session& s) const {
  return ModelSessionInfo{s.id, s.model->name(), s.position,
                          s.model->state_bytes()};
}

absl::StatusOr<ModelSessionInfo> GenerationEngine::CreateSession(
    const std::string& model_name, const std::string& session_id) {
  auto model = FindModel(model_name);
  if (!model.ok()) return model.status();
  std::lock_guard<std::mutex> lock(mu_);
  auto id = NewId(session_id);
  if (!id.ok()) return id.status();
  if (absl::Status s = Admit(**model); !s.ok()) return s;
  auto session = std::make_unique<Session>();
  session->id = *id;
  session->model = *model;
  try {
    session->state = (*model)->NewState();
  } catch (const std::bad_alloc&) {
    budget_->Give((*model)->state_bytes());
    return absl::ResourceExhaustedError(absl::StrCat("memory: allocating ",
                                                     (*model)->state_bytes(),
                                                     " bytes of state failed"));
  }
  ModelSessionInfo info = Describe(*session);
  sessions_.emplace(*id, std::move(session));
  return info;
}

absl::StatusOr<ModelSessionInfo> GenerationEngine::GetSession(
    const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    return NoSuchSession(id);
  }
  return Describe(*it->second);
}

std::vector<ModelSessionInfo> GenerationEngine::ListSessions() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ModelSessionInfo> out;
  for (const auto& [id, s] : sessions_) out.push_back(Describe(*s));
  return out;
}

void GenerationEngine::Enqueue(const std::string& id, std::unique_ptr<Job> job,
                               const std::function<void(absl::Status)>& fail) {
  absl::Status error;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) {
      error = NoSuchSession(id);
    } else if (stopping_) {
      error = absl::UnavailableError("the server is stopping");
    } else {
      static std::atomic<uint64_t> next_seq{0};
      job->seq = next_seq++;
      it->second->last_used = std::chrono::steady_clock::now();
      it->second->jobs.push_back(std::move(job));
    }
  }
  if (!error.ok()) {
    fail(error);
    return;
  }
  wake_.notify_one();
}

void GenerationEngine::Append(const std::string& id,
                              std::vector<int32_t> tokens, InfoCallback done,
                              CallLiveness caller) {
  auto model = ModelOf(id);
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
  job->on_info = done;
  job->caller = std::move(caller);
  Enqueue(id, std::move(job), [&](absl::Status s) { done(s); });
}

void GenerationEngine::Generate(const std::string& id,
                                std::vector<int32_t> prompt,
                                SamplingParams params, EventCallback on_event,
                                std::shared_ptr<GenerateControl> control) {
  auto fail = [&](absl::Status s) {
    GenerateEvent e;
    e.finished = true;
    e.status = std::move(s);
    on_event(e);
  };
  auto model = ModelOf(id);
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
  job->on_event = on_event;
  job->control =
      control ? std::move(control) : std::make_shared<GenerateControl>();
  Enqueue(id, std::move(job), fail);
}

void GenerationEngine::Cancel(GenerateControl& control) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    control.cancelled_.store(true);
  }
  wake_.notify_one();
}

void GenerationEngine::Delivered(GenerateControl& control) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    control.delivered_.fetch_add(1);
  }
  wake_.notify_one();
}

void GenerationEngine::AbortGenerations(const absl::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    abort_ = status;
  }
  wake_.notify_one();
}

bool GenerationEngine::Runnable(const Session& s) const {
  if (s.jobs.empty()) return false;
  const Job& job = *s.jobs.front();
  if (!job.active && job.memory_wait == leases_returned_.load() &&
      job.caller.Check().ok() && abort_.ok() &&
      !(job.control != nullptr && job.control->cancelled())) {
    return false;  // waits for a request under way to give memory back
  }
  if (job.kind != Job::Kind::kGenerate || !job.active ||
      !job.control->paced()) {
    return true;
  }
  if (!abort_.ok() || job.control->cancelled()) return true;
  const uint64_t delivered = job.control->delivered();
  if (job.waiting && job.emitted <= delivered) return true;       // its turn
  if (job.done) return !job.waiting && delivered >= job.emitted;  // to end
  return job.completion_tokens <= delivered + 1;  // may compute the next
}

void GenerationEngine::Emit(Job& job, std::function<void()> event,
                            std::vector<std::function<void()>>& callbacks) {
  if (job.control->paced() && job.emitted > job.control->delivered()) {
    job.waiting = std::move(event);  // one message is on its way already
    return;
  }
  callbacks.push_back(std::move(event));
  job.emitted++;
}

void GenerationEngine::EndCancelled(
    Session& s, Job& job, std::vector<std::function<void()>>& callbacks) {
  const uint64_t sampled = job.completion_tokens;
  const uint64_t delivered = job.control->paced()
                                 ? std::min(job.control->delivered(), sampled)
                                 : sampled;
  if (delivered == 0 ||
      (delivered < sampled && job.rollback[delivered % 2].index != delivered)) {
    // Nothing reached the client: as it was. (The second condition cannot
    // hold while pacing keeps sampled ≤ delivered + 2; if it ever did, the
    // start is the one state known to be right.)
    RestoreBackup(s, job);
  } else if (delivered < sampled) {
    // Tokens after the delivered ones were fed: back to the state from
    // before the last delivered one was fed, with it pending again.
    Job::Rollback& r = job.rollback[delivered % 2];
    s.state = std::move(r.state);
    s.pending = r.token;
    s.position = s.state.position() + 1;
  } else {
    // Every sampled token went out; the last is in the context, not fed.
    s.pending = job.done ? s.pending : job.feed.back();
    s.position = s.state.position() + 1;
  }
  if (!job.final_emitted) {  // a request that already ended has said so
    GenerateEvent e;
    e.finished = true;
    e.finish_reason = "cancelled";
    e.status = abort_;
    e.prompt_tokens = job.prompt_tokens;
    e.completion_tokens = delivered;
    e.position = s.position;
    callbacks.push_back([cb = job.on_event, e] { cb(e); });
  }
  s.jobs.pop_front();
}

void GenerationEngine::Fork(const std::string& id, const std::string& new_id,
                            InfoCallback done, CallLiveness caller) {
  auto job = std::make_unique<Job>();
  job->caller = std::move(caller);
  job->kind = Job::Kind::kFork;
  job->new_id = new_id;
  job->on_info = done;
  Enqueue(id, std::move(job), [&](absl::Status s) { done(s); });
}

void GenerationEngine::Snapshot(
    const std::string& id,
    std::function<void(absl::StatusOr<std::string>)> done,
    CallLiveness caller) {
  auto job = std::make_unique<Job>();
  job->caller = std::move(caller);
  job->kind = Job::Kind::kSnapshot;
  job->on_snapshot = done;
  Enqueue(id, std::move(job), [&](absl::Status s) { done(s); });
}

void GenerationEngine::Delete(const std::string& id,
                              std::function<void(absl::Status)> done,
                              CallLiveness caller) {
  {
    // A Generate ahead of the delete is cancelled rather than waited for: a
    // paced one whose client stopped reading would otherwise hold the
    // delete for as long as its stream stays open.
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = sessions_.find(id); it != sessions_.end()) {
      for (const auto& queued : it->second->jobs) {
        if (queued->kind == Job::Kind::kGenerate) {
          queued->control->cancelled_.store(true);
        }
      }
    }
  }
  auto job = std::make_unique<Job>();
  job->kind = Job::Kind::kDelete;
  job->on_delete = done;
  job->caller = std::move(caller);
  Enqueue(id, std::move(job), done);
}

uint64_t GenerationEngine::SnapshotBytes(const Model& model) {
  // Magic, version, fingerprint, name, pending token, layer count; per
  // layer its position and float count, then the floats; CRC.
  return sizeof(kModelSnapshotMagic) + 4 + 8 + 4 + model.name().size() + 4 + 4 +
         16 * uint64_t{model.config().num_hidden_layers} + model.state_bytes() +
         4;
}

absl::StatusOr<ModelSessionInfo> GenerationEngine::Restore(
    const std::string& bytes, const std::string& session_id) {
  auto bad = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("state: ", what));
  };
  absl::string_view in(bytes);
  if (in.size() < sizeof(kModelSnapshotMagic) + 4 ||
      std::memcmp(in.data(), kModelSnapshotMagic,
                  sizeof(kModelSnapshotMagic)) != 0) {
    return bad("not a linattn model-session snapshot");
  }
  const uint32_t stored_crc = [&] {
    uint32_t c;
    std::memcpy(&c, in.data() + in.size() - 4, 4);
    return c;
  }();
  if (Crc32(in.substr(0, in.size() - 4)) != stored_crc) {
    return absl::DataLossError(
        "state: snapshot checksum mismatch (truncated or altered)");
  }
  in = in.substr(sizeof(kModelSnapshotMagic),
                 in.size() - sizeof(kModelSnapshotMagic) - 4);
  uint32_t version = 0, name_len = 0, layers = 0;
  uint64_t fingerprint = 0;
  int32_t pending = -1;
  if (!Get(in, &version)) return bad("truncated");
  if (version != kModelSnapshotVersion) {
    return bad(absl::StrCat("version ", version, " is not supported (",
                            kModelSnapshotVersion, ")"));
  }
  if (!Get(in, &fingerprint) || !Get(in, &name_len) || in.size() < name_len) {
    return bad("truncated");
  }
  std::string name(in.substr(0, name_len));
  in.remove_prefix(name_len);
  if (!Get(in, &pending) || !Get(in, &layers)) return bad("truncated");
  std::shared_ptr<const Model> model;
  for (const auto& m : models_) {
    if (m->name() == name) model = m;
  }
  if (model == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "state: the snapshot is of model '", name, "', which is not loaded"));
  }
  if (model->fingerprint() != fingerprint) {
    return absl::FailedPreconditionError(absl::StrCat(
        "state: the snapshot was taken with a different '", name,
        "' (fingerprint ", absl::Hex(fingerprint, absl::kZeroPad16),
        ", loaded ", model->fingerprint_hex(), ")"));
  }
  ModelState state = model->NewState();
  if (layers != state.layers().size()) return bad("layer count mismatch");
  for (AttentionState& layer : state.layers()) {
    uint64_t position = 0, floats = 0;
    if (!Get(in, &position) || !Get(in, &floats)) return bad("truncated");
    if (floats != layer.size() || in.size() < floats * sizeof(float)) {
      return bad("state size mismatch");
    }
    std::memcpy(layer.data(), in.data(), floats * sizeof(float));
    in.remove_prefix(floats * sizeof(float));
    layer.set_position(position);
  }
  if (!in.empty()) return bad("trailing bytes");
  // A checksum is not a seal: the contents must be a session's too.
  for (const AttentionState& layer : state.layers()) {
    if (layer.position() != state.position()) {
      return bad("layers at different positions");
    }
    LINATTN_RETURN_IF_ERROR(CheckRestoredState(
        layer, model->config().features_nonnegative(), 0, "snapshot"));
  }
  if (pending < -1 || (pending >= 0 && static_cast<uint32_t>(pending) >=
                                           model->config().vocab_size)) {
    return bad("pending token out of range");
  }
  if (pending == -1 && state.position() > 0) {
    // Every context that has tokens ends with one not yet fed.
    return bad("has tokens in its state but no pending token");
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto id = NewId(session_id);
  if (!id.ok()) return id.status();
  if (absl::Status s = Admit(*model); !s.ok()) return s;
  auto session = std::make_unique<Session>();
  session->id = *id;
  session->model = model;
  session->state = std::move(state);
  if (pending >= 0) session->pending = pending;
  session->position = session->state.position() + (session->pending ? 1 : 0);
  ModelSessionInfo info = Describe(*session);
  sessions_.emplace(*id, std::move(session));
  return info;
}

GenerationStats GenerationEngine::stats() const {
  return GenerationStats{.appends = appends_.load(),
                         .generates = generates_.load(),
                         .prompt_tokens = prompt_tokens_.load(),
                         .generated_tokens = generated_tokens_.load(),
                         .iterations = iterations_.load()};
}

size_t GenerationEngine::EvictIdle(std::chrono::milliseconds ttl) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  size_t evicted = 0;
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    const Session& s = *it->second;
    if (s.jobs.empty() && now - s.last_used > ttl) {
      auto gone = it++;
      Remove(gone);
      ++evicted;
    } else {
      ++it;
    }
  }
  return evicted;
}

void GenerationEngine::WorkerLoop() {
  std::vector<std::function<void()>> callbacks;
  const int max_threads = omp_get_max_threads();
  for (;;) {
    Batch batch;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Nothing signals a caller that goes away (a deadline passing, a
      // unary call cancelled) while its request waits: look again every
      // 100 ms, so that such a request is answered.
      const bool runnable =
          wake_.wait_for(lock, std::chrono::milliseconds(100), [&] {
            if (stopping_) return true;
            for (const auto& [id, s] : sessions_) {
              if (Runnable(*s)) return true;
            }
            return false;
          });
      if (stopping_) return;
      if (!runnable) continue;
      Plan(batch, callbacks);
    }
    for (auto& cb : callbacks) cb();
    callbacks.clear();
    if (batch.total == 0) continue;
    iterations_++;
    uint64_t seen = max_rows_seen_.load();
    while (batch.total > seen &&
           !max_rows_seen_.compare_exchange_weak(seen, batch.total)) {
    }
    omp_set_num_threads(
        batch.total <= options_.single_thread_rows ? 1 : max_threads);
    std::map<const Model*, absl::Status> results;
    for (auto& [model, rows] : batch.rows) {
      std::vector<ForwardItem> items;
      items.reserve(rows.size());
      for (const Batch::Row& r : rows) {
        Job& job = *r.job;
        if (job.kind == Job::Kind::kGenerate && job.control->paced() &&
            job.completion_tokens > 0) {
          // Generated token j is about to join the state (Job::rollback).
          const uint64_t j = job.completion_tokens;
          Job::Rollback& slot = job.rollback[j % 2];
          slot.state.CopyFrom(r.session->state);
          slot.token = job.feed[0];
          slot.index = j;
        }
        const bool last = job.fed + job.take == job.feed.size();
        const bool wants = last && job.kind == Job::Kind::kGenerate;
        if (wants) job.logits.resize(model->config().vocab_size);
        items.push_back(ForwardItem{
            .state = &r.session->state,
            .tokens =
                std::span<const int32_t>(job.feed.data() + job.fed, job.take),
            .logits = wants ? job.logits.data() : nullptr});
      }
      results[model] = runners_.at(model)->Run(items);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [model, rows] : batch.rows) {
        Batch one;
        one.rows[model] = rows;
        Finish(one, results[model], callbacks);
      }
    }
    for (auto& cb : callbacks) cb();
    callbacks.clear();
  }
}

void GenerationEngine::Plan(Batch& batch,
                            std::vector<std::function<void()>>& callbacks) {
  std::vector<Batch::Row> candidates;
  std::vector<std::string> deleted;
  for (auto& [id, sp] : sessions_) {
    Session& s = *sp;
    while (!s.jobs.empty()) {
      Job& job = *s.jobs.front();
      if (absl::Status gone = job.caller.Check(); !gone.ok()) {
        // The caller has gone: what is not committed is dropped. (A
        // Generate's caller going is a cancel, through its control.)
        {
          if (job.active) RestoreBackup(s, job);
          if (job.on_info) {
            callbacks.push_back([cb = job.on_info, gone] { cb(gone); });
          }
          if (job.on_snapshot) {
            callbacks.push_back([cb = job.on_snapshot, gone] { cb(gone); });
          }
          if (job.on_delete) {
            callbacks.push_back([cb = job.on_delete, gone] { cb(gone); });
          }
          s.jobs.pop_front();
          continue;
        }
      }
      if (job.kind == Job::Kind::kFork) {
        auto new_id = NewId(job.new_id, "new_session_id");
        absl::StatusOr<ModelSessionInfo> result;
        if (!new_id.ok()) {
          result = new_id.status();
        } else if (absl::Status a = Admit(*s.model); !a.ok()) {
          result = a;
        } else {
          auto copy = std::make_unique<Session>();
          copy->id = *new_id;
          copy->model = s.model;
          bool copied = true;
          try {
            copy->state = s.state.Copy();
          } catch (const std::bad_alloc&) {
            copied = false;
          }
          if (copied) {
            copy->pending = s.pending;
            copy->position = s.position;
            result = Describe(*copy);
            // Inserting into sessions_ while iterating it is safe for
            // std::map (no iterator is invalidated).
            sessions_.emplace(*new_id, std::move(copy));
          } else {
            budget_->Give(s.model->state_bytes());
            result = absl::ResourceExhaustedError(
                absl::StrCat("memory: allocating ", s.model->state_bytes(),
                             " bytes for the forked state failed"));
          }
        }
        callbacks.push_back([cb = job.on_info, result] { cb(result); });
        s.jobs.pop_front();
        continue;
      }
      if (job.kind == Job::Kind::kSnapshot) {
        std::string out(kModelSnapshotMagic, sizeof(kModelSnapshotMagic));
        Put<uint32_t>(out, kModelSnapshotVersion);
        Put<uint64_t>(out, s.model->fingerprint());
        Put<uint32_t>(out, static_cast<uint32_t>(s.model->name().size()));
        out += s.model->name();
        Put<int32_t>(out, s.pending.value_or(-1));
        Put<uint32_t>(out, static_cast<uint32_t>(s.state.layers().size()));
        for (const AttentionState& layer : s.state.layers()) {
          Put<uint64_t>(out, layer.position());
          Put<uint64_t>(out, layer.size());
          out.append(reinterpret_cast<const char*>(layer.data()),
                     layer.size() * sizeof(float));
        }
        Put<uint32_t>(out, Crc32(out));
        callbacks.push_back(
            [cb = job.on_snapshot, out = std::move(out)] { cb(out); });
        s.jobs.pop_front();
        continue;
      }
      if (job.kind == Job::Kind::kDelete) {
        callbacks.push_back([cb = job.on_delete] { cb(absl::OkStatus()); });
        s.jobs.pop_front();
        // Requests queued behind the delete find no session.
        const absl::Status gone = absl::NotFoundError(
            absl::StrCat("session_id: session '", s.id, "' was deleted"));
        for (auto& rest : s.jobs) {
          if (rest->on_info) {
            callbacks.push_back([cb = rest->on_info, gone] { cb(gone); });
          }
          if (rest->on_snapshot) {
            callbacks.push_back([cb = rest->on_snapshot, gone] { cb(gone); });
          }
          if (rest->on_delete) {
            callbacks.push_back([cb = rest->on_delete, gone] { cb(gone); });
          }
          if (rest->on_event) {
            GenerateEvent e;
            e.finished = true;
            e.status = gone;
            callbacks.push_back([cb = rest->on_event, e] { cb(e); });
          }
        }
        s.jobs.clear();
        deleted.push_back(s.id);
        break;
      }
      // Append or Generate.
      if (!job.active && job.kind == Job::Kind::kGenerate &&
          (!abort_.ok() || job.control->cancelled())) {
        // Ended before it began: nothing to take back.
        GenerateEvent e;
        e.finished = true;
        e.finish_reason = "cancelled";
        e.status = abort_;
        e.position = s.position;
        callbacks.push_back([cb = job.on_event, e] { cb(e); });
        s.jobs.pop_front();
        continue;
      }
      if (!job.active) {
        // Its working copies first: taken from the budget (or waited for),
        // then allocated.
        absl::Status start;
        if (!LeaseWorkingCopies(s, job, &start)) break;  // waits for memory
        if (start.ok()) {
          try {
            job.backup = s.state.Copy();
          } catch (const std::bad_alloc&) {
            start = absl::ResourceExhaustedError(
                "memory: allocating a backup of the session's state failed");
          }
        }
        if (!start.ok()) {
          if (job.on_info) {
            callbacks.push_back([cb = job.on_info, start] { cb(start); });
          } else {
            GenerateEvent e;
            e.finished = true;
            e.status = start;
            callbacks.push_back([cb = job.on_event, e] { cb(e); });
          }
          s.jobs.pop_front();
          continue;
        }
        job.active = true;
        (job.kind == Job::Kind::kAppend ? appends_ : generates_)++;
        prompt_tokens_ += job.input.size();
        job.backup_pending = s.pending;
        job.backup_position = s.position;
        if (s.pending) job.feed.push_back(*s.pending);
        job.feed.insert(job.feed.end(), job.input.begin(), job.input.end());
        s.pending.reset();
        if (job.kind == Job::Kind::kAppend) {
          job.final_pending = job.feed.back();
          job.feed.pop_back();
          if (job.feed.empty()) {
            s.pending = job.final_pending;
            s.position = s.state.position() + 1;
            callbacks.push_back(
                [cb = job.on_info, info = Describe(s)] { cb(info); });
            s.jobs.pop_front();
            continue;
          }
        } else {
          job.prompt_tokens = job.input.size();
          job.sampler = std::make_unique<Sampler>(job.params);
          if (job.feed.empty()) {
            const auto& bos = s.model->config().bos_token_id;
            if (!bos) {
              s.pending = job.backup_pending;
              GenerateEvent e;
              e.finished = true;
              e.status = absl::InvalidArgumentError(
                  "prompt: empty, the session has no context, and the model "
                  "has no bos_token_id to start from");
              callbacks.push_back([cb = job.on_event, e] { cb(e); });
              s.jobs.pop_front();
              continue;
            }
            job.feed.push_back(static_cast<int32_t>(*bos));
          }
        }
      }
      if (job.kind == Job::Kind::kGenerate) {
        if (!abort_.ok() || job.control->cancelled()) {
          EndCancelled(s, job, callbacks);
          continue;
        }
        if (job.waiting && job.emitted <= job.control->delivered()) {
          Emit(job, std::move(job.waiting), callbacks);  // its turn now
          job.waiting = nullptr;
          if (job.done) job.final_emitted = true;
        }
        if (!Runnable(s)) break;  // waits for a delivery
        if (job.done) {           // its final message was delivered
          s.jobs.pop_front();
          continue;
        }
      }
      candidates.push_back(Batch::Row{&s, &job});
      break;
    }
  }
  for (const std::string& id : deleted) Remove(sessions_.find(id));
  // Decode rows first (one token left to feed), oldest request first; then
  // prompts fill what is left of the token budget.
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Batch::Row& a, const Batch::Row& b) {
                     const bool da = a.job->feed.size() - a.job->fed == 1;
                     const bool db = b.job->feed.size() - b.job->fed == 1;
                     if (da != db) return da;
                     return a.job->seq < b.job->seq;
                   });
  uint32_t budget = std::max<uint32_t>(options_.token_budget, 1);
  uint32_t decode_rows = 0;
  std::vector<Batch::Row> prompts;
  for (const Batch::Row& row : candidates) {
    const uint64_t left = row.job->feed.size() - row.job->fed;
    if (left != 1) {
      prompts.push_back(row);
      continue;
    }
    if (budget == 0 || decode_rows == options_.max_batch) continue;
    ++decode_rows;
    row.job->take = 1;
    budget -= 1;
    batch.total += 1;
    batch.rows[row.session->model.get()].push_back(row);
  }
  // Prompts share the rest evenly, the shortest first so that what one
  // leaves goes to the longer ones; with more prompts than rows, the oldest
  // get a row each.
  std::stable_sort(prompts.begin(), prompts.end(),
                   [](const Batch::Row& a, const Batch::Row& b) {
                     return a.job->feed.size() - a.job->fed <
                            b.job->feed.size() - b.job->fed;
                   });
  if (prompts.size() > budget) {
    std::stable_sort(prompts.begin(), prompts.end(),
                     [](const Batch::Row& a, const Batch::Row& b) {
                       return a.job->seq < b.job->seq;
                     });
    prompts.resize(budget);
  }
  for (size_t n = 0; n < prompts.size(); ++n) {
    const Batch::Row& row = prompts[n];
    const uint64_t left = row.job->feed.size() - row.job->fed;
    const uint64_t share = std::max<uint64_t>(1, budget / (prompts.size() - n));
    row.job->take = static_cast<uint32_t>(std::min(left, share));
    budget -= row.job->take;
    batch.total += row.job->take;
    batch.rows[row.session->model.get()].push_back(row);
  }
}

void GenerationEngine::Finish(Batch& batch, const absl::Status& status,
                              std::vector<std::function<void()>>& callbacks) {
  const auto now = std::chrono::steady_clock::now();
  for (auto& [model, rows] : batch.rows) {
    for (const Batch::Row& r : rows) {
      Session& s = *r.session;
      Job& job = *r.job;
      s.last_used = now;
      if (!status.ok()) {
        RestoreBackup(s, job);
        if (job.kind == Job::Kind::kAppend) {
          callbacks.push_back([cb = job.on_info, status] { cb(status); });
        } else {
          GenerateEvent e;
          e.finished = true;
          e.status = status;
          callbacks.push_back([cb = job.on_event, e] { cb(e); });
        }
        s.jobs.pop_front();
        continue;
      }
      job.fed += job.take;
      s.position = s.state.position();
      if (job.fed < job.feed.size()) continue;
      if (job.kind == Job::Kind::kAppend) {
        if (absl::Status gone = job.caller.Check(); !gone.ok()) {
          RestoreBackup(s, job);  // the caller left before the commit
          callbacks.push_back([cb = job.on_info, gone] { cb(gone); });
          s.jobs.pop_front();
          continue;
        }
        s.pending = job.final_pending;
        s.position = s.state.position() + 1;
        callbacks.push_back(
            [cb = job.on_info, info = Describe(s)] { cb(info); });
        s.jobs.pop_front();
        continue;
      }
      auto token = job.sampler->Sample(job.logits);
      if (!token.ok()) {
        RestoreBackup(s, job);
        GenerateEvent e;
        e.finished = true;
        e.status = token.status();
        callbacks.push_back([cb = job.on_event, e] { cb(e); });
        s.jobs.pop_front();
        continue;
      }
      OnToken(s, job, *token, callbacks);
    }
  }
}

void GenerationEngine::OnToken(Session& s, Job& job, const SampledToken& token,
                               std::vector<std::function<void()>>& callbacks) {
  job.completion_tokens++;
  generated_tokens_++;
  GenerateEvent e;
  e.token_id = token.id;
  if (job.params.logprobs) e.logprob = token.logprob;
  std::string reason;
  const auto& eos = s.model->config().eos_token_id;
  if (eos && token.id == *eos) {
    reason = "eos";  // ends the text; its own bytes (if any) are not text
  } else {
    job.held += job.utf8.Push(s.model->tokenizer().TokenBytes(token.id));
  }
  if (reason.empty() && job.completion_tokens == job.params.max_tokens) {
    reason = "length";
  }
  if (!reason.empty()) job.held += job.utf8.Flush();
  // Stop strings: the earliest occurrence ends the text before it.
  size_t stop_at = std::string::npos;
  for (const std::string& stop : job.params.stop) {
    stop_at = std::min(stop_at, job.held.find(stop));
  }
  if (stop_at != std::string::npos) {
    reason = "stop";
    e.text = job.held.substr(0, stop_at);
    job.held.clear();
  } else if (!reason.empty()) {
    e.text = std::move(job.held);
    job.held.clear();
  } else {
    // Send all but a tail that could still become a stop string.
    size_t keep = job.held.size();
    for (const std::string& stop : job.params.stop) {
      for (size_t n = std::min(stop.size() - 1, job.held.size()); n > 0; --n) {
        if (job.held.compare(job.held.size() - n, n, stop, 0, n) == 0) {
          keep = std::min(keep, job.held.size() - n);
          break;
        }
      }
    }
    e.text = job.held.substr(0, keep);
    job.held.erase(0, keep);
  }
  e.prompt_tokens = job.prompt_tokens;
  e.completion_tokens = job.completion_tokens;
  if (reason.empty()) {
    job.feed.assign(1, token.id);
    job.fed = 0;
    e.position = s.state.position() + 1;
    Emit(
        job, [cb = job.on_event, e] { cb(e); }, callbacks);
    return;
  }
  s.pending = token.id;
  s.position = s.state.position() + 1;
  e.position = s.position;
  e.finished = true;
  e.finish_reason = reason;
  job.done = true;
  Emit(
      job, [cb = job.on_event, e] { cb(e); }, callbacks);
  job.final_emitted = !job.waiting;
  // Paced, Plan ends it once the final message is delivered.
  if (!job.control->paced()) s.jobs.pop_front();
}

}  // namespace linattn
