// SessionManager: the table of attention sessions — ids, specs, state,
// admission control against exact state sizes, idle eviction, and the
// snapshot/restore/fork entry points.
//
// Threading: the table is guarded by one mutex and safe to call from any
// thread. A session's *state* is not: it is read and written only by the
// Scheduler's worker (core/scheduler), one operation at a time, which is
// what keeps each session's steps in order. Everything a handler may read
// without the worker (position, last use) is mirrored in atomics.
//
//   auto manager = SessionManager::Create({.max_sessions = 1000});
//   auto session = manager->CreateSession(spec, /*requested_id=*/"");
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

namespace linattn {

using Clock = std::chrono::steady_clock;

class Session {
 public:
  Session(std::string id, std::shared_ptr<const Attention> attention,
          AttentionState state);

  const std::string& id() const { return id_; }
  const Attention& attention() const { return *attention_; }
  const AttentionSpec& spec() const { return attention_->spec(); }
  uint64_t state_bytes() const { return state_bytes_; }

  // Worker-only (see the file comment).
  AttentionState& state() { return state_; }
  // Publishes the state's position for readers on other threads and marks
  // the session used. Called by the worker after every operation.
  void Publish();

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

 private:
  const std::string id_;
  const std::shared_ptr<const Attention> attention_;
  const uint64_t state_bytes_;
  AttentionState state_;
  std::atomic<uint64_t> position_{0};
  std::atomic<int64_t> last_used_{0};
  std::atomic<int32_t> pending_{0};
};

struct SessionInfo {
  std::string id;
  AttentionSpec spec;
  uint64_t position = 0;
  uint64_t state_bytes = 0;
  uint32_t feature_dim = 0;
  uint64_t idle_ms = 0;
};
SessionInfo DescribeSession(const Session& session);

struct SessionManagerOptions {
  uint64_t max_sessions = 10'000;
  uint64_t max_state_bytes = uint64_t{4} << 30;  // total over all sessions
  // ε for specs that leave it unset (docs/design.md §1: servers default to
  // 1e-6).
  float default_epsilon = 1e-6f;
};

class SessionManager {
 public:
  static absl::StatusOr<std::unique_ptr<SessionManager>> Create(
      const SessionManagerOptions& options);

  // A new zero session. `requested_id` empty = an unguessable generated id;
  // otherwise 1–128 of [A-Za-z0-9._-], ALREADY_EXISTS if taken. `epsilon`
  // unset in the request is passed as nullopt and resolved here.
  absl::StatusOr<std::shared_ptr<Session>> CreateSession(
      AttentionSpec spec, std::optional<float> epsilon,
      absl::string_view requested_id);
  // A session holding `state` (from a snapshot or a fork): same admission
  // checks; the state's spec must be complete (epsilon resolved).
  // `id_field` names the request field the id came from in errors.
  absl::StatusOr<std::shared_ptr<Session>> AdoptSession(
      const AttentionSpec& spec, AttentionState state,
      absl::string_view requested_id,
      absl::string_view id_field = "session_id");

  absl::StatusOr<std::shared_ptr<Session>> Find(absl::string_view id) const;
  absl::Status Delete(absl::string_view id);
  std::vector<std::shared_ptr<Session>> List() const;

  // Removes sessions unused for longer than `ttl` with no work pending;
  // returns how many.
  size_t EvictIdle(Clock::duration ttl);

  uint64_t session_count() const;
  uint64_t state_bytes_in_use() const;
  const SessionManagerOptions& options() const { return options_; }

 private:
  explicit SessionManager(const SessionManagerOptions& options)
      : options_(options) {}
  absl::StatusOr<std::string> ChooseId(absl::string_view requested,
                                       absl::string_view field) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One Attention per distinct spec, shared by its sessions (FAVOR+'s
  // projection is drawn once).
  absl::StatusOr<std::shared_ptr<const Attention>> AttentionFor(
      const AttentionSpec& spec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SessionManagerOptions options_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Session>, std::less<>> sessions_
      ABSL_GUARDED_BY(mu_);
  uint64_t bytes_in_use_ ABSL_GUARDED_BY(mu_) = 0;
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
