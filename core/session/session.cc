// What both kinds of session are (session_manager.h): ids and their
// checks, the sessions' own state and what they publish, descriptions.
#include <random>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/session/session_manager.h"
#include "core/session/snapshot.h"

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

uint64_t SessionMessageBytes(const AttentionSpec& spec) {
  // An Inspect response holds S, z and the key scales (the snapshot's
  // floats) and the session's description, whose spec repeats the decay;
  // its id, names and numbers take well under 1 KiB.
  return SnapshotBytes(spec) + 1024;
}

uint64_t SessionChargeBytes(const AttentionSpec& spec) {
  return StateBytes(spec) + ParameterBytes(spec);
}

absl::string_view SessionKindName(SessionKind kind) {
  return kind == SessionKind::kAttention ? "attention" : "model";
}

Session::Session(std::string id, SessionKind kind, std::string owner,
                 uint64_t state_bytes, uint64_t charged_bytes)
    : id_(std::move(id)),
      kind_(kind),
      owner_(std::move(owner)),
      state_bytes_(state_bytes),
      charged_bytes_(charged_bytes) {
  Touch();
}

void Session::Publish(uint64_t position, bool stepped) {
  position_.store(position, std::memory_order_release);
  Touch();
  if (stepped && observer_ != nullptr) {
    std::lock_guard<std::mutex> lock(notify_mu_);
    if (!removed_) observer_->OnStepped(*this);
  }
}

AttentionSession::AttentionSession(std::string id, std::string owner,
                                   std::shared_ptr<const Attention> attention,
                                   AttentionState state)
    : Session(std::move(id), SessionKind::kAttention, std::move(owner),
              state.bytes(), state.bytes() + ParameterBytes(attention->spec())),
      attention_(std::move(attention)),
      state_(std::move(state)) {
  Publish();
}

ModelSession::ModelSession(std::string id, std::string owner,
                           std::shared_ptr<const Model> model, ModelState state,
                           std::optional<int32_t> pending,
                           SamplerPosition sampler)
    : Session(std::move(id), SessionKind::kModel, std::move(owner),
              model->state_bytes_at(state.position()),
              model->state_bytes_at(state.position())),
      model_(std::move(model)),
      state_(std::move(state)),
      pending_token_(pending),
      sampler_(sampler) {
  Publish();
}

void ModelSession::Publish(bool stepped) {
  set_state_bytes(model_->state_bytes_at(state_.position()));
  Session::Publish(context_position(), stepped);
}

SessionInfo DescribeSession(const AttentionSession& session) {
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

}  // namespace linattn
