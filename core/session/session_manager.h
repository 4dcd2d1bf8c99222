// SessionManager: the one session table of a server, for both kinds of
// session — attention sessions (a spec and its S/z state) and model
// sessions (a model's per-layer state and pending token). It owns ids (one
// id space), the owner field, admission against one session limit and one
// memory budget with exact state sizes, idle eviction, and the observer
// callbacks a durable store listens to (docs/design.md §2).
//
// Threading: the table is guarded by one mutex and safe to call from any
// thread. A session's *state* is not: it is read and written only on the
// compute worker (core/scheduler), one operation at a time, which is what
// keeps each session's steps in order. Everything a handler may read
// without the worker (position, last use) is mirrored in atomics.
//
//   auto manager = SessionManager::Create({.max_sessions = 1000});
//   auto session = manager->CreateSession(spec, std::nullopt, "");
#ifndef LINATTN_CORE_SESSION_SESSION_MANAGER_H_
#define LINATTN_CORE_SESSION_SESSION_MANAGER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/attention/attention.h"
#include "core/model/model.h"
#include "core/model/sampler.h"
#include "core/session/tenant.h"
#include "core/util/memory_budget.h"

namespace linattn {

using Clock = std::chrono::steady_clock;

enum class SessionKind : uint8_t { kAttention, kModel };
absl::string_view SessionKindName(SessionKind kind);  // "attention", "model"

class SessionObserver;

// What both kinds of session share: the table's view of a session.
class Session {
 public:
  virtual ~Session() = default;
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const std::string& id() const { return id_; }
  SessionKind kind() const { return kind_; }
  // The tenant the session belongs to (core/session/tenant.h): the one
  // whose request created it; "" on a server without API keys.
  const std::string& owner() const { return owner_; }
  // The bytes of its state: fixed for attention sessions; for a model
  // session, Model::state_bytes_at its position (a hybrid's keys and values
  // grow with the context), as of its last Publish.
  uint64_t state_bytes() const {
    return state_bytes_.load(std::memory_order_acquire);
  }
  // What the session is charged against the memory budget: its state plus,
  // for attention sessions, its feature map's parameters (FAVOR+'s
  // projection), counted per session even where sessions of one spec share
  // them. A hybrid model session's charge follows its position: raised
  // before a request appends (SessionManager::Recharge) to cover every
  // position it may reach, lowered to the position reached when it ends.
  // Key/value blocks that forks share copy-on-write are charged to each.
  uint64_t charged_bytes() const {
    return charged_bytes_.load(std::memory_order_acquire);
  }

  // Tokens in the session's context, readable from any thread.
  uint64_t position() const {
    return position_.load(std::memory_order_acquire);
  }
  Clock::time_point last_used() const {
    return Clock::time_point(
        Clock::duration(last_used_.load(std::memory_order_acquire)));
  }
  void Touch() {
    last_used_.store(Clock::now().time_since_epoch().count(),
                     std::memory_order_release);
  }
  // Operations queued or running; an idle session with work pending is not
  // evicted.
  std::atomic<int32_t>& pending() { return pending_; }
  int32_t pending_count() const {
    return pending_.load(std::memory_order_acquire);
  }
  // A number a durable store gives the session when it joins the table,
  // unique among every session the store has recorded (an id can be
  // deleted and taken again; its records are told apart by this). 0 without
  // a store.
  uint64_t incarnation() const {
    return incarnation_.load(std::memory_order_acquire);
  }
  void set_incarnation(uint64_t incarnation) {
    incarnation_.store(incarnation, std::memory_order_release);
  }

 protected:
  Session(std::string id, SessionKind kind, std::string owner,
          uint64_t state_bytes, uint64_t charged_bytes);
  // Publishes `position` for readers on other threads and marks the
  // session used; with `stepped`, tells the table's observer that a
  // committed request changed the session's context.
  void Publish(uint64_t position, bool stepped);
  void set_state_bytes(uint64_t bytes) {
    state_bytes_.store(bytes, std::memory_order_release);
  }

 private:
  friend class SessionManager;
  const std::string id_;
  const SessionKind kind_;
  const std::string owner_;
  std::atomic<uint64_t> state_bytes_;
  // Written under the table's lock (SessionManager).
  std::atomic<uint64_t> charged_bytes_;
  // Set by the table when the session is added. Notifications of one
  // session are ordered by notify_mu_: none follows OnRemoved.
  SessionObserver* observer_ = nullptr;
  std::mutex notify_mu_;
  bool removed_ = false;  // guarded by notify_mu_
  std::atomic<uint64_t> position_{0};
  std::atomic<int64_t> last_used_{0};
  std::atomic<int32_t> pending_{0};
  std::atomic<uint64_t> incarnation_{0};
};

// An attention session: a spec's Attention and its state.
class AttentionSession final : public Session {
 public:
  AttentionSession(std::string id, std::string owner,
                   std::shared_ptr<const Attention> attention,
                   AttentionState state);

  const Attention& attention() const { return *attention_; }
  const AttentionSpec& spec() const { return attention_->spec(); }

  // Worker-only (see the file comment).
  AttentionState& state() { return state_; }
  const AttentionState& state() const { return state_; }
  // Called by the worker after every operation: publishes the position;
  // `stepped` when the operation changed the state.
  void Publish(bool stepped = false) {
    Session::Publish(state_.position(), stepped);
  }

 private:
  const std::shared_ptr<const Attention> attention_;
  AttentionState state_;
};

// A model session: a model's state (S and z per layer) and at most one
// pending token, the last token of the context, which is in the context but
// not yet fed (feeding it produces the logits of the next token).
class ModelSession final : public Session {
 public:
  ModelSession(std::string id, std::string owner,
               std::shared_ptr<const Model> model, ModelState state,
               std::optional<int32_t> pending, SamplerPosition sampler = {});

  const Model& model() const { return *model_; }
  const std::shared_ptr<const Model>& shared_model() const { return model_; }

  // Worker-only (the generation engine's iterations).
  ModelState& state() { return state_; }
  const ModelState& state() const { return state_; }
  std::optional<int32_t>& pending_token() { return pending_token_; }
  std::optional<int32_t> pending_token() const { return pending_token_; }
  SamplerPosition& sampler() { return sampler_; }
  const SamplerPosition& sampler() const { return sampler_; }
  // Tokens in the context: the state's position and the pending token.
  uint64_t context_position() const {
    return state_.position() + (pending_token_.has_value() ? 1 : 0);
  }
  void Publish(bool stepped = false);

 private:
  const std::shared_ptr<const Model> model_;
  ModelState state_;
  std::optional<int32_t> pending_token_;
  SamplerPosition sampler_;
};

// A model session's context at one moment, by reference (what a fork or a
// snapshot copies): its state, its pending token and its random stream.
struct ModelContextRef {
  const ModelState& state;
  std::optional<int32_t> pending;
  SamplerPosition sampler;
};

// What a durable store (or a metrics exporter) hears from the table, in
// order for each session: OnCreated once it is in the table (created,
// restored or forked; no other call about it comes first), OnStepped after
// each committed request that changed its context (on the compute worker,
// before the request's caller hears of it), OnRemoved once it left the
// table (deleted or evicted; nothing about it follows). Calls come from the
// thread that made the change, OnCreated and OnRemoved with the table's
// lock held and OnStepped possibly with the generation engine's: an
// observer must not block and must not call back into the table or the
// services.
class SessionObserver {
 public:
  enum class Removal { kDeleted, kEvicted, kHandedOver };
  virtual ~SessionObserver() = default;
  // The session is shared so that an observer may keep it (a durable
  // store reads its state later, off the table's lock).
  virtual void OnCreated(const std::shared_ptr<Session>& session) = 0;
  virtual void OnStepped(const Session& session) = 0;
  virtual void OnRemoved(const Session& session, Removal why) = 0;
};

// Where sessions live besides this table (replicas sharing a state store,
// docs/design.md §4): the table asks it before it looks a session up by id.
// Calls come from request threads, never under the table's lock; they may
// block (a takeover waits for another replica) and may add sessions to
// the table or remove them.
class SessionGate {
 public:
  virtual ~SessionGate() = default;
  // Session `id` is not in the table: bring it in if it lives elsewhere.
  // OK when the table should be looked at again; NOT_FOUND when no one has
  // it; another status (UNAVAILABLE: its holder did not hand it over in
  // time) fails the lookup.
  virtual absl::Status Claim(absl::string_view id) = 0;
  // Session `session` is in the table: OK if it may be served from here;
  // otherwise the gate has taken it out (another replica owns it now) and
  // the lookup claims it anew.
  virtual absl::Status Confirm(const Session& session) = 0;
};

struct SessionInfo {
  std::string id;
  AttentionSpec spec;
  uint64_t position = 0;
  uint64_t state_bytes = 0;
  uint32_t feature_dim = 0;
  uint64_t idle_ms = 0;
};
SessionInfo DescribeSession(const AttentionSession& session);

struct SessionManagerOptions {
  // Sessions of both kinds together.
  uint64_t max_sessions = 10'000;
  // The memory limit (see MemoryBudget): `budget` when set (a server shares
  // one between the table and the work done on it), else a budget of
  // max_state_bytes of the table's own.
  uint64_t max_state_bytes = uint64_t{4} << 30;
  std::shared_ptr<MemoryBudget> budget;
  // The largest message the server sends (0 = no limit): an attention
  // session whose state could not be sent whole (SessionMessageBytes) is
  // refused at creation rather than accepted and never snapshotted.
  uint64_t max_message_bytes = 0;
  // ε for specs that leave it unset (docs/design.md §1: servers default to
  // 1e-6).
  float default_epsilon = 1e-6f;
  // Told of every session added, stepped and removed; must outlive the
  // table.
  SessionObserver* observer = nullptr;
};

class SessionManager;

// Room in the table held for a session being set up: a slot and its memory
// count against the limits from SessionManager::Reserve() until Commit(),
// or until the reservation is dropped. An attention reservation holds the
// session's prepared Attention (FAVOR+'s projection is drawn in Reserve,
// outside any lock).
class SessionReservation {
 public:
  SessionReservation(SessionReservation&& other) noexcept;
  SessionReservation& operator=(SessionReservation&&) = delete;
  ~SessionReservation();

  SessionKind kind() const { return kind_; }
  uint64_t bytes() const { return bytes_; }

 private:
  friend class SessionManager;
  SessionReservation(SessionManager* manager, SessionKind kind, uint64_t bytes,
                     std::string owner)
      : manager_(manager),
        kind_(kind),
        owner_(std::move(owner)),
        bytes_(bytes) {}

  SessionManager* manager_;  // null once committed or moved from
  SessionKind kind_;
  std::string owner_;  // the tenant the session will belong to
  std::shared_ptr<const Attention> attention_;  // attention sessions
  std::shared_ptr<const Model> model_;          // model sessions
  uint64_t bytes_;
};

// What a session with `spec` is charged (state plus feature map).
uint64_t SessionChargeBytes(const AttentionSpec& spec);
// The largest message that carries a session's whole state: its snapshot,
// or its Inspect response (the same floats, with its description), plus
// framing; at most SnapshotBytes(spec) + 1024.
uint64_t SessionMessageBytes(const AttentionSpec& spec);

// The session table: both kinds of session, one id space, one session
// limit and one memory budget.
class SessionManager {
 public:
  static absl::StatusOr<std::unique_ptr<SessionManager>> Create(
      const SessionManagerOptions& options);

  // Every call that creates a session takes the tenant it will belong to
  // (checked against that tenant's quota, core/session/tenant.h); every
  // lookup takes the tenant asking, and a session it may not see is
  // NOT_FOUND exactly as an id no one holds. The default is the anonymous
  // tenant of a server without keys.

  // --- Attention sessions ---
  // A new zero session. `requested_id` empty = an unguessable generated id;
  // otherwise 1–128 of [A-Za-z0-9._-], ALREADY_EXISTS if taken (by a
  // session of either kind). `epsilon` unset in the request is passed as
  // nullopt and resolved here.
  absl::StatusOr<std::shared_ptr<AttentionSession>> CreateSession(
      AttentionSpec spec, std::optional<float> epsilon,
      absl::string_view requested_id, const Tenant& tenant = {});
  // A session holding `state` (from a snapshot): same admission checks; the
  // state's spec must be complete (epsilon resolved). `id_field` names the
  // request field the id came from in errors.
  absl::StatusOr<std::shared_ptr<AttentionSession>> AdoptSession(
      const AttentionSpec& spec, AttentionState state,
      absl::string_view requested_id, absl::string_view id_field = "session_id",
      const Tenant& tenant = {});
  // A copy of `parent` (its state is read: call where the state may be,
  // i.e. on the compute worker). Room is reserved before the copy is
  // allocated.
  absl::StatusOr<std::shared_ptr<AttentionSession>> ForkSession(
      const AttentionSession& parent, absl::string_view requested_id,
      absl::string_view id_field = "new_session_id", const Tenant& tenant = {});

  // --- Model sessions ---
  // A session of `model` with an empty context.
  absl::StatusOr<std::shared_ptr<ModelSession>> CreateModelSession(
      std::shared_ptr<const Model> model, absl::string_view requested_id,
      const Tenant& tenant = {});
  // A session holding a restored context (`state` of `model`'s shape).
  absl::StatusOr<std::shared_ptr<ModelSession>> AdoptModelSession(
      std::shared_ptr<const Model> model, ModelState state,
      std::optional<int32_t> pending, SamplerPosition sampler,
      absl::string_view requested_id, absl::string_view id_field = "session_id",
      const Tenant& tenant = {});
  // A copy of `parent`'s context (worker-only, as ForkSession).
  absl::StatusOr<std::shared_ptr<ModelSession>> ForkModelSession(
      const ModelSession& parent, absl::string_view requested_id,
      absl::string_view id_field = "new_session_id", const Tenant& tenant = {});
  // A copy of `context`, a context of `parent` other than its live one
  // (what a Generate under way has delivered so far; worker-only).
  absl::StatusOr<std::shared_ptr<ModelSession>> ForkModelSession(
      const ModelSession& parent, const ModelContextRef& context,
      absl::string_view requested_id,
      absl::string_view id_field = "new_session_id", const Tenant& tenant = {});

  // The two halves of the above, for callers that allocate the state
  // themselves: Reserve checks the id (when one is requested), the session
  // count and the memory budget (state, feature map and, while it is
  // prepared, the feature map's setup memory), then prepares the Attention
  // without holding the table lock. RESOURCE_EXHAUSTED names the limit;
  // an allocation that fails is RESOURCE_EXHAUSTED too, never a crash.
  // Commit adds the session with `state` (which must match).
  absl::StatusOr<SessionReservation> Reserve(
      const AttentionSpec& spec, absl::string_view requested_id,
      absl::string_view id_field = "session_id", const Tenant& tenant = {});
  // A model session is charged Model::state_bytes_at(`position`), the
  // position of the state it will hold.
  absl::StatusOr<SessionReservation> Reserve(
      std::shared_ptr<const Model> model, absl::string_view requested_id,
      absl::string_view id_field = "session_id", const Tenant& tenant = {},
      uint64_t position = 0);
  absl::StatusOr<std::shared_ptr<AttentionSession>> Commit(
      SessionReservation reservation, AttentionState state,
      absl::string_view requested_id,
      absl::string_view id_field = "session_id");
  absl::StatusOr<std::shared_ptr<ModelSession>> Commit(
      SessionReservation reservation, ModelState state,
      std::optional<int32_t> pending, SamplerPosition sampler,
      absl::string_view requested_id,
      absl::string_view id_field = "session_id");

  // Sets what `session` (a model session in this table) is charged to
  // `bytes`: more is taken from the budget — and from `tenant`'s quota when
  // it owns the session (an admin's request is held to the budget alone) —
  // or RESOURCE_EXHAUSTED (what() says what needs it) with nothing changed;
  // less is given back. A session no longer in the table is NOT_FOUND when
  // it would grow (it is gone) and left alone when it would shrink.
  // `budget_short` (optional) says whether it was the server's memory, not
  // the tenant's quota, that refused (memory others may give back).
  absl::Status Recharge(Session& session, uint64_t bytes, const Tenant& tenant,
                        const std::function<std::string()>& what,
                        bool* budget_short = nullptr);

  // --- Both kinds ---
  // The session `id` of `kind`; reading it does not count as using it. A
  // session of the other kind is NOT_FOUND too, with a message naming the
  // service it belongs to.
  absl::StatusOr<std::shared_ptr<AttentionSession>> FindAttention(
      absl::string_view id, const Tenant& tenant = {}) const;
  absl::StatusOr<std::shared_ptr<ModelSession>> FindModel(
      absl::string_view id, const Tenant& tenant = {}) const;
  // FindModel for work about to be queued: under the table's lock the
  // session is marked used and its pending() count raised, so idle eviction
  // cannot take it in between. The caller lowers pending() when the work
  // is done.
  absl::StatusOr<std::shared_ptr<ModelSession>> AcquireModel(
      absl::string_view id, const Tenant& tenant = {});
  // Removes the session `id` of `kind` (as FindAttention/FindModel refuse
  // the other kind).
  absl::Status Delete(absl::string_view id, SessionKind kind,
                      const Tenant& tenant = {});
  // The sessions of `kind` that `tenant` sees.
  std::vector<std::shared_ptr<Session>> List(SessionKind kind,
                                             const Tenant& tenant = {}) const;

  // Removes sessions of both kinds unused for longer than `ttl` with no
  // work pending; returns how many of each.
  struct Evicted {
    size_t attention = 0;
    size_t model = 0;
  };
  Evicted EvictIdle(Clock::duration ttl);

  uint64_t session_count() const;
  // What one tenant holds (sessions committed; their charged bytes).
  struct TenantUsage {
    uint64_t sessions = 0;
    uint64_t bytes = 0;
    uint64_t reserved_sessions = 0;  // reservations not yet committed
    uint64_t reserved_bytes = 0;
  };
  TenantUsage UsageOf(absl::string_view tenant) const;
  // Tenants holding at least one session.
  size_t tenant_count() const;
  // Bytes charged by the sessions in the table (see Session::charged_bytes),
  // not counting reservations in progress.
  uint64_t state_bytes_in_use() const;
  const SessionManagerOptions& options() const { return options_; }
  // Whether `id` is in the table (either kind), without asking the gate.
  bool Contains(absl::string_view id) const;
  // Set once, before requests arrive (the gate outlives the table's use).
  void set_gate(SessionGate* gate) { gate_ = gate; }
  // Removes session `id` (of `incarnation`) without it counting as a
  // deletion: the observer hears Removal::kHandedOver (another replica
  // serves it now). False if it is not in the table (as that incarnation).
  bool HandOver(absl::string_view id, uint64_t incarnation);
  MemoryBudget& budget() const { return *budget_; }
  const std::shared_ptr<MemoryBudget>& shared_budget() const { return budget_; }

 private:
  explicit SessionManager(const SessionManagerOptions& options)
      : options_(options),
        budget_(options.budget != nullptr
                    ? options.budget
                    : std::make_shared<MemoryBudget>(options.max_state_bytes)) {
  }
  absl::StatusOr<std::string> ChooseId(absl::string_view requested,
                                       absl::string_view field) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  friend class SessionReservation;
  // Under mu_: the slot and `charge` + `setup` bytes for a new session.
  absl::Status Admit(uint64_t charge, uint64_t setup,
                     absl::string_view requested_id, absl::string_view id_field,
                     const std::function<std::string()>& what,
                     const Tenant& tenant) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds a built session (under its own id) in place of its reservation.
  absl::Status Add(SessionReservation& reservation,
                   std::shared_ptr<Session> session,
                   absl::string_view id_field);
  absl::StatusOr<std::shared_ptr<Session>> Find(absl::string_view id,
                                                SessionKind kind,
                                                const Tenant& tenant) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Under mu_: takes `it` out of the table, gives its memory back and tells
  // the observer.
  void Remove(
      std::map<std::string, std::shared_ptr<Session>, std::less<>>::iterator it,
      SessionObserver::Removal why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The shared Attention of `spec` if one is alive (FAVOR+'s projection is
  // drawn once per distinct spec).
  std::shared_ptr<const Attention> CachedAttention(const AttentionSpec& spec)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Release(uint64_t bytes, const std::string& owner);
  // The gate's say before a lookup of `id` (see SessionGate).
  absl::Status Consult(absl::string_view id) const;

  const SessionManagerOptions options_;
  SessionGate* gate_ = nullptr;
  const std::shared_ptr<MemoryBudget> budget_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Session>, std::less<>> sessions_
      ABSL_GUARDED_BY(mu_);
  uint64_t bytes_in_use_ ABSL_GUARDED_BY(mu_) = 0;
  // Reservations not yet committed (their bytes are taken from budget_).
  uint64_t reserved_sessions_ ABSL_GUARDED_BY(mu_) = 0;
  // Per tenant (entries go when a tenant holds and reserves nothing).
  std::map<std::string, TenantUsage, std::less<>> usage_ ABSL_GUARDED_BY(mu_);
  std::vector<std::weak_ptr<const Attention>> attentions_ ABSL_GUARDED_BY(mu_);
};

// Whether `id` is an acceptable client-chosen session id.
bool IsValidSessionId(absl::string_view id);
inline constexpr size_t kMaxSessionIdLength = 128;

// 128 random bits from the OS, as 32 hex digits.
std::string RandomSessionId();

// The id for a new session: `requested` if it is valid and not `taken`
// (INVALID_ARGUMENT / ALREADY_EXISTS naming `field`), or a random one when
// it is empty.
absl::StatusOr<std::string> ChooseSessionId(
    absl::string_view requested,
    const std::function<bool(absl::string_view)>& taken,
    absl::string_view field = "session_id");

// The error for a session id that names no session: NOT_FOUND quoting the
// id, or INVALID_ARGUMENT when it could not be anyone's id (empty, too long,
// other characters) — such an id is not echoed, so that an 8 KB id cannot
// make the error itself too large for clients to receive.
absl::Status NoSuchSession(absl::string_view id,
                           absl::string_view field = "session_id");

}  // namespace linattn

#endif  // LINATTN_CORE_SESSION_SESSION_MANAGER_H_
