#include "core/session/replayer.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/attention/recurrent.h"
#include "core/session/records.h"
#include "core/session/snapshot.h"
#include "core/util/little_endian.h"
#include "core/util/status_macros.h"

namespace linattn {

// A session as the replay rebuilds it.
struct Replayer::Live {
  SessionKind kind = SessionKind::kAttention;
  uint64_t incarnation = 0;
  uint64_t covered = 0;  // the position its snapshot covers (0: none)
  uint64_t first_needed = 0;
  uint64_t tail_bytes = 0;
  AttentionSpec spec;
  std::shared_ptr<const Attention> attention;  // for replaying steps
  std::optional<AttentionState> state;
  std::shared_ptr<const Model> model;
  std::optional<ModelState> model_state;
  std::optional<int32_t> pending;
  SamplerPosition sampler;
  std::string owner;          // its tenant
  std::vector<int32_t> feed;  // tokens joined, not yet run
};

Replayer::Replayer(std::span<const std::shared_ptr<const Model>> models,
                   ForwardOptions forward, std::string where)
    : models_(models.begin(), models.end()),
      forward_(forward),
      where_(std::move(where)) {}

Replayer::~Replayer() = default;

absl::Status Replayer::Bad(const JournalRecord& rec,
                           absl::string_view why) const {
  return absl::DataLossError(
      absl::StrCat("journal: ", rec.file, " at byte ", rec.offset, ": record ",
                   rec.seq, " (", RecordName(rec.type), ", session '",
                   rec.session_id, "') ", why, "; refusing to start from it"));
}

std::shared_ptr<const Model> Replayer::FindModel(absl::string_view name,
                                                 uint64_t fingerprint) const {
  for (const auto& m : models_) {
    if (m->name() == name && m->fingerprint() == fingerprint) return m;
  }
  return nullptr;
}

absl::StatusOr<std::shared_ptr<const Attention>> Replayer::AttentionOf(
    const AttentionSpec& spec) {
  for (const auto& a : attentions_) {
    if (a->spec() == spec) return a;
  }
  LINATTN_ASSIGN_OR_RETURN(Attention made, Attention::Create(spec));
  attentions_.push_back(std::make_shared<const Attention>(std::move(made)));
  return attentions_.back();
}

absl::Status Replayer::Snapshot(const std::string& id, uint64_t covered,
                                absl::string_view blob,
                                absl::string_view path) {
  auto refuse = [&](const absl::Status& why) {
    return absl::Status(
        why.code() == absl::StatusCode::kFailedPrecondition
            ? why.code()
            : absl::StatusCode::kDataLoss,
        absl::StrCat("snapshot files: ", path, ": ", why.message(),
                     "; refusing to start from it (move it away to start "
                     "without the session)"));
  };
  if (blob.size() < 8 + 16) return refuse(absl::DataLossError("too short"));
  auto r = std::make_unique<Live>();
  r->incarnation = GetLittleEndian<uint64_t>(blob.data());
  blob.remove_prefix(8);
  auto owner = TakeOwnerSection(blob);
  if (!owner.ok()) return refuse(owner.status());
  r->owner = *std::move(owner);
  if (blob.size() < 16) return refuse(absl::DataLossError("too short"));
  const uint32_t kind = GetLittleEndian<uint32_t>(blob.data() + 12);
  if (kind == static_cast<uint32_t>(SnapshotKind::kModelSession)) {
    auto parsed = ParseModelSnapshot(blob, models_);
    if (!parsed.ok()) return refuse(parsed.status());
    r->kind = SessionKind::kModel;
    r->model = parsed->model;
    r->model_state = std::move(parsed->state);
    r->pending = parsed->pending;
    r->sampler = parsed->sampler;
  } else {
    auto parsed = ParseSnapshot(blob);
    if (!parsed.ok()) return refuse(parsed.status());
    r->spec = parsed->spec;
    r->state = std::move(parsed->state);
  }
  r->covered = covered;
  r->first_needed = covered + 1;
  max_incarnation_ = std::max(max_incarnation_, r->incarnation);
  max_covered_ = std::max(max_covered_, covered);
  snapshots_[id] = r->incarnation;
  live_[id] = std::move(r);
  ++report_.snapshot_files;
  return absl::OkStatus();
}

absl::Status Replayer::Apply(JournalRecord& rec) {
  ++report_.records;
  const bool step = rec.type == static_cast<uint8_t>(DurableRecord::kStep) &&
                    rec.payload.size() >= 12;
  const uint32_t count =
      step ? GetLittleEndian<uint32_t>(rec.payload.data() + 8) : 0;
  if (request_steps_ > 0) {
    request_.push_back(std::move(rec));
    // A record inside a request's steps: ApplyRequest names it.
    if (!step || count != 0) return ApplyRequest(request_);
    if (request_.size() < request_steps_) return absl::OkStatus();
    const absl::Status s = ApplyRequest(request_);
    request_.clear();
    request_steps_ = 0;
    return s;
  }
  if (step && count > 1) {
    request_steps_ = count;
    request_.push_back(std::move(rec));
    return absl::OkStatus();
  }
  return ApplyRequest(Records(&rec, 1));
}

void Replayer::Finish(JournalScan& scan) {
  if (request_steps_ > 0) {
    // The last request's steps were not all written: it goes with the torn
    // tail (one write, one segment).
    const JournalRecord& first = request_.front();
    std::error_code ec;
    const uint64_t size = std::filesystem::file_size(first.file, ec);
    scan.dropped_tail_file = first.file;
    scan.dropped_tail_offset = first.offset;
    scan.dropped_tail_bytes = ec ? 1 : size - first.offset;
    scan.next_seq = first.seq;
  }
  report_.dropped_tail_bytes = scan.dropped_tail_bytes;
  report_.dropped_tail_file = scan.dropped_tail_file;
  report_.dropped_tail_offset = scan.dropped_tail_offset;
}

absl::Status Replayer::ApplyRequest(Records records) {
  const JournalRecord& rec = records[0];
  auto body = SplitBody(rec.payload);
  if (!body.ok()) return Bad(rec, body.status().message());
  const uint64_t incarnation = body->incarnation;
  const absl::string_view rest = body->rest;
  max_incarnation_ = std::max(max_incarnation_, incarnation);
  auto it = live_.find(rec.session_id);
  const auto type = static_cast<DurableRecord>(rec.type);
  // The session's snapshot already holds this record. (A step opens a
  // request whose members are looked at one by one.)
  if (it != live_.end() && rec.seq <= it->second->covered &&
      type != DurableRecord::kStep) {
    return absl::OkStatus();
  }
  Live* const mine = it != live_.end() && it->second->incarnation == incarnation
                         ? it->second.get()
                         : nullptr;
  const uint64_t bytes =
      JournalRecordBytes(rec.payload.size(), rec.session_id.size());
  auto refuse = [&](const absl::Status& s) { return Bad(rec, s.message()); };
  bool applied = false;  // (tail bytes and the report count it)
  switch (type) {
    case DurableRecord::kCreate:
    case DurableRecord::kCreateWithState:
    case DurableRecord::kModelCreate:
    case DurableRecord::kModelCreateWithState:
      if (it != live_.end()) return Bad(rec, "creates a session that exists");
      LINATTN_RETURN_IF_ERROR(ApplyCreate(rec, incarnation, rest));
      live_[rec.session_id]->tail_bytes = bytes;
      ++report_.replayed;
      return absl::OkStatus();
    case DurableRecord::kState: {
      if (mine == nullptr || mine->kind != SessionKind::kAttention) break;
      auto parsed = ParseSnapshot(rest);
      if (!parsed.ok()) return refuse(parsed.status());
      if (!(parsed->spec == mine->spec)) {
        return Bad(rec, "holds a state of another spec than its session's");
      }
      mine->state = std::move(parsed->state);
      applied = true;
      break;
    }
    case DurableRecord::kModelState: {
      if (mine == nullptr || mine->kind != SessionKind::kModel) break;
      auto parsed = ParseModelSnapshot(rest, models_);
      if (!parsed.ok()) return refuse(parsed.status());
      if (parsed->model != mine->model) {
        return Bad(rec, "holds a context of another model than its session's");
      }
      mine->feed.clear();  // replaced whole
      mine->model_state = std::move(parsed->state);
      mine->pending = parsed->pending;
      mine->sampler = parsed->sampler;
      applied = true;
      break;
    }
    case DurableRecord::kDelete:
      if (mine == nullptr) break;
      live_.erase(it);
      ++report_.replayed;
      return absl::OkStatus();
    case DurableRecord::kTokens: {
      if (rest.size() % 4 != 0 || rest.empty()) {
        return Bad(rec, "does not hold whole tokens");
      }
      if (mine == nullptr || mine->kind != SessionKind::kModel) break;
      auto tokens = ParseTokens(rest, mine->model->config().vocab_size);
      if (!tokens.ok()) return refuse(tokens.status());
      mine->feed.insert(mine->feed.end(), tokens->begin(), tokens->end());
      applied = true;
      break;
    }
    case DurableRecord::kOwner: {
      auto owner = ParseOwner(rest);
      if (!owner.ok()) return refuse(owner.status());
      if (mine == nullptr) break;
      mine->owner = *std::move(owner);
      applied = true;
      break;
    }
    case DurableRecord::kSampler: {
      auto sampler = ParseSampler(rest);
      if (!sampler.ok()) return refuse(sampler.status());
      if (mine == nullptr || mine->kind != SessionKind::kModel) break;
      mine->sampler = *sampler;
      applied = true;
      break;
    }
    case DurableRecord::kStep:
      return ApplySteps(records);
    default:
      return Bad(rec, "is of a type this server does not know");
  }
  if (applied) {
    mine->tail_bytes += bytes;
    ++report_.replayed;
  }
  return absl::OkStatus();
}

absl::Status Replayer::ApplyCreate(const JournalRecord& rec,
                                   uint64_t incarnation,
                                   absl::string_view rest) {
  auto r = std::make_unique<Live>();
  r->incarnation = incarnation;
  r->first_needed = rec.seq;
  switch (static_cast<DurableRecord>(rec.type)) {
    case DurableRecord::kCreate: {
      auto spec = ParseSpec(rest);
      if (!spec.ok()) return Bad(rec, spec.status().message());
      r->spec = *spec;
      r->state.emplace(r->spec);
      break;
    }
    case DurableRecord::kCreateWithState: {
      auto parsed = ParseSnapshot(rest);
      if (!parsed.ok()) return Bad(rec, parsed.status().message());
      r->spec = parsed->spec;
      r->state = std::move(parsed->state);
      break;
    }
    case DurableRecord::kModelCreate: {
      auto payload = ParseModelCreate(rest);
      if (!payload.ok()) return Bad(rec, payload.status().message());
      r->kind = SessionKind::kModel;
      r->model = FindModel(payload->model, payload->fingerprint);
      if (r->model == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(
            "journal: session '", rec.session_id, "' runs model '",
            payload->model,
            "', which is not loaded (with the same weights); load it to "
            "recover the session"));
      }
      r->model_state = r->model->NewState();
      break;
    }
    default: {
      auto parsed = ParseModelSnapshot(rest, models_);
      if (absl::IsFailedPrecondition(parsed.status())) {
        return absl::FailedPreconditionError(
            absl::StrCat("journal: session '", rec.session_id,
                         "': ", parsed.status().message()));
      }
      if (!parsed.ok()) return Bad(rec, parsed.status().message());
      r->kind = SessionKind::kModel;
      r->model = parsed->model;
      r->model_state = std::move(parsed->state);
      r->pending = parsed->pending;
      r->sampler = parsed->sampler;
      break;
    }
  }
  live_[rec.session_id] = std::move(r);
  return absl::OkStatus();
}

absl::Status Replayer::ApplySteps(Records records) {
  // One request's steps: all of them or none (a DecodeBatch).
  const JournalRecord& rec = records[0];
  auto first = ParseStepPayload(SplitBody(rec.payload)->rest);
  if (!first.ok()) return Bad(rec, first.status().message());
  const uint32_t count = first->steps;
  if (count == 0 || count != records.size()) {
    return Bad(rec, absl::StrCat("opens a request of ", count,
                                 " steps the journal does not hold"));
  }
  std::vector<StepItem> items;
  bool refused = false;
  uint64_t out_floats = 0, out_heads = 0;
  for (uint32_t j = 0; j < count; ++j) {
    const JournalRecord& m = records[j];
    if (m.type != static_cast<uint8_t>(DurableRecord::kStep) ||
        m.payload.size() < 12 ||
        (j > 0 && GetLittleEndian<uint32_t>(m.payload.data() + 8) != 0)) {
      return Bad(rec, absl::StrCat("step ", j, " of the request is missing"));
    }
    const uint64_t inc = GetLittleEndian<uint64_t>(m.payload.data());
    const absl::string_view floats = absl::string_view(m.payload).substr(12);
    auto mit = live_.find(m.session_id);
    Live* r = mit != live_.end() ? mit->second.get() : nullptr;
    if (r == nullptr || r->incarnation != inc ||
        r->kind != SessionKind::kAttention || m.seq <= r->covered) {
      // A session deleted meanwhile (or already in its snapshot): its input
      // still decides whether the request was refused.
      for (size_t f = 0; f + 4 <= floats.size(); f += 4) {
        refused |= !std::isfinite(GetLittleEndian<float>(floats.data() + f));
      }
      continue;
    }
    if (floats.size() != StepFloats(r->spec) * sizeof(float)) {
      return absl::DataLossError(absl::StrCat(
          "journal: record ", m.seq, " (step, session '", m.session_id,
          "') in ", where_,
          ": holds a token of another shape than its session's; refusing to "
          "start from it"));
    }
    if (r->attention == nullptr) {
      LINATTN_ASSIGN_OR_RETURN(r->attention, AttentionOf(r->spec));
    }
    items.push_back(
        StepItem{r->attention.get(), &*r->state, StepInput(r->spec, floats)});
    out_floats += uint64_t{r->spec.num_heads} * r->spec.value_dim;
    out_heads += r->spec.num_heads;
    r->tail_bytes += JournalRecordBytes(m.payload.size(), m.session_id.size());
  }
  if (refused || items.empty()) return absl::OkStatus();
  // The outputs are not needed; the kernels write them.
  scratch_out_.resize(out_floats + out_heads);
  scratch_available_.resize(out_heads);
  float* o = scratch_out_.data();
  uint8_t* a = scratch_available_.data();
  for (StepItem& item : items) {
    const uint32_t heads = item.state->num_heads();
    const uint64_t vv = uint64_t{heads} * item.state->value_dim();
    item.out = SequenceOutput{o, o + vv, a};
    o += vv + heads;
    a += heads;
  }
  // A refused step changed nothing when it ran, and changes nothing now.
  (void)StepBatch(items);
  report_.replayed += items.size();
  return absl::OkStatus();
}

absl::Status Replayer::ReplayTokens() {
  // The tokens that joined model sessions' contexts since their last other
  // record: many sessions per forward pass (as the engine batches them),
  // the pending token and all but the last token fed, the last pending.
  constexpr size_t kItemsPerPass = 32;
  struct Feed {
    const std::string* id;
    Live* session;
    std::vector<int32_t> tokens;
  };
  std::map<const Model*, std::vector<Feed>> feeds;
  std::map<const Model*, std::shared_ptr<const Model>> owners;
  for (auto& [id, r] : live_) {
    if (r->kind != SessionKind::kModel || r->feed.empty()) continue;
    std::vector<int32_t> feed;
    if (r->pending) feed.push_back(*r->pending);
    feed.insert(feed.end(), r->feed.begin(), r->feed.end() - 1);
    r->pending = r->feed.back();
    r->feed.clear();
    if (feed.empty()) continue;
    feeds[r->model.get()].push_back({&id, r.get(), std::move(feed)});
    owners[r->model.get()] = r->model;
  }
  for (auto& [model, list] : feeds) {
    ForwardRunner runner(owners[model], forward_);
    for (size_t first = 0; first < list.size(); first += kItemsPerPass) {
      std::vector<ForwardItem> items;
      for (size_t i = first; i < std::min(list.size(), first + kItemsPerPass);
           ++i) {
        items.push_back({.state = &*list[i].session->model_state,
                         .tokens = list[i].tokens});
      }
      if (absl::Status s = runner.Run(items); !s.ok()) {
        return absl::Status(
            s.code(),
            absl::StrCat("recovery: replaying the tokens of session '",
                         *list[first].id, "' and others: ", s.message()));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, RebuiltSession, std::less<>>>
Replayer::Adopt(
    SessionManager& table,
    const std::function<uint64_t(uint64_t recorded)>& incarnation_of,
    const std::function<void(const std::string&, uint64_t)>& joining) {
  for (auto& [id, r] : live_) {
    r->incarnation = incarnation_of(r->incarnation);
    joining(id, r->incarnation);
  }
  LINATTN_RETURN_IF_ERROR(ReplayTokens());
  std::map<std::string, RebuiltSession, std::less<>> rebuilt;
  for (auto& [id, r] : live_) {
    absl::StatusOr<std::shared_ptr<Session>> session;
    if (r->kind == SessionKind::kModel) {
      session = table.AdoptModelSession(r->model, *std::move(r->model_state),
                                        r->pending, r->sampler, id,
                                        "session_id", Tenant::Named(r->owner));
    } else {
      session = table.AdoptSession(r->spec, *std::move(r->state), id,
                                   "session_id", Tenant::Named(r->owner));
    }
    if (!session.ok()) {
      return absl::Status(session.status().code(),
                          absl::StrCat("recovery: session '", id,
                                       "': ", session.status().message()));
    }
    ++(r->kind == SessionKind::kModel ? report_.model_sessions
                                      : report_.attention_sessions);
    rebuilt[id] = RebuiltSession{r->incarnation,  r->owner,
                                 r->kind,         (*session)->state_bytes(),
                                 r->first_needed, r->tail_bytes};
  }
  return rebuilt;
}

}  // namespace linattn
