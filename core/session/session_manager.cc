#include "core/session/session_manager.h"

#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/util/status_macros.h"

namespace linattn {

std::string RandomSessionId() {
  std::random_device rd;
  std::string id;
  for (int i = 0; i < 4; ++i)
    absl::StrAppend(&id, absl::Hex(rd(), absl::kZeroPad8));
  return id;
}

bool IsValidSessionId(absl::string_view id) {
  if (id.empty() || id.size() > kMaxSessionIdLength) return false;
  for (char c : id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' &&
        c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

Session::Session(std::string id, std::shared_ptr<const Attention> attention,
                 AttentionState state)
    : id_(std::move(id)),
      attention_(std::move(attention)),
      state_bytes_(state.bytes()),
      state_(std::move(state)) {
  Publish();
}

void Session::Publish() {
  position_.store(state_.position(), std::memory_order_release);
  Touch();
}

SessionInfo DescribeSession(const Session& session) {
  const auto idle = Clock::now() - session.last_used();
  return {session.id(),
          session.spec(),
          session.position(),
          session.state_bytes(),
          session.attention().feature_dim(),
          static_cast<uint64_t>(std::max<int64_t>(
              0, std::chrono::duration_cast<std::chrono::milliseconds>(idle)
                     .count()))};
}

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

absl::StatusOr<std::string> ChooseSessionId(
    absl::string_view requested,
    const std::function<bool(absl::string_view)>& taken,
    absl::string_view field) {
  if (requested.empty()) {
    std::string id;
    do {
      id = RandomSessionId();
    } while (taken(id));
    return id;
  }
  if (!IsValidSessionId(requested)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": must be 1-", kMaxSessionIdLength,
                     " characters of [A-Za-z0-9._-]"));
  }
  if (taken(requested)) {
    return absl::AlreadyExistsError(
        absl::StrCat(field, ": '", requested, "' already exists"));
  }
  return std::string(requested);
}

absl::Status NoSuchSession(absl::string_view id, absl::string_view field) {
  if (!IsValidSessionId(id)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": not a session id (", id.size(), " bytes; ids are 1-",
        kMaxSessionIdLength, " characters of [A-Za-z0-9._-])"));
  }
  return absl::NotFoundError(absl::StrCat(field, ": no session '", id, "'"));
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

absl::StatusOr<std::shared_ptr<const Attention>> SessionManager::AttentionFor(
    const AttentionSpec& spec) {
  for (auto it = attentions_.begin(); it != attentions_.end();) {
    if (auto shared = it->lock()) {
      if (shared->spec() == spec) return shared;
      ++it;
    } else {
      it = attentions_.erase(it);
    }
  }
  LINATTN_ASSIGN_OR_RETURN(Attention attention, Attention::Create(spec));
  auto shared = std::make_shared<const Attention>(std::move(attention));
  attentions_.push_back(shared);
  return shared;
}

absl::StatusOr<std::shared_ptr<Session>> SessionManager::CreateSession(
    AttentionSpec spec, std::optional<float> epsilon,
    absl::string_view requested_id) {
  spec.epsilon = epsilon.value_or(options_.default_epsilon);
  if (absl::Status s = ValidateSpec(spec); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("spec.", s.message()));
  }
  // Admission before allocation: the state size is known from the spec.
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (sessions_.size() >= options_.max_sessions) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "sessions: the server holds its maximum of ", options_.max_sessions));
    }
    if (bytes_in_use_ + StateBytes(spec) > options_.max_state_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "spec: a session needs ", StateBytes(spec), " bytes of state; ",
          options_.max_state_bytes - bytes_in_use_, " of ",
          options_.max_state_bytes, " remain"));
    }
  }
  return AdoptSession(spec, AttentionState(spec), requested_id);
}

absl::StatusOr<std::shared_ptr<Session>> SessionManager::AdoptSession(
    const AttentionSpec& spec, AttentionState state,
    absl::string_view requested_id, absl::string_view id_field) {
  LINATTN_RETURN_IF_ERROR(ValidateSpec(spec));
  if (!state.Matches(spec)) {
    return absl::InvalidArgumentError("state: does not match its spec");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (sessions_.size() >= options_.max_sessions) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "sessions: the server holds its maximum of ", options_.max_sessions));
  }
  if (bytes_in_use_ + state.bytes() > options_.max_state_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "state: ", state.bytes(),
        " bytes would exceed the state memory limit of ",
        options_.max_state_bytes, " (", bytes_in_use_, " in use)"));
  }
  LINATTN_ASSIGN_OR_RETURN(std::string id, ChooseId(requested_id, id_field));
  LINATTN_ASSIGN_OR_RETURN(std::shared_ptr<const Attention> attention,
                           AttentionFor(spec));
  auto session =
      std::make_shared<Session>(id, std::move(attention), std::move(state));
  bytes_in_use_ += session->state_bytes();
  sessions_.emplace(std::move(id), session);
  return session;
}

absl::StatusOr<std::shared_ptr<Session>> SessionManager::Find(
    absl::string_view id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    return NoSuchSession(id);
  }
  return it->second;
}

absl::Status SessionManager::Delete(absl::string_view id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    return NoSuchSession(id);
  }
  bytes_in_use_ -= it->second->state_bytes();
  sessions_.erase(it);
  return absl::OkStatus();
}

std::vector<std::shared_ptr<Session>> SessionManager::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<Session>> out;
  out.reserve(sessions_.size());
  for (const auto& [id, session] : sessions_) out.push_back(session);
  return out;
}

size_t SessionManager::EvictIdle(Clock::duration ttl) {
  const Clock::time_point cutoff = Clock::now() - ttl;
  std::lock_guard<std::mutex> lock(mu_);
  size_t evicted = 0;
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    const Session& s = *it->second;
    if (s.pending_count() == 0 && s.last_used() < cutoff) {
      bytes_in_use_ -= s.state_bytes();
      it = sessions_.erase(it);
      ++evicted;
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

uint64_t SessionManager::state_bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_in_use_;
}

}  // namespace linattn
