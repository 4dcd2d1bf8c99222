#include "core/session/session_manager.h"

#include <optional>
#include <random>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/session/snapshot.h"
#include "core/util/status_macros.h"

namespace linattn {

absl::StatusOr<std::unique_ptr<SessionManager>> SessionManager::Create(
    const SessionManagerOptions& options) {
  if (options.max_sessions == 0) {
    return absl::InvalidArgumentError("max_sessions: must be at least 1");
  }
  if (!(options.default_epsilon >= 0.0f) ||
      !std::isfinite(options.default_epsilon)) {
    return absl::InvalidArgumentError(
        "default_epsilon: must be finite and >= 0");
  }
  return std::unique_ptr<SessionManager>(new SessionManager(options));
}
absl::StatusOr<std::string> SessionManager::ChooseId(
    absl::string_view requested, absl::string_view field) const {
  return ChooseSessionId(
      requested,
      [this](absl::string_view id) {
        return sessions_.find(id) != sessions_.end();
      },
      field);
}

SessionReservation::SessionReservation(SessionReservation&& other) noexcept
    : manager_(std::exchange(other.manager_, nullptr)),
      kind_(other.kind_),
      owner_(std::move(other.owner_)),
      attention_(std::move(other.attention_)),
      model_(std::move(other.model_)),
      bytes_(other.bytes_) {}

SessionReservation::~SessionReservation() {
  if (manager_ != nullptr) manager_->Release(bytes_, owner_);
}

void SessionManager::Release(uint64_t bytes, const std::string& owner) {
  budget_->Give(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  --reserved_sessions_;
  auto it = usage_.find(owner);
  if (it == usage_.end()) return;
  --it->second.reserved_sessions;
  it->second.reserved_bytes -= bytes;
  if (it->second.sessions == 0 && it->second.reserved_sessions == 0) {
    usage_.erase(it);
  }
}

std::shared_ptr<const Attention> SessionManager::CachedAttention(
    const AttentionSpec& spec) {
  for (auto it = attentions_.begin(); it != attentions_.end();) {
    if (auto shared = it->lock()) {
      if (shared->spec() == spec) return shared;
      ++it;
    } else {
      it = attentions_.erase(it);
    }
  }
  return nullptr;
}

absl::Status SessionManager::Admit(uint64_t charge, uint64_t setup,
                                   absl::string_view requested_id,
                                   absl::string_view id_field,
                                   const std::function<std::string()>& what,
                                   const Tenant& tenant) {
  // A requested id is checked now, so that a taken one costs no setup work
  // (and again when the session is added).
  if (!requested_id.empty()) {
    LINATTN_RETURN_IF_ERROR(ChooseId(requested_id, id_field).status());
  }
  if (sessions_.size() + reserved_sessions_ >= options_.max_sessions) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "sessions: the server holds its maximum of ", options_.max_sessions,
        " (attention and model sessions together)"));
  }
  // The tenant's own quota before the server's memory: a tenant at its
  // quota is told so, whatever the server has left.
  const TenantQuota& quota = tenant.quota();
  TenantUsage held;
  if (auto it = usage_.find(tenant.name()); it != usage_.end()) {
    held = it->second;
  }
  if (quota.max_sessions != 0 &&
      held.sessions + held.reserved_sessions >= quota.max_sessions) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "sessions: tenant '", tenant.name(), "' holds its quota of ",
        quota.max_sessions, " session(s); delete one to make room"));
  }
  if (quota.max_state_bytes != 0 &&
      held.bytes + held.reserved_bytes + charge > quota.max_state_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "memory: tenant '", tenant.name(), "' holds ",
        held.bytes + held.reserved_bytes, " bytes of state of its quota of ",
        quota.max_state_bytes, "; a new session needs ", charge));
  }
  LINATTN_RETURN_IF_ERROR(budget_->Take(charge + setup, what()));
  ++reserved_sessions_;
  TenantUsage& usage = usage_[tenant.name()];
  ++usage.reserved_sessions;
  usage.reserved_bytes += charge;
  return absl::OkStatus();
}

absl::StatusOr<SessionReservation> SessionManager::Reserve(
    const AttentionSpec& spec, absl::string_view requested_id,
    absl::string_view id_field, const Tenant& tenant) {
  LINATTN_RETURN_IF_ERROR(ValidateSpec(spec));
  if (options_.max_message_bytes != 0 &&
      SessionMessageBytes(spec) > options_.max_message_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "spec: a session of this spec has a ", SnapshotBytes(spec),
        "-byte snapshot; with its description that is more than one message "
        "may carry (",
        options_.max_message_bytes,
        " bytes, --max-message-bytes), so its Snapshot and Inspect could not "
        "be answered"));
  }
  const uint64_t charge = SessionChargeBytes(spec);
  std::shared_ptr<const Attention> attention;
  uint64_t setup = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    attention = CachedAttention(spec);
    if (attention == nullptr) setup = FeatureMapSetupBytes(spec);
    LINATTN_RETURN_IF_ERROR(Admit(
        charge, setup, requested_id, id_field,
        [&] {
          return absl::StrCat(
              "spec: a session needs ", StateBytes(spec), " bytes of state",
              FeatureMapBytes(spec) != 0
                  ? absl::StrCat(" and ", FeatureMapBytes(spec),
                                 " of feature map")
                  : "",
              spec.bonus.empty()
                  ? ""
                  : absl::StrCat(" and ", 4 * spec.bonus.size(), " of bonus"),
              setup != 0 ? absl::StrCat(", and ", setup, " more to set it up")
                         : "");
        },
        tenant));
  }
  SessionReservation reservation(this, SessionKind::kAttention, charge,
                                 tenant.name());
  if (attention != nullptr) {
    reservation.attention_ = std::move(attention);
    return reservation;
  }
  // The feature map is prepared without the table lock: FAVOR+'s projection
  // takes up to about a second at the largest accepted dimensions.
  absl::StatusOr<Attention> created = absl::UnknownError("");
  try {
    created = Attention::Create(spec);
  } catch (const std::bad_alloc&) {
    created = absl::ResourceExhaustedError(
        absl::StrCat("memory: allocating the feature map (",
                     FeatureMapBytes(spec), " bytes) failed"));
  }
  budget_->Give(setup);
  if (!created.ok()) return created.status();  // the reservation releases
  std::lock_guard<std::mutex> lock(mu_);
  // Another caller may have prepared the same spec meanwhile: share theirs.
  attention = CachedAttention(spec);
  if (attention == nullptr) {
    attention = std::make_shared<const Attention>(*std::move(created));
    attentions_.push_back(attention);
  }
  reservation.attention_ = std::move(attention);
  return reservation;
}

absl::StatusOr<SessionReservation> SessionManager::Reserve(
    std::shared_ptr<const Model> model, absl::string_view requested_id,
    absl::string_view id_field, const Tenant& tenant, uint64_t position) {
  const uint64_t charge = model->state_bytes_at(position);
  {
    std::lock_guard<std::mutex> lock(mu_);
    LINATTN_RETURN_IF_ERROR(Admit(
        charge, 0, requested_id, id_field,
        [&] {
          return absl::StrCat(
              "memory: a session of '", model->name(), "' needs ", charge,
              " bytes of state",
              model->kv_bytes_at(position) != 0
                  ? absl::StrCat(" (", model->kv_bytes_at(position),
                                 " of them keys and values of ", position,
                                 " positions)")
                  : "");
        },
        tenant));
  }
  SessionReservation reservation(this, SessionKind::kModel, charge,
                                 tenant.name());
  reservation.model_ = std::move(model);
  return reservation;
}

absl::Status SessionManager::Add(SessionReservation& reservation,
                                 std::shared_ptr<Session> session,
                                 absl::string_view id_field) {
  std::lock_guard<std::mutex> lock(mu_);
  LINATTN_RETURN_IF_ERROR(ChooseId(session->id(), id_field).status());
  session->observer_ = options_.observer;
  reservation.manager_ = nullptr;  // its bytes stay taken, as the session's
  --reserved_sessions_;
  session->charged_bytes_.store(reservation.bytes_, std::memory_order_release);
  TenantUsage& usage = usage_[session->owner()];
  --usage.reserved_sessions;
  usage.reserved_bytes -= reservation.bytes_;
  ++usage.sessions;
  usage.bytes += reservation.bytes_;
  bytes_in_use_ += reservation.bytes_;
  sessions_.emplace(session->id(), session);
  // Under the lock: nothing can find the session before the observer hears
  // of it.
  if (options_.observer != nullptr) options_.observer->OnCreated(session);
  return absl::OkStatus();
}

void SessionManager::Remove(
    std::map<std::string, std::shared_ptr<Session>, std::less<>>::iterator it,
    SessionObserver::Removal why) {
  const std::shared_ptr<Session> session = std::move(it->second);
  sessions_.erase(it);
  bytes_in_use_ -= session->charged_bytes();
  if (auto u = usage_.find(session->owner()); u != usage_.end()) {
    --u->second.sessions;
    u->second.bytes -= session->charged_bytes();
    if (u->second.sessions == 0 && u->second.reserved_sessions == 0) {
      usage_.erase(u);
    }
  }
  budget_->Give(session->charged_bytes());
  if (options_.observer == nullptr) return;
  std::lock_guard<std::mutex> notify(session->notify_mu_);
  session->removed_ = true;
  options_.observer->OnRemoved(*session, why);
}

namespace {

// The id a committed session gets: the requested one, or a random one not
// yet taken (checked again, under the lock, when it is added).
std::string IdFor(absl::string_view requested) {
  return requested.empty() ? RandomSessionId() : std::string(requested);
}

}  // namespace

absl::StatusOr<std::shared_ptr<AttentionSession>> SessionManager::Commit(
    SessionReservation reservation, AttentionState state,
    absl::string_view requested_id, absl::string_view id_field) {
  if (reservation.manager_ != this ||
      reservation.kind_ != SessionKind::kAttention) {
    return absl::InvalidArgumentError(
        "reservation: not an attention session's in this table");
  }
  if (!state.Matches(reservation.attention_->spec())) {
    return absl::InvalidArgumentError("state: does not match its spec");
  }
  for (;;) {
    auto session = std::make_shared<AttentionSession>(
        IdFor(requested_id), reservation.owner_, reservation.attention_,
        std::move(state));
    absl::Status added = Add(reservation, session, id_field);
    if (added.ok()) return session;
    // A random id taken meanwhile (2^-128): draw another.
    if (!requested_id.empty() || !absl::IsAlreadyExists(added)) return added;
    state = std::move(session->state());
  }
}

absl::StatusOr<std::shared_ptr<ModelSession>> SessionManager::Commit(
    SessionReservation reservation, ModelState state,
    std::optional<int32_t> pending, SamplerPosition sampler,
    absl::string_view requested_id, absl::string_view id_field) {
  if (reservation.manager_ != this ||
      reservation.kind_ != SessionKind::kModel) {
    return absl::InvalidArgumentError(
        "reservation: not a model session's in this table");
  }
  if (!reservation.model_->Matches(state)) {
    return absl::InvalidArgumentError("state: does not match its model");
  }
  for (;;) {
    auto session = std::make_shared<ModelSession>(
        IdFor(requested_id), reservation.owner_, reservation.model_,
        std::move(state), pending, sampler);
    absl::Status added = Add(reservation, session, id_field);
    if (added.ok()) return session;
    if (!requested_id.empty() || !absl::IsAlreadyExists(added)) return added;
    state = std::move(session->state());
  }
}

absl::StatusOr<std::shared_ptr<AttentionSession>> SessionManager::CreateSession(
    AttentionSpec spec, std::optional<float> epsilon,
    absl::string_view requested_id, const Tenant& tenant) {
  // The gated and delta rules have no denominator: the server's default ε
  // is the linear rule's.
  spec.epsilon = epsilon.value_or(
      spec.rule == UpdateRule::kLinear ? options_.default_epsilon : 0.0f);
  if (absl::Status s = ValidateSpec(spec); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("spec.", s.message()));
  }
  // Admission before allocation: every size is known from the spec.
  LINATTN_ASSIGN_OR_RETURN(SessionReservation reservation,
                           Reserve(spec, requested_id, "session_id", tenant));
  std::optional<AttentionState> state;
  try {
    state.emplace(spec);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "memory: allocating ", StateBytes(spec), " bytes of state failed"));
  }
  return Commit(std::move(reservation), *std::move(state), requested_id);
}

absl::StatusOr<std::shared_ptr<AttentionSession>> SessionManager::AdoptSession(
    const AttentionSpec& spec, AttentionState state,
    absl::string_view requested_id, absl::string_view id_field,
    const Tenant& tenant) {
  if (!state.Matches(spec)) {
    return absl::InvalidArgumentError("state: does not match its spec");
  }
  LINATTN_ASSIGN_OR_RETURN(SessionReservation reservation,
                           Reserve(spec, requested_id, id_field, tenant));
  return Commit(std::move(reservation), std::move(state), requested_id,
                id_field);
}

absl::StatusOr<std::shared_ptr<AttentionSession>> SessionManager::ForkSession(
    const AttentionSession& parent, absl::string_view requested_id,
    absl::string_view id_field, const Tenant& tenant) {
  LINATTN_ASSIGN_OR_RETURN(
      SessionReservation reservation,
      Reserve(parent.spec(), requested_id, id_field, tenant));
  std::optional<AttentionState> copy;
  try {
    copy.emplace(parent.state().Copy());
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("memory: allocating ", parent.state_bytes(),
                     " bytes for the forked state failed"));
  }
  return Commit(std::move(reservation), *std::move(copy), requested_id,
                id_field);
}

absl::StatusOr<std::shared_ptr<ModelSession>>
SessionManager::CreateModelSession(std::shared_ptr<const Model> model,
                                   absl::string_view requested_id,
                                   const Tenant& tenant) {
  LINATTN_ASSIGN_OR_RETURN(SessionReservation reservation,
                           Reserve(model, requested_id, "session_id", tenant));
  ModelState state;
  try {
    state = model->NewState();
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "memory: allocating ", model->state_bytes(), " bytes of state failed"));
  }
  return Commit(std::move(reservation), std::move(state), std::nullopt,
                SamplerPosition{}, requested_id);
}

absl::StatusOr<std::shared_ptr<ModelSession>> SessionManager::AdoptModelSession(
    std::shared_ptr<const Model> model, ModelState state,
    std::optional<int32_t> pending, SamplerPosition sampler,
    absl::string_view requested_id, absl::string_view id_field,
    const Tenant& tenant) {
  const uint64_t position = state.position();
  LINATTN_ASSIGN_OR_RETURN(
      SessionReservation reservation,
      Reserve(std::move(model), requested_id, id_field, tenant, position));
  return Commit(std::move(reservation), std::move(state), pending, sampler,
                requested_id, id_field);
}

absl::StatusOr<std::shared_ptr<ModelSession>> SessionManager::ForkModelSession(
    const ModelSession& parent, absl::string_view requested_id,
    absl::string_view id_field, const Tenant& tenant) {
  return ForkModelSession(
      parent,
      ModelContextRef{parent.state(), parent.pending_token(), parent.sampler()},
      requested_id, id_field, tenant);
}

absl::StatusOr<std::shared_ptr<ModelSession>> SessionManager::ForkModelSession(
    const ModelSession& parent, const ModelContextRef& context,
    absl::string_view requested_id, absl::string_view id_field,
    const Tenant& tenant) {
  LINATTN_ASSIGN_OR_RETURN(SessionReservation reservation,
                           Reserve(parent.shared_model(), requested_id,
                                   id_field, tenant, context.state.position()));
  ModelState copy;
  try {
    copy = context.state.Copy();
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("memory: allocating ", parent.state_bytes(),
                     " bytes for the forked state failed"));
  }
  return Commit(std::move(reservation), std::move(copy), context.pending,
                context.sampler, requested_id, id_field);
}

absl::Status SessionManager::Recharge(Session& session, uint64_t bytes,
                                      const Tenant& tenant,
                                      const std::function<std::string()>& what,
                                      bool* budget_short) {
  if (budget_short != nullptr) *budget_short = false;
  if (bytes == session.charged_bytes()) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t charged = session.charged_bytes();
  auto it = sessions_.find(session.id());
  if (it == sessions_.end() || it->second.get() != &session) {
    if (bytes <= charged) return absl::OkStatus();
    return absl::NotFoundError(absl::StrCat(
        "session_id: session '", session.id(), "' is no longer held"));
  }
  TenantUsage& usage = usage_[session.owner()];
  if (bytes < charged) {
    const uint64_t freed = charged - bytes;
    usage.bytes -= freed;
    bytes_in_use_ -= freed;
    session.charged_bytes_.store(bytes, std::memory_order_release);
    budget_->Give(freed);
    return absl::OkStatus();
  }
  const uint64_t more = bytes - charged;
  // As Admit: the owner's quota, then the server's memory.
  const TenantQuota& quota = tenant.quota();
  if (tenant.name() == session.owner() && quota.max_state_bytes != 0 &&
      usage.bytes + usage.reserved_bytes + more > quota.max_state_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what(), "; tenant '", tenant.name(), "' holds ",
        usage.bytes + usage.reserved_bytes, " bytes of state of its quota of ",
        quota.max_state_bytes));
  }
  if (absl::Status taken = budget_->Take(more, what()); !taken.ok()) {
    if (budget_short != nullptr) *budget_short = true;
    return taken;
  }
  usage.bytes += more;
  bytes_in_use_ += more;
  session.charged_bytes_.store(bytes, std::memory_order_release);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Session>> SessionManager::Find(
    absl::string_view id, SessionKind kind, const Tenant& tenant) const {
  auto it = sessions_.find(id);
  // Another tenant's session is answered as no session at all: not even
  // its kind is told.
  if (it == sessions_.end() || !tenant.Sees(it->second->owner())) {
    return NoSuchSession(id);
  }
  if (it->second->kind() != kind) {
    return absl::NotFoundError(absl::StrCat(
        "session_id: '", id, "' is a ", SessionKindName(it->second->kind()),
        " session (",
        it->second->kind() == SessionKind::kModel ? "GenerationService"
                                                  : "AttentionService",
        "), not ", kind == SessionKind::kModel ? "a model" : "an attention",
        " session"));
  }
  return it->second;
}

absl::Status SessionManager::Consult(absl::string_view id) const {
  if (gate_ == nullptr) return absl::OkStatus();
  std::shared_ptr<Session> found;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(id);
    if (it != sessions_.end()) found = it->second;
  }
  if (found != nullptr) {
    if (gate_->Confirm(*found).ok()) return absl::OkStatus();
    found.reset();
  }
  const absl::Status s = gate_->Claim(id);
  return absl::IsNotFound(s) ? absl::OkStatus() : s;
}

bool SessionManager::Contains(absl::string_view id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return sessions_.find(id) != sessions_.end();
}

bool SessionManager::HandOver(absl::string_view id, uint64_t incarnation) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second->incarnation() != incarnation) {
    return false;
  }
  Remove(it, SessionObserver::Removal::kHandedOver);
  return true;
}

absl::StatusOr<std::shared_ptr<AttentionSession>> SessionManager::FindAttention(
    absl::string_view id, const Tenant& tenant) const {
  LINATTN_RETURN_IF_ERROR(Consult(id));
  std::lock_guard<std::mutex> lock(mu_);
  LINATTN_ASSIGN_OR_RETURN(std::shared_ptr<Session> s,
                           Find(id, SessionKind::kAttention, tenant));
  return std::static_pointer_cast<AttentionSession>(std::move(s));
}

absl::StatusOr<std::shared_ptr<ModelSession>> SessionManager::FindModel(
    absl::string_view id, const Tenant& tenant) const {
  LINATTN_RETURN_IF_ERROR(Consult(id));
  std::lock_guard<std::mutex> lock(mu_);
  LINATTN_ASSIGN_OR_RETURN(std::shared_ptr<Session> s,
                           Find(id, SessionKind::kModel, tenant));
  return std::static_pointer_cast<ModelSession>(std::move(s));
}

absl::StatusOr<std::shared_ptr<ModelSession>> SessionManager::AcquireModel(
    absl::string_view id, const Tenant& tenant) {
  LINATTN_RETURN_IF_ERROR(Consult(id));
  std::lock_guard<std::mutex> lock(mu_);
  LINATTN_ASSIGN_OR_RETURN(std::shared_ptr<Session> s,
                           Find(id, SessionKind::kModel, tenant));
  s->pending().fetch_add(1);
  s->Touch();
  return std::static_pointer_cast<ModelSession>(std::move(s));
}

absl::Status SessionManager::Delete(absl::string_view id, SessionKind kind,
                                    const Tenant& tenant) {
  LINATTN_RETURN_IF_ERROR(Consult(id));
  std::lock_guard<std::mutex> lock(mu_);
  LINATTN_RETURN_IF_ERROR(Find(id, kind, tenant).status());
  Remove(sessions_.find(id), SessionObserver::Removal::kDeleted);
  return absl::OkStatus();
}

std::vector<std::shared_ptr<Session>> SessionManager::List(
    SessionKind kind, const Tenant& tenant) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<Session>> out;
  for (const auto& [id, session] : sessions_) {
    if (session->kind() == kind && tenant.Sees(session->owner())) {
      out.push_back(session);
    }
  }
  return out;
}

SessionManager::Evicted SessionManager::EvictIdle(Clock::duration ttl) {
  const Clock::time_point cutoff = Clock::now() - ttl;
  Evicted evicted;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    const Session& s = *it->second;
    if (s.pending_count() == 0 && s.last_used() < cutoff) {
      ++(s.kind() == SessionKind::kAttention ? evicted.attention
                                             : evicted.model);
      Remove(it++, SessionObserver::Removal::kEvicted);
    } else {
      ++it;
    }
  }
  return evicted;
}

uint64_t SessionManager::session_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sessions_.size();
}

SessionManager::TenantUsage SessionManager::UsageOf(
    absl::string_view tenant) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = usage_.find(tenant);
  return it == usage_.end() ? TenantUsage{} : it->second;
}

size_t SessionManager::tenant_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [name, usage] : usage_) n += usage.sessions != 0 ? 1 : 0;
  return n;
}

uint64_t SessionManager::state_bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_in_use_;
}

}  // namespace linattn
