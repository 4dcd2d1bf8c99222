#include "core/session/durable_store.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/attention/recurrent.h"
#include "core/model/forward.h"
#include "core/session/snapshot.h"
#include "core/util/little_endian.h"
#include "core/util/status_macros.h"

namespace linattn {
namespace {

constexpr size_t kMaxFailedRanges = 256;
// Handed-over sessions remembered (whose queued requests are refused).
constexpr size_t kMaxHandedOver = 4096;
// A record's bytes on disk beyond its body and session id: length, two
// checksums, seq, type, id length.
constexpr uint64_t kRecordOverhead = 4 + 4 + 4 + 8 + 1 + 2;

absl::string_view RecordName(uint8_t type) {
  switch (static_cast<DurableRecord>(type)) {
    case DurableRecord::kCreate:
      return "create";
    case DurableRecord::kCreateWithState:
      return "create with state";
    case DurableRecord::kState:
      return "state";
    case DurableRecord::kDelete:
      return "delete";
    case DurableRecord::kStep:
      return "step";
    case DurableRecord::kModelCreate:
      return "model create";
    case DurableRecord::kModelCreateWithState:
      return "model create with state";
    case DurableRecord::kModelState:
      return "model state";
    case DurableRecord::kTokens:
      return "tokens";
    case DurableRecord::kSampler:
      return "sampler";
    case DurableRecord::kOwner:
      return "owner";
  }
  return "unknown";
}

std::string Incarnation(uint64_t incarnation) {
  std::string out;
  PutLittleEndian<uint64_t>(out, incarnation);
  return out;
}

// A stored snapshot (file or shared store) is its incarnation, then, for a
// session with a tenant, this magic, the tenant's length (u16) and name,
// then the snapshot itself (which starts with its own magic, so stores
// written before tenants existed read as owned by "").
constexpr char kOwnerMagic[8] = {'L', 'N', 'A', 'T', 'O', 'W', 'N', 'R'};
inline constexpr size_t kMaxOwnerBytes = 1024;

std::string OwnerSection(const std::string& owner) {
  if (owner.empty()) return "";
  std::string out(kOwnerMagic, sizeof(kOwnerMagic));
  PutLittleEndian<uint16_t>(out, static_cast<uint16_t>(owner.size()));
  return out + owner;
}

// Splits the owner section off `blob` (after the incarnation).
absl::StatusOr<std::string> TakeOwnerSection(absl::string_view& blob) {
  if (blob.size() < sizeof(kOwnerMagic) ||
      std::memcmp(blob.data(), kOwnerMagic, sizeof(kOwnerMagic)) != 0) {
    return std::string();
  }
  blob.remove_prefix(sizeof(kOwnerMagic));
  if (blob.size() < 2) return absl::DataLossError("tenant cut short");
  const uint16_t n = GetLittleEndian<uint16_t>(blob.data());
  if (n == 0 || n > kMaxOwnerBytes || blob.size() < 2 + size_t{n}) {
    return absl::DataLossError("tenant cut short");
  }
  std::string owner(blob.substr(2, n));
  blob.remove_prefix(2 + size_t{n});
  return owner;
}

void AppendFloats(std::string& out, const float* data, uint64_t n) {
  out.append(reinterpret_cast<const char*>(data), n * sizeof(float));
}

// A session as recovery rebuilds it.
struct Replayed {
  SessionKind kind = SessionKind::kAttention;
  uint64_t incarnation = 0;
  uint64_t covered = 0;  // the seq its snapshot file covers (0: none)
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
  uint64_t state_bytes = 0;   // once in the table
};

}  // namespace

// --- Group ---------------------------------------------------------------

void DurableStore::Group::Add(DurableRecord type, const Session& session,
                              std::string body) {
  records_.push_back(Record{type, session.id(), session.incarnation(),
                            std::move(body), request_});
}

void DurableStore::Group::AddStep(const AttentionSession& session,
                                  const SequenceInput& in, uint32_t steps) {
  const AttentionSpec& spec = session.spec();
  const uint64_t qk = uint64_t{spec.num_heads} * spec.key_dim;
  const uint64_t vv = uint64_t{spec.num_heads} * spec.value_dim;
  std::string payload;
  payload.reserve(8 + 4 + (2 * qk + vv) * sizeof(float));
  PutLittleEndian<uint64_t>(payload, session.incarnation());
  PutLittleEndian<uint32_t>(payload, steps);
  AppendFloats(payload, in.q, qk);
  AppendFloats(payload, in.k, qk);
  AppendFloats(payload, in.v, vv);
  // The gated and delta rules' log-gates and β follow (none for the
  // linear rule, whose records are as they were).
  const uint64_t gates = uint64_t{spec.num_heads} * GatesPerHead(spec);
  if (gates != 0) AppendFloats(payload, in.g, gates);
  if (HasBeta(spec.rule)) AppendFloats(payload, in.beta, spec.num_heads);
  Add(DurableRecord::kStep, session, std::move(payload));
}

void DurableStore::Group::AddState(const AttentionSession& session,
                                   const AttentionState& state) {
  Add(DurableRecord::kState, session,
      Incarnation(session.incarnation()) +
          SerializeSnapshot(session.spec(), state));
}

void DurableStore::Group::AddTokens(const ModelSession& session,
                                    std::span<const int32_t> tokens) {
  std::string payload = Incarnation(session.incarnation());
  payload.reserve(8 + tokens.size() * 4);
  for (int32_t t : tokens) PutLittleEndian<int32_t>(payload, t);
  Add(DurableRecord::kTokens, session, std::move(payload));
}

void DurableStore::Group::AddModelState(const ModelSession& session) {
  Add(DurableRecord::kModelState, session,
      Incarnation(session.incarnation()) +
          SerializeModelSnapshot(session.model(), session.state(),
                                 session.pending_token(), session.sampler()));
}

void DurableStore::Group::AddSampler(const ModelSession& session,
                                     const SamplerPosition& position) {
  std::string payload = Incarnation(session.incarnation());
  PutLittleEndian<uint64_t>(payload, position.seed);
  PutLittleEndian<uint64_t>(payload, position.draws);
  Add(DurableRecord::kSampler, session, std::move(payload));
}

// --- Store ---------------------------------------------------------------

DurableStore::DurableStore(DurableStoreOptions options)
    : options_(std::move(options)),
      journal_dir_((std::filesystem::path(options_.dir) / "journal").string()),
      files_((std::filesystem::path(options_.dir) / "sessions").string(),
             options_.durability != Durability::kOff) {}

DurableStore::~DurableStore() = default;

absl::StatusOr<std::unique_ptr<DurableStore>> DurableStore::Open(
    DurableStoreOptions options) {
  if (options.shared != nullptr) {
    return std::unique_ptr<DurableStore>(new DurableStore(std::move(options)));
  }
  if (options.dir.empty()) {
    return absl::InvalidArgumentError("state dir: must not be empty");
  }
  std::unique_ptr<DurableStore> store(new DurableStore(std::move(options)));
  LINATTN_ASSIGN_OR_RETURN(store->lock_,
                           StateDirLock::Acquire(store->options_.dir));
  LINATTN_RETURN_IF_ERROR(store->files_.Open());
  std::error_code ec;
  std::filesystem::create_directories(store->journal_dir_, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat(
        "state dir: creating ", store->journal_dir_, ": ", ec.message()));
  }
  return store;
}

std::pair<DurableRecord, std::string> DurableStore::CreatePayload(
    const Session& session) {
  if (session.kind() == SessionKind::kAttention) {
    const auto& s = static_cast<const AttentionSession&>(session);
    // A state at position 0 holds nothing (CheckRestoredState): the spec
    // says it all.
    if (s.state().position() == 0) {
      return {DurableRecord::kCreate, SerializeSpec(s.spec())};
    }
    return {DurableRecord::kCreateWithState,
            SerializeSnapshot(s.spec(), s.state())};
  }
  const auto& s = static_cast<const ModelSession&>(session);
  if (s.context_position() == 0) {
    std::string payload;
    PutLittleEndian<uint64_t>(payload, s.model().fingerprint());
    payload += s.model().name();
    return {DurableRecord::kModelCreate, std::move(payload)};
  }
  return {DurableRecord::kModelCreateWithState,
          SerializeModelSnapshot(s.model(), s.state(), s.pending_token(),
                                 s.sampler())};
}

void DurableStore::OnCreated(const std::shared_ptr<Session>& session) {
  std::lock_guard<std::mutex> lock(mu_);
  // A session rebuilt by recovery or a takeover: recorded already.
  auto it = recovered_incarnations_.find(session->id());
  if (it != recovered_incarnations_.end()) {
    session->set_incarnation(it->second);
    // A takeover's session is written to from the moment it is in the
    // table: its entry (epoch, records) is there first.
    auto a = adopting_.find(session->id());
    if (a != adopting_.end()) {
      Entry& e = entries_[session->id()];
      e = Entry{};
      e.incarnation = it->second;
      e.owner = session->owner();
      e.kind = session->kind();
      e.state_bytes = session->state_bytes();
      e.first_needed = 0;
      e.epoch = a->second.first;
      e.appended = a->second.second;
    }
    return;
  }
  if (recovering_) return;
  const uint64_t ticket = next_ticket_++;
  session->set_incarnation(ticket);
  Entry& e = entries_[session->id()];
  e = Entry{};
  e.incarnation = ticket;
  e.owner = session->owner();
  e.kind = session->kind();
  e.state_bytes = session->state_bytes();
  staged_.push_back(
      Staged{ticket, DurableRecord::kCreate, session->id(), ticket, session});
}

void DurableStore::OnRemoved(const Session& session, Removal why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (recovering_) return;
  uint64_t epoch = 0;
  auto it = entries_.find(session.id());
  if (it != entries_.end() && it->second.incarnation == session.incarnation()) {
    epoch = it->second.epoch;
    entries_.erase(it);
  }
  // Another replica serves it now: it is not deleted, and records of it
  // still queued here must not be written.
  if (why == Removal::kHandedOver) {
    auto key = std::make_pair(session.id(), session.incarnation());
    if (handed_over_.insert(key).second) {
      handed_over_order_.push_back(std::move(key));
      if (handed_over_order_.size() > kMaxHandedOver) {
        handed_over_.erase(handed_over_order_.front());
        handed_over_order_.pop_front();
      }
    }
    return;
  }
  Staged staged{next_ticket_++, DurableRecord::kDelete, session.id(),
                session.incarnation(), nullptr};
  staged.epoch = epoch;
  staged_.push_back(std::move(staged));
}

uint64_t DurableStore::last_ticket() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_ticket_ - 1;
}

bool DurableStore::has_staged() const {
  std::lock_guard<std::mutex> lock(mu_);
  // Staged, or taken by a commit still under way (whose serialization of a
  // new session must finish before anyone changes that session).
  return committed_ticket_ < next_ticket_ - 1;
}

void DurableStore::SnapshotSoon(absl::string_view id, uint64_t incarnation) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  if (it != entries_.end() && it->second.incarnation == incarnation) {
    it->second.dirty = true;
  }
}

uint64_t DurableStore::committed_seq() const {
  std::lock_guard<std::mutex> lock(mu_);
  return committed_seq_;
}

uint64_t DurableStore::CoveredPosition(const Session& session) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!shared()) return committed_seq_;
  auto it = entries_.find(session.id());
  if (it == entries_.end() || it->second.incarnation != session.incarnation()) {
    return 0;
  }
  return it->second.appended;
}

// --- Shared store: ownership ------------------------------------------------

absl::Status DurableStore::Claim(absl::string_view id) {
  if (!shared() || table_ == nullptr || !IsValidSessionId(id)) {
    return absl::NotFoundError("no such session");
  }
  // One takeover per id at a time: a second request waits for the first
  // and then looks at the table again.
  {
    std::unique_lock<std::mutex> lock(claims_mu_);
    if (claiming_.count(id) != 0) {
      claims_cv_.wait(lock, [&] { return claiming_.count(id) == 0; });
      return absl::OkStatus();
    }
    claiming_.insert(std::string(id));
  }
  const absl::Status s = TakeOver(id);
  {
    std::lock_guard<std::mutex> lock(claims_mu_);
    claiming_.erase(claiming_.find(id));
  }
  claims_cv_.notify_all();
  return s;
}

absl::Status DurableStore::TakeOver(absl::string_view id) {
  const auto lease = options_.shared->options().lease;
  const auto deadline = std::chrono::steady_clock::now() + 2 * lease;
  SharedStore::Acquired got;
  for (;;) {
    if (table_->Contains(id)) return absl::OkStatus();  // came meanwhile
    auto acquired = options_.shared->Acquire(id);
    if (!acquired.ok()) {
      return absl::UnavailableError(
          absl::StrCat("session_id: '", id,
                       "' is not on this replica, and the state store could "
                       "not be asked for it: ",
                       acquired.status().message()));
    }
    if (acquired->outcome == SharedStore::Acquired::Outcome::kMissing) {
      return absl::NotFoundError("no such session");
    }
    if (acquired->outcome == SharedStore::Acquired::Outcome::kTaken) {
      got = *std::move(acquired);
      break;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::UnavailableError(absl::StrCat(
          "session_id: '", id, "' is served by replica '", acquired->holder,
          "', which did not hand it over within ", (2 * lease).count(),
          " ms; send the request to that replica, or again later"));
    }
    // Asked to hand it over (its next heartbeat hears of it), or its lease
    // runs out.
    std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(
        acquired->held_for, std::chrono::milliseconds(20)));
  }
  // Its snapshot and records, replayed as recovery would.
  const std::string where =
      absl::StrCat(options_.shared->url(), " la:s:{", id, "}");
  Sources sources;
  sources.snapshots =
      [&](const std::function<absl::Status(SnapshotFiles::Entry&)>& visit) {
        if (got.snapshot.empty()) return absl::OkStatus();
        SnapshotFiles::Entry f;
        f.id = std::string(id);
        f.seq = got.base;
        f.path = absl::StrCat(where, ":snap");
        f.bytes = std::move(got.snapshot);
        f.blob_size = f.bytes.size();
        return visit(f);
      };
  sources.records =
      [&](const std::function<absl::Status(JournalRecord&)>& visit)
      -> absl::StatusOr<JournalScan> {
    JournalScan scan;
    for (size_t i = 0; i < got.records.size(); ++i) {
      JournalRecord rec;
      rec.seq = got.base + i + 1;
      rec.session_id = std::string(id);
      rec.file = absl::StrCat(where, ":log");
      rec.offset = i;
      if (got.records[i].empty()) {
        return absl::DataLossError(
            absl::StrCat("state store: ", rec.file, " entry ", i, " is empty"));
      }
      rec.type = static_cast<uint8_t>(got.records[i][0]);
      rec.payload = got.records[i].substr(1);
      LINATTN_RETURN_IF_ERROR(visit(rec));
    }
    scan.next_seq = got.base + got.records.size() + 1;
    return scan;
  };
  uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ticket = next_ticket_++;
    adopting_[std::string(id)] = {got.epoch, got.base + got.records.size()};
  }
  RecoveryReport report;
  auto rebuilt =
      Rebuild(*table_, sources, report, [ticket](uint64_t) { return ticket; });
  {
    std::lock_guard<std::mutex> lock(mu_);
    adopting_.erase(adopting_.find(id));
    if (rebuilt.ok()) {
      auto it = entries_.find(id);
      auto r = rebuilt->sessions.find(id);
      if (it != entries_.end() && it->second.incarnation == ticket &&
          r != rebuilt->sessions.end()) {
        it->second.tail_bytes += r->second.tail_bytes;
      }
    }
  }
  if (!rebuilt.ok()) {
    // Let another replica have it.
    const std::pair<std::string, uint64_t> mine{std::string(id), got.epoch};
    (void)options_.shared->Release(
        std::span<const std::pair<std::string, uint64_t>>(&mine, 1));
    return absl::Status(rebuilt.status().code(),
                        absl::StrCat("session_id: '", id,
                                     "': taking it over from the state store "
                                     "failed: ",
                                     rebuilt.status().message()));
  }
  return absl::OkStatus();
}

absl::Status DurableStore::Confirm(const Session& session) {
  if (!shared()) return absl::OkStatus();
  const int64_t now =
      std::chrono::steady_clock::now().time_since_epoch().count();
  const int64_t lease = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            options_.shared->options().lease)
                            .count();
  if (now - lease_renewed_ns_.load() < lease) return absl::OkStatus();
  // This replica's lease may have lapsed: is the session still its own?
  uint64_t mine = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(session.id());
    if (it != entries_.end() &&
        it->second.incarnation == session.incarnation()) {
      mine = it->second.epoch;
    }
  }
  if (mine == 0) return absl::OkStatus();  // not written yet
  const std::string id = session.id();
  auto epochs = options_.shared->Epochs(std::span<const std::string>(&id, 1));
  if (!epochs.ok()) return absl::OkStatus();  // its writes are fenced anyway
  if ((*epochs)[0] == mine) return absl::OkStatus();
  (void)table_->HandOver(id, session.incarnation());
  return absl::AbortedError("taken over");
}

absl::StatusOr<std::vector<DurableStore::Due>> DurableStore::Beat() {
  std::vector<Due> lost;
  if (!shared()) return lost;
  const auto sent = std::chrono::steady_clock::now().time_since_epoch().count();
  const int64_t lease = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            options_.shared->options().lease)
                            .count();
  LINATTN_RETURN_IF_ERROR(options_.shared->Heartbeat());
  const bool gap = sent - lease_renewed_ns_.load() >= lease;
  lease_renewed_ns_ = sent;
  if (!gap) return lost;
  // The lease lapsed: sessions taken over meanwhile are not ours.
  std::vector<std::string> ids;
  std::vector<Due> mine;
  std::vector<uint64_t> held;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, e] : entries_) {
      if (e.epoch == 0) continue;
      ids.push_back(id);
      mine.push_back(Due{id, e.incarnation, e.kind, e.state_bytes});
      held.push_back(e.epoch);
    }
  }
  if (ids.empty()) return lost;
  auto epochs = options_.shared->Epochs(ids);
  if (!epochs.ok()) return epochs.status();
  for (size_t i = 0; i < ids.size(); ++i) {
    if ((*epochs)[i] != held[i]) lost.push_back(mine[i]);
  }
  return lost;
}

absl::StatusOr<std::vector<DurableStore::Due>> DurableStore::AwaitWanted() {
  std::vector<Due> wanted;
  if (!shared()) return wanted;
  auto ids = options_.shared->AwaitWants();
  if (!ids.ok()) return ids.status();
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& id : *ids) {
    auto it = entries_.find(id);
    if (it == entries_.end() || it->second.epoch == 0) continue;
    wanted.push_back(Due{id, it->second.incarnation, it->second.kind,
                         it->second.state_bytes});
  }
  return wanted;
}

absl::Status DurableStore::HandOver(std::span<const Due> sessions,
                                    bool release) {
  std::vector<std::pair<std::string, uint64_t>> epochs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Due& d : sessions) {
      auto it = entries_.find(d.id);
      if (it != entries_.end() && it->second.incarnation == d.incarnation &&
          it->second.epoch != 0) {
        epochs.push_back({d.id, it->second.epoch});
      }
    }
  }
  for (const Due& d : sessions) (void)table_->HandOver(d.id, d.incarnation);
  if (!release || !shared()) return absl::OkStatus();
  return options_.shared->Release(epochs);
}

absl::Status DurableStore::DropLease() {
  if (!shared()) return absl::OkStatus();
  return options_.shared->DropLease();
}

absl::Status DurableStore::Commit(Group group, std::vector<uint32_t>* refused) {
  std::lock_guard<std::mutex> lock(write_mu_);
  return CommitLocked(std::move(group), refused);
}

absl::Status DurableStore::CommitLocked(Group group,
                                        std::vector<uint32_t>* refused) {
  if (writer_ == nullptr && table_ == nullptr) {
    return absl::FailedPreconditionError(
        "state dir: the store has not recovered yet");
  }
  std::vector<Staged> staged;
  uint64_t first_ticket = 0, last_ticket = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    staged.swap(staged_);
    first_ticket = committed_ticket_ + 1;
    last_ticket = next_ticket_ - 1;
  }
  if (shared()) {
    return CommitSharedLocked(std::move(staged), std::move(group), first_ticket,
                              last_ticket, refused);
  }
  struct Written {
    DurableRecord type;
    std::string id;
    uint64_t incarnation;
    uint64_t seq;
    uint64_t bytes;
  };
  std::vector<Written> written;
  written.reserve(staged.size() + group.records_.size());
  // `body`: the incarnation, then the payload.
  auto add = [&](DurableRecord type, const std::string& id,
                 uint64_t incarnation, absl::string_view body) {
    const uint64_t seq = writer_->Add(static_cast<uint8_t>(type), id, body);
    written.push_back({type, id, incarnation, seq,
                       body.size() + id.size() + kRecordOverhead});
  };
  for (const Staged& s : staged) {
    if (s.type == DurableRecord::kDelete) {
      add(DurableRecord::kDelete, s.id, s.incarnation,
          Incarnation(s.incarnation));
      continue;
    }
    auto [type, payload] = CreatePayload(*s.session);
    add(type, s.id, s.incarnation, Incarnation(s.incarnation) + payload);
    if (!s.session->owner().empty()) {
      add(DurableRecord::kOwner, s.id, s.incarnation,
          Incarnation(s.incarnation) + s.session->owner());
    }
  }
  for (const Group::Record& r : group.records_) {
    add(r.type, r.id, r.incarnation, r.body);
  }
  const auto started = std::chrono::steady_clock::now();
  const absl::Status status = writer_->Commit();
  if (options_.on_commit) {
    options_.on_commit(std::chrono::duration<double>(
                           std::chrono::steady_clock::now() - started)
                           .count());
  }
  std::lock_guard<std::mutex> lock(mu_);
  Resolve(first_ticket, last_ticket, status, staged);
  if (!status.ok()) return status;
  committed_seq_ = writer_->next_seq() - 1;
  if (segment_starts_.empty() ||
      segment_starts_.back() != writer_->segment_first_seq()) {
    segment_starts_.push_back(writer_->segment_first_seq());
    if (segment_starts_.size() > 2) segment_starts_.pop_front();
  }
  ++stats_.commits;
  for (const Written& w : written) {
    ++stats_.records;
    stats_.bytes += w.bytes;
    if (w.type == DurableRecord::kDelete) {
      removals_.push_back({w.id, w.incarnation, w.seq});
      continue;
    }
    auto it = entries_.find(w.id);
    if (it == entries_.end() || it->second.incarnation != w.incarnation) {
      continue;
    }
    Entry& e = it->second;
    e.first_needed = std::min(e.first_needed, w.seq);
    e.tail_bytes += w.bytes;
  }
  return absl::OkStatus();
}

void DurableStore::Resolve(uint64_t first, uint64_t last,
                           const absl::Status& status,
                           std::vector<Staged>& staged) {
  committed_ticket_ = std::max(committed_ticket_, last);
  if (status.ok()) return;
  if (first <= last) {
    failed_.push_back({first, last, status});
    if (failed_.size() > kMaxFailedRanges) failed_.pop_front();
  }
  ++stats_.failed_commits;
  // Deletes already happened in memory: they go with the next commit,
  // ahead of anything staged since.
  std::vector<Staged> again;
  for (Staged& s : staged) {
    if (s.type == DurableRecord::kDelete) {
      s.ticket = next_ticket_++;
      again.push_back(std::move(s));
    }
  }
  staged_.insert(staged_.begin(), std::make_move_iterator(again.begin()),
                 std::make_move_iterator(again.end()));
}

absl::Status DurableStore::CommitSharedLocked(std::vector<Staged> staged,
                                              Group group, uint64_t first,
                                              uint64_t last,
                                              std::vector<uint32_t>* refused) {
  // One op per session (incarnation): its create, its records in order,
  // its delete. An id deleted and created again within one commit needs
  // the delete written first: the ops up to it go as a commit of their own.
  struct Pending {
    SharedStore::Op op;
    uint64_t incarnation = 0;
    uint64_t create_ticket = 0;
    SessionKind kind = SessionKind::kAttention;
    uint64_t bytes = 0;
    bool dropped = false;  // created and deleted here: nothing to write
  };
  std::vector<std::vector<Pending>> batches(1);
  std::map<std::pair<std::string, uint64_t>, size_t> where;  // last batch
  std::set<std::string, std::less<>> removed;                // last batch
  auto record = [](DurableRecord type, absl::string_view body) {
    std::string r;
    r.reserve(1 + body.size());
    r.push_back(static_cast<char>(type));
    r.append(body.data(), body.size());
    // The store holds one incarnation of a session: 0.
    if (r.size() >= 9) std::fill(r.begin() + 1, r.begin() + 9, '\0');
    // A step replays on its own: its request was checked whole before it
    // was recorded (a request the kernels refuse is not recorded).
    if (type == DurableRecord::kStep && r.size() >= 13) {
      r[9] = 1;
      r[10] = r[11] = r[12] = 0;
    }
    return r;
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto epoch_of = [&](const std::string& id, uint64_t inc) -> uint64_t {
      auto it = entries_.find(id);
      if (it != entries_.end() && it->second.incarnation == inc) {
        return it->second.epoch;
      }
      auto o = orphan_epochs_.find(id);
      if (o != orphan_epochs_.end() && o->second.first == inc) {
        return o->second.second;
      }
      return 0;
    };
    for (Staged& st : staged) {
      const auto key = std::make_pair(st.id, st.incarnation);
      auto found = where.find(key);
      if (st.type != DurableRecord::kDelete) {
        if (removed.count(st.id) != 0) {
          batches.emplace_back();
          where.clear();
          removed.clear();
        }
        Pending p;
        p.op.id = st.id;
        p.op.create = true;
        p.incarnation = st.incarnation;
        p.create_ticket = st.ticket;
        p.kind = st.session->kind();
        auto [type, payload] = CreatePayload(*st.session);
        p.op.records.push_back(record(type, Incarnation(0) + payload));
        p.bytes = p.op.records.back().size();
        if (!st.session->owner().empty()) {
          p.op.records.push_back(record(DurableRecord::kOwner,
                                        Incarnation(0) + st.session->owner()));
          p.bytes += p.op.records.back().size();
        }
        where[key] = batches.back().size();
        batches.back().push_back(std::move(p));
        continue;
      }
      removed.insert(st.id);
      if (found != where.end()) {
        Pending& p = batches.back()[found->second];
        if (p.op.create) {
          p.dropped = true;
        } else {
          p.op.remove = true;
          p.op.records.clear();
        }
        continue;
      }
      const uint64_t epoch =
          st.epoch != 0 ? st.epoch : epoch_of(st.id, st.incarnation);
      if (epoch == 0) continue;  // its create never reached the store
      Pending p;
      p.op.id = st.id;
      p.op.remove = true;
      p.op.epoch = epoch;
      p.incarnation = st.incarnation;
      where[key] = batches.back().size();
      batches.back().push_back(std::move(p));
    }
    // Requests with a record of a session handed over are left out whole.
    std::set<uint32_t> out;
    const Group::Record* first_out = nullptr;
    for (const Group::Record& r : group.records_) {
      if (handed_over_.count(std::make_pair(r.id, r.incarnation)) != 0) {
        out.insert(r.request);
        if (first_out == nullptr) first_out = &r;
      }
    }
    if (!out.empty()) {
      if (refused == nullptr) {
        const absl::Status st = absl::AbortedError(absl::StrCat(
            "session_id: '", first_out->id,
            "' was handed over to another replica while this request "
            "waited; nothing was written (send the request again: the "
            "session's owner serves it)"));
        Resolve(first, last, st, staged);
        return st;
      }
      refused->assign(out.begin(), out.end());
    }
    for (Group::Record& r : group.records_) {
      if (out.count(r.request) != 0) continue;
      const auto key = std::make_pair(r.id, r.incarnation);
      auto found = where.find(key);
      if (found != where.end()) {
        Pending& p = batches.back()[found->second];
        if (p.op.remove || p.dropped) continue;
        p.op.records.push_back(record(r.type, r.body));
        p.bytes += p.op.records.back().size();
        continue;
      }
      const uint64_t epoch = epoch_of(r.id, r.incarnation);
      if (epoch == 0) continue;  // deleted meanwhile
      Pending p;
      p.op.id = r.id;
      p.op.epoch = epoch;
      p.incarnation = r.incarnation;
      p.op.records.push_back(record(r.type, r.body));
      p.bytes = p.op.records.back().size();
      where[key] = batches.back().size();
      batches.back().push_back(std::move(p));
    }
  }
  absl::Status status;
  std::vector<std::string> fenced;
  for (std::vector<Pending>& batch : batches) {
    std::vector<SharedStore::Op> ops;
    std::vector<Pending*> sent;
    for (Pending& p : batch) {
      if (p.dropped) continue;
      ops.push_back(std::move(p.op));
      sent.push_back(&p);
    }
    if (ops.empty()) continue;
    const auto started = std::chrono::steady_clock::now();
    auto results = options_.shared->Commit(ops, &fenced);
    if (options_.on_commit) {
      options_.on_commit(std::chrono::duration<double>(
                             std::chrono::steady_clock::now() - started)
                             .count());
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (!results.ok()) {
      status = results.status();
      // Sessions another replica took over leave the table (not deleted):
      // their next request claims them from their owner. After a commit
      // whose outcome is not known (the connection failed), every session
      // it carried leaves too: the store, not this replica's memory, then
      // says what they hold, and their next request loads them from it.
      std::vector<std::pair<std::string, uint64_t>> lost;
      if (absl::IsAborted(status)) {
        for (const std::string& id : fenced) {
          auto it = entries_.find(id);
          if (it != entries_.end()) {
            lost.push_back({id, it->second.incarnation});
          }
        }
      } else {
        for (size_t i = 0; i < ops.size(); ++i) {
          if (!ops[i].remove) lost.push_back({ops[i].id, sent[i]->incarnation});
        }
      }
      lock.unlock();
      for (const auto& [id, incarnation] : lost) {
        (void)table_->HandOver(id, incarnation);
      }
      if (absl::IsAborted(status) && !lost.empty() && options_.on_taken_over) {
        options_.on_taken_over(lost.size());
      }
      break;
    }
    ++stats_.commits;
    for (size_t i = 0; i < ops.size(); ++i) {
      const SharedStore::Op& op = ops[i];
      const SharedStore::OpResult& res = (*results)[i];
      Pending& p = *sent[i];
      if (op.remove) {
        auto o = orphan_epochs_.find(op.id);
        if (o != orphan_epochs_.end() && o->second.first == p.incarnation) {
          orphan_epochs_.erase(o);
        }
        ++stats_.records;
        continue;
      }
      if (res.exists) {
        failed_.push_back(
            {p.create_ticket, p.create_ticket,
             absl::AlreadyExistsError(absl::StrCat(
                 "session_id: '", op.id,
                 "' is taken (a session of that id lives in the shared "
                 "state store)"))});
        if (failed_.size() > kMaxFailedRanges) failed_.pop_front();
        continue;
      }
      stats_.records += op.records.size();
      stats_.bytes += p.bytes;
      auto it = entries_.find(op.id);
      const bool live =
          it != entries_.end() && it->second.incarnation == p.incarnation;
      if (op.create && !live) {
        orphan_epochs_[op.id] = {p.incarnation, res.epoch};
      }
      if (!live) continue;
      Entry& e = it->second;
      if (op.create) e.epoch = res.epoch;
      e.appended += op.records.size();
      e.tail_bytes += p.bytes;
      e.first_needed = 0;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  Resolve(first, last, status, staged);
  return status;
}

absl::Status DurableStore::SyncThrough(uint64_t first, uint64_t last) {
  auto resolved = [&]() -> std::optional<absl::Status> {
    std::lock_guard<std::mutex> lock(mu_);
    if (committed_ticket_ < last) return std::nullopt;
    for (const FailedRange& f : failed_) {
      if (f.first <= last && first <= f.last) return f.status;
    }
    return absl::OkStatus();
  };
  if (auto s = resolved()) return *s;
  {
    std::lock_guard<std::mutex> lock(write_mu_);
    if (!resolved().has_value()) (void)CommitLocked(Group());
  }
  if (auto s = resolved()) return *s;
  return absl::InternalError(
      absl::StrCat(label(), ": a record was not committed"));
}

absl::Status DurableStore::AwaitCreate(SessionManager& table,
                                       const Session& session) {
  const absl::Status s =
      SyncThrough(session.incarnation(), session.incarnation());
  if (s.ok()) return s;
  std::shared_ptr<Session> found;
  if (session.kind() == SessionKind::kAttention) {
    auto a = table.FindAttention(session.id(), Tenant::Server());
    if (a.ok()) found = *a;
  } else {
    auto m = table.FindModel(session.id(), Tenant::Server());
    if (m.ok()) found = *m;
  }
  if (found != nullptr && found->incarnation() == session.incarnation()) {
    (void)table.Delete(session.id(), session.kind(), Tenant::Server());
  }
  // An id another replica's session holds: the request's own error.
  if (absl::IsAlreadyExists(s)) return s;
  return absl::Status(s.code(), absl::StrCat(label(),
                                             ": recording the new "
                                             "session failed: ",
                                             s.message()));
}

absl::Status DurableStore::Delete(SessionManager& table, absl::string_view id,
                                  SessionKind kind, const Tenant& tenant) {
  const uint64_t before = last_ticket();
  LINATTN_RETURN_IF_ERROR(table.Delete(id, kind, tenant));
  const absl::Status s = SyncThrough(before + 1, last_ticket());
  if (s.ok()) return s;
  return absl::Status(s.code(),
                      absl::StrCat(label(),
                                   ": the session is deleted, but recording "
                                   "its deletion failed (",
                                   s.message(),
                                   "); it is recorded with the next write that "
                                   "succeeds"));
}

absl::Status DurableStore::Tick() {
  std::lock_guard<std::mutex> lock(write_mu_);
  return CommitLocked(Group());
}

std::vector<DurableStore::Due> DurableStore::DueForSnapshot(size_t max) {
  std::lock_guard<std::mutex> lock(mu_);
  // A session whose oldest needed record lies before the previous segment
  // keeps three or more segments on disk.
  const uint64_t pin_limit =
      segment_starts_.size() == 2 ? segment_starts_.front() : 0;
  struct Candidate {
    bool pins;
    uint64_t excess;
    Due due;
  };
  std::vector<Candidate> candidates;
  for (auto& [id, e] : entries_) {
    if (e.snapshot_requested || e.first_needed == UINT64_MAX) continue;
    const uint64_t limit =
        std::max(e.state_bytes * options_.snapshot_tail_factor,
                 options_.min_snapshot_tail_bytes);
    const bool pins = e.first_needed < pin_limit || e.dirty;
    if (!pins && e.tail_bytes <= limit) continue;
    candidates.push_back({pins, e.tail_bytes > limit ? e.tail_bytes - limit : 0,
                          Due{id, e.incarnation, e.kind, e.state_bytes}});
  }
  std::sort(candidates.begin(), candidates.end(),
            [](const Candidate& a, const Candidate& b) {
              if (a.pins != b.pins) return a.pins;
              return a.excess > b.excess;
            });
  std::vector<Due> out;
  for (size_t i = 0; i < candidates.size() && out.size() < max; ++i) {
    Entry& e = entries_[candidates[i].due.id];
    e.snapshot_requested = true;
    e.tail_at_request = e.tail_bytes;
    out.push_back(candidates[i].due);
  }
  return out;
}

std::vector<DurableStore::Due> DurableStore::AllSessions() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Due> out;
  out.reserve(entries_.size());
  for (auto& [id, e] : entries_) {
    if (e.first_needed == UINT64_MAX) continue;  // not recorded yet
    e.snapshot_requested = true;
    e.tail_at_request = e.tail_bytes;
    out.push_back(Due{id, e.incarnation, e.kind, e.state_bytes});
  }
  return out;
}

void DurableStore::SnapshotAbandoned(const Due& due) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(due.id);
  if (it != entries_.end() && it->second.incarnation == due.incarnation) {
    it->second.snapshot_requested = false;
  }
}

absl::Status DurableStore::WriteSnapshot(const Due& due, uint64_t seq,
                                         absl::string_view blob) {
  const Taken taken{due, seq, std::string(blob)};
  return WriteSnapshots(std::span<const Taken>(&taken, 1));
}

absl::Status DurableStore::WriteSnapshots(std::span<const Taken> snapshots) {
  if (shared()) {
    std::vector<SharedStore::Snapshot> blobs;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const Taken& t : snapshots) {
        auto it = entries_.find(t.due.id);
        if (it == entries_.end() ||
            it->second.incarnation != t.due.incarnation ||
            it->second.epoch == 0) {
          continue;
        }
        blobs.push_back(
            {t.due.id, it->second.epoch, t.seq,
             Incarnation(0) + OwnerSection(it->second.owner) + t.blob});
      }
    }
    std::vector<bool> written;
    const absl::Status status =
        blobs.empty() ? absl::OkStatus()
                      : options_.shared->WriteSnapshots(blobs, &written);
    std::lock_guard<std::mutex> lock(mu_);
    for (const Taken& t : snapshots) {
      auto it = entries_.find(t.due.id);
      if (it != entries_.end() && it->second.incarnation == t.due.incarnation) {
        it->second.snapshot_requested = false;
      }
    }
    for (size_t i = 0; status.ok() && i < blobs.size(); ++i) {
      if (!written[i]) continue;
      ++stats_.snapshots_written;
      auto it = entries_.find(blobs[i].id);
      if (it == entries_.end() || it->second.epoch != blobs[i].epoch) continue;
      Entry& e = it->second;
      e.tail_bytes -= std::min(e.tail_bytes, e.tail_at_request);
      e.dirty = false;
    }
    return status;
  }
  // Sessions gone meanwhile keep nothing.
  std::vector<const Taken*> live;
  std::vector<std::string> owners;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Taken& t : snapshots) {
      auto it = entries_.find(t.due.id);
      if (it != entries_.end() && it->second.incarnation == t.due.incarnation) {
        live.push_back(&t);
        owners.push_back(it->second.owner);
      }
    }
  }
  if (live.empty()) return absl::OkStatus();
  std::vector<std::string> data;
  std::vector<SnapshotFiles::Replacement> files;
  data.reserve(live.size());
  files.reserve(live.size());
  for (size_t i = 0; i < live.size(); ++i) {
    const Taken* t = live[i];
    data.push_back(Incarnation(t->due.incarnation) + OwnerSection(owners[i]) +
                   t->blob);
    files.push_back({t->due.id, t->seq, data.back()});
  }
  const absl::Status written =
      files.size() == 1 ? files_.Write(files[0].id, files[0].seq, files[0].blob)
                        : files_.WriteMany(files);
  std::lock_guard<std::mutex> lock(mu_);
  for (const Taken* t : live) {
    auto it = entries_.find(t->due.id);
    const bool still =
        it != entries_.end() && it->second.incarnation == t->due.incarnation;
    if (!written.ok()) {
      if (still) it->second.snapshot_requested = false;
      continue;
    }
    // Written even if the session went since the check: its deletion's
    // removal (Maintain, this thread) comes after and finds it on disk.
    on_disk_[t->due.id] = t->due.incarnation;
    ++stats_.snapshots_written;
    if (!still) continue;
    Entry& e = it->second;
    e.first_needed =
        std::max(e.first_needed == UINT64_MAX ? 0 : e.first_needed, t->seq + 1);
    e.tail_bytes -= std::min(e.tail_bytes, e.tail_at_request);
    e.snapshot_requested = false;
    e.dirty = false;
  }
  return written;
}

absl::Status DurableStore::Maintain() {
  // A shared store deletes a session's keys with its delete record.
  if (shared()) return absl::OkStatus();
  std::vector<PendingRemoval> removals;
  {
    std::lock_guard<std::mutex> lock(mu_);
    removals.swap(removals_);
  }
  absl::Status status;
  for (size_t i = 0; i < removals.size(); ++i) {
    const PendingRemoval& r = removals[i];
    auto it = on_disk_.find(r.id);
    if (it == on_disk_.end() || it->second != r.incarnation) continue;
    if (absl::Status s = files_.Remove(r.id); !s.ok()) {
      // Tried again next time; its journal records stay until then.
      std::lock_guard<std::mutex> lock(mu_);
      removals_.insert(removals_.end(), removals.begin() + i, removals.end());
      return s;
    }
    on_disk_.erase(it);
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.files_removed;
  }
  uint64_t needed = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    needed = committed_seq_ + 1;
    for (const auto& [id, e] : entries_) {
      needed = std::min(needed, e.first_needed);
    }
    for (const PendingRemoval& r : removals_) {
      needed = std::min(needed, r.seq);
    }
  }
  std::lock_guard<std::mutex> lock(write_mu_);
  if (writer_ == nullptr) return status;
  const uint64_t before = writer_->disk_bytes();
  LINATTN_RETURN_IF_ERROR(writer_->RemoveSegmentsBefore(needed));
  if (writer_->disk_bytes() < before) {
    std::lock_guard<std::mutex> stats_lock(mu_);
    ++stats_.segments_removed;
  }
  return status;
}

uint64_t DurableStore::journal_disk_bytes() const {
  std::error_code ec;
  uint64_t total = 0;
  for (const auto& dirent :
       std::filesystem::directory_iterator(journal_dir_, ec)) {
    const uint64_t size = std::filesystem::file_size(dirent.path(), ec);
    if (!ec) total += size;
  }
  return total;
}

uint64_t DurableStore::snapshot_disk_bytes() const {
  return files_.disk_bytes();
}

DurableStore::Stats DurableStore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

// --- Recovery --------------------------------------------------------------

absl::StatusOr<RecoveryReport> DurableStore::Recover(
    SessionManager& table,
    std::span<const std::shared_ptr<const Model>> models) {
  const auto start = std::chrono::steady_clock::now();
  RecoveryReport report;
  table_ = &table;
  models_.assign(models.begin(), models.end());
  if (shared()) {
    // Nothing to read: a session is loaded when it is first asked for.
    table.set_gate(this);
    lease_renewed_ns_ =
        std::chrono::steady_clock::now().time_since_epoch().count();
    return report;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    recovering_ = true;
  }
  Sources sources;
  sources.snapshots =
      [this](const std::function<absl::Status(SnapshotFiles::Entry&)>& visit) {
        return files_.ForEach(visit);
      };
  sources.records =
      [this](const std::function<absl::Status(JournalRecord&)>& visit) {
        return ReadJournal(journal_dir_, visit);
      };
  auto rebuilt = Rebuild(table, sources, report,
                         [](uint64_t recorded) { return recorded; });
  {
    std::lock_guard<std::mutex> lock(mu_);
    recovering_ = false;
  }
  if (!rebuilt.ok()) return rebuilt.status();
  const JournalScan& scan = rebuilt->scan;
  for (const auto& [id, incarnation] : rebuilt->files)
    on_disk_[id] = incarnation;
  LINATTN_RETURN_IF_ERROR(RepairJournal(scan));
  // Records continue after the last one read, and after every file's.
  const uint64_t next_seq = std::max(scan.next_seq, rebuilt->max_file_seq + 1);
  std::lock_guard<std::mutex> write_lock(write_mu_);
  LINATTN_ASSIGN_OR_RETURN(
      writer_, JournalWriter::Open(journal_dir_, next_seq,
                                   JournalOptions{
                                       .durability = options_.durability,
                                       .sync_interval = options_.sync_interval,
                                       .segment_bytes = options_.segment_bytes,
                                   }));
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, r] : rebuilt->sessions) {
    Entry e;
    e.incarnation = r.incarnation;
    e.owner = r.owner;
    e.kind = r.kind;
    e.state_bytes = r.state_bytes;
    e.first_needed = r.first_needed;
    e.tail_bytes = r.tail_bytes;
    entries_.emplace(id, e);
  }
  next_ticket_ = rebuilt->max_incarnation + 1;
  committed_ticket_ = rebuilt->max_incarnation;
  committed_seq_ = next_seq - 1;
  segment_starts_.assign(1, writer_->segment_first_seq());
  report.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return report;
}

absl::StatusOr<DurableStore::Rebuilt> DurableStore::Rebuild(
    SessionManager& table, const Sources& sources, RecoveryReport& report,
    const std::function<uint64_t(uint64_t recorded)>& incarnation_of) {
  const std::span<const std::shared_ptr<const Model>> models = models_;
  Rebuilt result;
  std::map<std::string, Replayed, std::less<>> live;
  uint64_t& max_incarnation = result.max_incarnation;
  uint64_t& max_file_seq = result.max_file_seq;

  // Snapshots first: each is where its session's replay starts.
  // One in memory at a time; its state stays.
  LINATTN_RETURN_IF_ERROR(
      sources.snapshots([&](SnapshotFiles::Entry& f) -> absl::Status {
        auto refuse = [&](const absl::Status& why) {
          return absl::Status(
              why.code() == absl::StatusCode::kFailedPrecondition
                  ? why.code()
                  : absl::StatusCode::kDataLoss,
              absl::StrCat("snapshot files: ", f.path, ": ", why.message(),
                           "; refusing to start from it (move it away to start "
                           "without the session)"));
        };
        if (f.blob().size() < 8 + 16) {
          return refuse(absl::DataLossError("too short"));
        }
        Replayed r;
        r.incarnation = GetLittleEndian<uint64_t>(f.blob().data());
        absl::string_view blob = f.blob().substr(8);
        auto owner = TakeOwnerSection(blob);
        if (!owner.ok()) return refuse(owner.status());
        r.owner = *std::move(owner);
        if (blob.size() < 16) return refuse(absl::DataLossError("too short"));
        const uint32_t kind = GetLittleEndian<uint32_t>(blob.data() + 12);
        if (kind == static_cast<uint32_t>(SnapshotKind::kModelSession)) {
          auto parsed = ParseModelSnapshot(blob, models);
          if (!parsed.ok()) return refuse(parsed.status());
          r.kind = SessionKind::kModel;
          r.model = parsed->model;
          r.model_state = std::move(parsed->state);
          r.pending = parsed->pending;
          r.sampler = parsed->sampler;
        } else {
          auto parsed = ParseSnapshot(blob);
          if (!parsed.ok()) return refuse(parsed.status());
          r.kind = SessionKind::kAttention;
          r.spec = parsed->spec;
          r.state = std::move(parsed->state);
        }
        r.covered = f.seq;
        r.first_needed = f.seq + 1;
        max_incarnation = std::max(max_incarnation, r.incarnation);
        max_file_seq = std::max(max_file_seq, f.seq);
        result.files[f.id] = r.incarnation;
        live.emplace(f.id, std::move(r));
        ++report.snapshot_files;
        return absl::OkStatus();
      }));

  // Runs the tokens that joined model sessions' contexts since their last
  // other record: many sessions per forward pass (as the engine batches
  // them), the pending token and all but the last token fed, the last
  // pending.
  auto replay_tokens = [&]() -> absl::Status {
    constexpr size_t kItemsPerPass = 32;
    std::map<const Model*,
             std::vector<std::pair<const std::string*, std::vector<int32_t>>>>
        feeds;
    std::map<const Model*, std::shared_ptr<const Model>> owners;
    std::map<std::string, Replayed*> by_id;
    for (auto& [id, r] : live) {
      if (r.kind != SessionKind::kModel || r.feed.empty()) continue;
      std::vector<int32_t> feed;
      if (r.pending) feed.push_back(*r.pending);
      feed.insert(feed.end(), r.feed.begin(), r.feed.end() - 1);
      r.pending = r.feed.back();
      r.feed.clear();
      if (feed.empty()) continue;
      feeds[r.model.get()].push_back({&id, std::move(feed)});
      owners[r.model.get()] = r.model;
      by_id[id] = &r;
    }
    for (auto& [model, list] : feeds) {
      ForwardRunner runner(owners[model], options_.forward);
      for (size_t first = 0; first < list.size(); first += kItemsPerPass) {
        std::vector<ForwardItem> items;
        for (size_t i = first; i < std::min(list.size(), first + kItemsPerPass);
             ++i) {
          items.push_back({.state = &*by_id[*list[i].first]->model_state,
                           .tokens = list[i].second});
        }
        if (absl::Status s = runner.Run(items); !s.ok()) {
          return absl::Status(
              s.code(),
              absl::StrCat("recovery: replaying the tokens of "
                           "session '",
                           *list[first].first, "' and others: ", s.message()));
        }
      }
    }
    return absl::OkStatus();
  };
  auto find_model = [&](absl::string_view name,
                        uint64_t fingerprint) -> std::shared_ptr<const Model> {
    for (const auto& m : models) {
      if (m->name() == name && m->fingerprint() == fingerprint) return m;
    }
    return nullptr;
  };

  // Attentions by spec (FAVOR+'s projection is drawn once per spec).
  std::vector<std::shared_ptr<const Attention>> attentions;
  auto attention_of = [&](const AttentionSpec& spec)
      -> absl::StatusOr<std::shared_ptr<const Attention>> {
    for (const auto& a : attentions) {
      if (a->spec() == spec) return a;
    }
    LINATTN_ASSIGN_OR_RETURN(Attention made, Attention::Create(spec));
    attentions.push_back(std::make_shared<const Attention>(std::move(made)));
    return attentions.back();
  };
  std::vector<float> scratch_out;
  std::vector<uint8_t> scratch_available;

  // One record, or a DecodeBatch request's steps together (`records`).
  auto apply = [&](std::span<const JournalRecord> records) -> absl::Status {
    const JournalRecord& rec = records[0];
    auto bad = [&](absl::string_view why) {
      return absl::DataLossError(absl::StrCat(
          "journal: ", rec.file, " at byte ", rec.offset, ": record ", rec.seq,
          " (", RecordName(rec.type), ", session '", rec.session_id, "') ", why,
          "; refusing to start from it"));
    };
    if (rec.payload.size() < 8) return bad("too short");
    const uint64_t incarnation = GetLittleEndian<uint64_t>(rec.payload.data());
    const absl::string_view body = absl::string_view(rec.payload).substr(8);
    max_incarnation = std::max(max_incarnation, incarnation);
    auto it = live.find(rec.session_id);
    // The session's snapshot file already holds this record. (A step opens
    // a request whose members are looked at one by one.)
    if (it != live.end() && rec.seq <= it->second.covered &&
        rec.type != static_cast<uint8_t>(DurableRecord::kStep)) {
      return absl::OkStatus();
    }
    const bool mine = it != live.end() && it->second.incarnation == incarnation;
    const uint64_t bytes =
        rec.payload.size() + rec.session_id.size() + kRecordOverhead;
    switch (static_cast<DurableRecord>(rec.type)) {
      case DurableRecord::kCreate:
      case DurableRecord::kCreateWithState:
      case DurableRecord::kModelCreate:
      case DurableRecord::kModelCreateWithState: {
        if (it != live.end()) return bad("creates a session that exists");
        Replayed r;
        r.incarnation = incarnation;
        r.first_needed = rec.seq;
        const auto type = static_cast<DurableRecord>(rec.type);
        if (type == DurableRecord::kCreate) {
          auto spec = ParseSpec(body);
          if (!spec.ok()) return bad(spec.status().message());
          r.spec = *spec;
          r.state.emplace(r.spec);
        } else if (type == DurableRecord::kCreateWithState) {
          auto parsed = ParseSnapshot(body);
          if (!parsed.ok()) return bad(parsed.status().message());
          r.spec = parsed->spec;
          r.state = std::move(parsed->state);
        } else if (type == DurableRecord::kModelCreate) {
          if (body.size() < 8) return bad("too short");
          r.kind = SessionKind::kModel;
          r.model = find_model(body.substr(8),
                               GetLittleEndian<uint64_t>(body.data()));
          if (r.model == nullptr) {
            return absl::FailedPreconditionError(
                absl::StrCat("journal: session '", rec.session_id,
                             "' runs model '", body.substr(8),
                             "', which is not loaded (with the same "
                             "weights); load it to recover the session"));
          }
          r.model_state = r.model->NewState();
        } else {
          auto parsed = ParseModelSnapshot(body, models);
          if (absl::IsFailedPrecondition(parsed.status())) {
            return absl::FailedPreconditionError(
                absl::StrCat("journal: session '", rec.session_id,
                             "': ", parsed.status().message()));
          }
          if (!parsed.ok()) return bad(parsed.status().message());
          r.kind = SessionKind::kModel;
          r.model = parsed->model;
          r.model_state = std::move(parsed->state);
          r.pending = parsed->pending;
          r.sampler = parsed->sampler;
        }
        r.tail_bytes = bytes;
        live.emplace(rec.session_id, std::move(r));
        ++report.replayed;
        break;
      }
      case DurableRecord::kState: {
        if (!mine || it->second.kind != SessionKind::kAttention) break;
        auto parsed = ParseSnapshot(body);
        if (!parsed.ok()) return bad(parsed.status().message());
        if (!(parsed->spec == it->second.spec)) {
          return bad("holds a state of another spec than its session's");
        }
        it->second.state = std::move(parsed->state);
        it->second.tail_bytes += bytes;
        ++report.replayed;
        break;
      }
      case DurableRecord::kModelState: {
        if (!mine || it->second.kind != SessionKind::kModel) break;
        auto parsed = ParseModelSnapshot(body, models);
        if (!parsed.ok()) return bad(parsed.status().message());
        if (parsed->model != it->second.model) {
          return bad("holds a context of another model than its session's");
        }
        it->second.feed.clear();  // replaced whole
        it->second.model_state = std::move(parsed->state);
        it->second.pending = parsed->pending;
        it->second.sampler = parsed->sampler;
        it->second.tail_bytes += bytes;
        ++report.replayed;
        break;
      }
      case DurableRecord::kDelete: {
        if (!mine) break;
        live.erase(it);
        ++report.replayed;
        break;
      }
      case DurableRecord::kTokens: {
        if (body.size() % 4 != 0 || body.empty()) {
          return bad("does not hold whole tokens");
        }
        if (!mine || it->second.kind != SessionKind::kModel) break;
        const int64_t vocab = it->second.model->config().vocab_size;
        for (size_t t = 0; t < body.size(); t += 4) {
          const int32_t token = GetLittleEndian<int32_t>(body.data() + t);
          if (token < 0 || token >= vocab) {
            return bad(absl::StrCat("token ", token,
                                    " is outside the model's vocabulary"));
          }
          it->second.feed.push_back(token);
        }
        it->second.tail_bytes += bytes;
        ++report.replayed;
        break;
      }
      case DurableRecord::kOwner: {
        if (body.empty() || body.size() > kMaxOwnerBytes) {
          return bad("does not name a tenant");
        }
        if (!mine) break;
        it->second.owner = std::string(body);
        it->second.tail_bytes += bytes;
        ++report.replayed;
        break;
      }
      case DurableRecord::kSampler: {
        if (body.size() != 16) return bad("is not a seed and a draw count");
        if (!mine || it->second.kind != SessionKind::kModel) break;
        it->second.sampler = {GetLittleEndian<uint64_t>(body.data()),
                              GetLittleEndian<uint64_t>(body.data() + 8), true};
        it->second.tail_bytes += bytes;
        ++report.replayed;
        break;
      }
      case DurableRecord::kStep: {
        // One request's steps: all of them or none (a DecodeBatch).
        if (body.size() < 4) return bad("too short");
        const uint32_t count = GetLittleEndian<uint32_t>(body.data());
        if (count == 0 || count != records.size()) {
          return bad(absl::StrCat("opens a request of ", count,
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
            return bad(absl::StrCat("step ", j, " of the request is missing"));
          }
          const uint64_t inc = GetLittleEndian<uint64_t>(m.payload.data());
          const absl::string_view floats =
              absl::string_view(m.payload).substr(12);
          auto mit = live.find(m.session_id);
          const bool member_live = mit != live.end() &&
                                   mit->second.incarnation == inc &&
                                   mit->second.kind == SessionKind::kAttention;
          if (!member_live || m.seq <= mit->second.covered) {
            // A session deleted meanwhile (or already in its file): its
            // input still decides whether the request was refused.
            for (size_t f = 0; f + 4 <= floats.size(); f += 4) {
              refused |=
                  !std::isfinite(GetLittleEndian<float>(floats.data() + f));
            }
            continue;
          }
          Replayed& r = mit->second;
          const uint64_t qk = uint64_t{r.spec.num_heads} * r.spec.key_dim;
          const uint64_t vv = uint64_t{r.spec.num_heads} * r.spec.value_dim;
          const uint64_t gates =
              uint64_t{r.spec.num_heads} * GatesPerHead(r.spec);
          const uint64_t betas = HasBeta(r.spec.rule) ? r.spec.num_heads : 0;
          if (floats.size() != (2 * qk + vv + gates + betas) * sizeof(float)) {
            return absl::DataLossError(absl::StrCat(
                "journal: record ", m.seq, " (step, session '", m.session_id,
                "') in ", journal_dir_,
                ": holds a token of another shape than its session's; "
                "refusing to start from it"));
          }
          if (r.attention == nullptr) {
            LINATTN_ASSIGN_OR_RETURN(r.attention, attention_of(r.spec));
          }
          const float* q = reinterpret_cast<const float*>(floats.data());
          SequenceInput token{q, q + qk, q + 2 * qk, 1};
          if (gates != 0) token.g = q + 2 * qk + vv;
          if (betas != 0) token.beta = q + 2 * qk + vv + gates;
          items.push_back(StepItem{r.attention.get(), &*r.state, token, {}});
          out_floats += vv;
          out_heads += r.spec.num_heads;
          r.tail_bytes +=
              m.payload.size() + m.session_id.size() + kRecordOverhead;
        }
        if (refused || items.empty()) break;
        // The outputs are not needed; the kernels write them.
        scratch_out.resize(out_floats + out_heads);
        scratch_available.resize(out_heads);
        float* o = scratch_out.data();
        uint8_t* a = scratch_available.data();
        for (StepItem& item : items) {
          const uint32_t heads = item.state->num_heads();
          const uint64_t vv = uint64_t{heads} * item.state->value_dim();
          item.out = SequenceOutput{o, o + vv, a};
          o += vv + heads;
          a += heads;
        }
        // A refused step changed nothing when it ran, and changes nothing
        // now.
        (void)StepBatch(items);
        report.replayed += items.size();
        break;
      }
      default:
        return bad("is of a type this server does not know");
    }
    return absl::OkStatus();
  };

  // The journal, one segment in memory at a time. A DecodeBatch request's
  // steps (consecutive records, the first holding their count) are applied
  // together once all are read.
  std::vector<JournalRecord> request;
  uint32_t request_steps = 0;
  LINATTN_ASSIGN_OR_RETURN(
      result.scan, sources.records([&](JournalRecord& rec) -> absl::Status {
        ++report.records;
        const bool step =
            rec.type == static_cast<uint8_t>(DurableRecord::kStep) &&
            rec.payload.size() >= 12;
        const uint32_t count =
            step ? GetLittleEndian<uint32_t>(rec.payload.data() + 8) : 0;
        if (request_steps > 0) {
          request.push_back(std::move(rec));
          if (!step || count != 0) {
            // A record inside a request's steps: apply() names it.
            return apply(request);
          }
          if (request.size() < request_steps) return absl::OkStatus();
          const absl::Status s = apply(request);
          request.clear();
          request_steps = 0;
          return s;
        }
        if (step && count > 1) {
          request_steps = count;
          request.push_back(std::move(rec));
          return absl::OkStatus();
        }
        return apply(std::span<const JournalRecord>(&rec, 1));
      }));
  JournalScan& scan = result.scan;
  if (request_steps > 0) {
    // The last request's steps were not all written: its group commit never
    // finished, so nothing of it was acknowledged. It goes with the torn
    // tail (one write, one segment).
    const JournalRecord& first = request.front();
    std::error_code ec;
    const uint64_t size = std::filesystem::file_size(first.file, ec);
    scan.dropped_tail_file = first.file;
    scan.dropped_tail_offset = first.offset;
    scan.dropped_tail_bytes = ec ? 1 : size - first.offset;
    scan.next_seq = first.seq;
  }
  report.dropped_tail_bytes = scan.dropped_tail_bytes;
  report.dropped_tail_file = scan.dropped_tail_file;
  report.dropped_tail_offset = scan.dropped_tail_offset;

  // Every session joins the table under its own id (and the incarnation
  // `incarnation_of` gives it).
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, r] : live) {
      r.incarnation = incarnation_of(r.incarnation);
      recovered_incarnations_[id] = r.incarnation;
    }
  }
  absl::Status adopted = replay_tokens();
  for (auto& [id, r] : live) {
    if (!adopted.ok()) break;
    absl::StatusOr<std::shared_ptr<Session>> session;
    if (r.kind == SessionKind::kModel) {
      session = table.AdoptModelSession(r.model, *std::move(r.model_state),
                                        r.pending, r.sampler, id, "session_id",
                                        Tenant::Named(r.owner));
    } else {
      session = table.AdoptSession(r.spec, *std::move(r.state), id,
                                   "session_id", Tenant::Named(r.owner));
    }
    if (!session.ok()) {
      adopted = absl::Status(session.status().code(),
                             absl::StrCat("recovery: session '", id,
                                          "': ", session.status().message()));
      break;
    }
    r.state_bytes = (*session)->state_bytes();
    ++(r.kind == SessionKind::kModel ? report.model_sessions
                                     : report.attention_sessions);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, r] : live) recovered_incarnations_.erase(id);
  }
  LINATTN_RETURN_IF_ERROR(adopted);
  for (const auto& [id, r] : live) {
    result.sessions[id] =
        RebuiltSession{r.incarnation, r.owner,        r.kind,
                       r.state_bytes, r.first_needed, r.tail_bytes};
  }
  return result;
}

}  // namespace linattn
