#include "server/replica/shared_record_log.h"

#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "core/session/round_commit.h"

namespace linattn {

namespace {

// A record as the store keeps it: its type, then its body with incarnation
// 0 (the store holds one incarnation of a session) and, for a step, a count
// of 1 (its request was checked whole before it was recorded).
std::string StoredRecord(const Record& r) {
  std::string out(1, static_cast<char>(r.type));
  out += r.Body(0, 1);
  return out;
}

}  // namespace

struct SharedRecordLog::Pending {
  SharedStore::Op op;
  uint64_t incarnation = 0;
  uint64_t create_ticket = 0;
  uint64_t bytes = 0;
  bool dropped = false;  // created and deleted here: nothing to write
};

SharedRecordLog::SharedRecordLog(std::unique_ptr<SharedStore> shared)
    : shared_(std::move(shared)), gate_(shared_.get(), &ownership_) {}

absl::Status SharedRecordLog::Recover(Replayer&, SessionManager& table,
                                      DurableStore& store) {
  // Nothing to read: a session is loaded when it is first asked for.
  gate_.Attach(&table, &store);
  table.set_gate(&gate_);
  return absl::OkStatus();
}

void SharedRecordLog::OnRemoved(const std::string& id, uint64_t incarnation,
                                SessionObserver::Removal why) {
  // Another replica serves it now: it is not deleted, and records of it
  // still queued here must not be written. (A deleted session's epoch is
  // kept for its delete.)
  if (why == SessionObserver::Removal::kHandedOver) {
    ownership_.HandedOver({id, incarnation});
  }
}

uint64_t SharedRecordLog::CoveredPosition(const std::string& id,
                                          uint64_t incarnation) const {
  const auto owned = ownership_.Find({id, incarnation});
  return owned.has_value() ? owned->appended : 0;
}

std::vector<std::vector<SharedRecordLog::Pending>> SharedRecordLog::Plan(
    std::span<const StagedChange> staged, std::span<const Record> records,
    const std::set<uint32_t>& out, const Ownership::View& view) const {
  auto held = [&](const Ownership::Key& key) -> const Ownership::Owned* {
    auto it = view.held.find(key);
    return it == view.held.end() ? nullptr : &it->second;
  };
  // One op per session (incarnation): its create, its records in order, its
  // delete.
  std::vector<std::vector<Pending>> batches(1);
  std::map<Ownership::Key, size_t> where;      // in the last batch
  std::set<std::string, std::less<>> removed;  // in the last batch
  for (const StagedChange& st : staged) {
    const Ownership::Key key{st.id, st.incarnation};
    if (st.create) {
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
      for (const Record& r : CreateRecords(*st.session, 0)) {
        p.op.records.push_back(StoredRecord(r));
        p.bytes += p.op.records.back().size();
      }
      where[key] = batches.back().size();
      batches.back().push_back(std::move(p));
      continue;
    }
    removed.insert(st.id);
    if (auto found = where.find(key); found != where.end()) {
      Pending& p = batches.back()[found->second];
      if (p.op.create) {
        p.dropped = true;
      } else {
        p.op.remove = true;
        p.op.records.clear();
      }
      continue;
    }
    const Ownership::Owned* owned = held(key);
    if (owned == nullptr) continue;  // its create never reached the store
    Pending p;
    p.op.id = st.id;
    p.op.remove = true;
    p.op.epoch = owned->epoch;
    p.incarnation = st.incarnation;
    where[key] = batches.back().size();
    batches.back().push_back(std::move(p));
  }
  for (const Record& r : records) {
    if (out.count(r.request) != 0) continue;
    const Ownership::Key key{r.id, r.incarnation};
    if (auto found = where.find(key); found != where.end()) {
      Pending& p = batches.back()[found->second];
      if (p.op.remove || p.dropped) continue;
      p.op.records.push_back(StoredRecord(r));
      p.bytes += p.op.records.back().size();
      continue;
    }
    const Ownership::Owned* owned = held(key);
    if (owned == nullptr) continue;  // deleted meanwhile
    Pending p;
    p.op.id = r.id;
    p.op.epoch = owned->epoch;
    p.incarnation = r.incarnation;
    p.op.records.push_back(StoredRecord(r));
    p.bytes = p.op.records.back().size();
    where[key] = batches.back().size();
    batches.back().push_back(std::move(p));
  }
  return batches;
}

RecordLog::CommitResult SharedRecordLog::Commit(
    std::span<const StagedChange> staged, std::span<const Record> records,
    bool take_refusals) {
  CommitResult result;
  // One view of every session the commit touches.
  std::vector<Ownership::Key> keys;
  keys.reserve(staged.size() + records.size());
  for (const StagedChange& st : staged) keys.push_back({st.id, st.incarnation});
  for (const Record& r : records) keys.push_back({r.id, r.incarnation});
  const Ownership::View view = ownership_.Look(keys);
  // Requests with a record of a session handed over are left out whole.
  std::set<uint32_t> out;
  for (const Record& r : records) {
    if (view.handed_over.count({r.id, r.incarnation}) != 0) {
      out.insert(r.request);
    }
  }
  if (!out.empty()) {
    if (!take_refusals) {
      result.status = HandedOverError();
      return result;
    }
    result.refused.assign(out.begin(), out.end());
  }
  std::vector<std::vector<Pending>> batches = Plan(staged, records, out, view);
  for (std::vector<Pending>& batch : batches) {
    if (!Write(batch, result)) break;
  }
  return result;
}

bool SharedRecordLog::Write(std::vector<Pending>& batch, CommitResult& result) {
  std::vector<SharedStore::Op> ops;
  std::vector<Pending*> sent;
  for (Pending& p : batch) {
    if (p.dropped) continue;
    ops.push_back(std::move(p.op));
    sent.push_back(&p);
  }
  if (ops.empty()) return true;
  std::vector<std::string> fenced;
  ++result.writes;
  auto written = shared_->Commit(ops, &fenced);
  if (!written.ok()) {
    result.status = written.status();
    // Sessions another replica took over leave the table. After a commit
    // whose outcome is not known (the connection failed), every session it
    // carried leaves too: the store, not this replica's memory, then says
    // what they hold, and their next request loads them from it.
    if (absl::IsAborted(result.status)) {
      result.leave = ownership_.Of(fenced);
      result.taken_over = true;
    } else {
      for (size_t i = 0; i < ops.size(); ++i) {
        if (!ops[i].remove) {
          result.leave.push_back({ops[i].id, sent[i]->incarnation});
        }
      }
    }
    return false;
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    const SharedStore::Op& op = ops[i];
    const Pending& p = *sent[i];
    const Ownership::Key key{op.id, p.incarnation};
    if (op.remove) {
      ownership_.Forget(key);
      result.written.push_back({op.id, p.incarnation, 0, false, 1});
      continue;
    }
    if ((*written)[i].exists) {
      result.refused_creates.push_back(
          {p.create_ticket,
           absl::AlreadyExistsError(absl::StrCat(
               "session_id: '", op.id,
               "' is taken (a session of that id lives in the shared state "
               "store)"))});
      continue;
    }
    if (op.create) {
      ownership_.Own(key, (*written)[i].epoch, op.records.size());
    } else {
      ownership_.Appended(key, op.records.size());
    }
    result.written.push_back(
        {op.id, p.incarnation, p.bytes, op.create, op.records.size()});
  }
  return true;
}

absl::Status SharedRecordLog::WriteSnapshots(
    std::span<const SnapshotToStore> taken, std::vector<bool>& written) {
  written.assign(taken.size(), false);
  std::vector<SharedStore::Snapshot> blobs;
  std::vector<size_t> index;
  for (size_t i = 0; i < taken.size(); ++i) {
    const SnapshotToStore& t = taken[i];
    const auto owned = ownership_.Find({t.id, t.incarnation});
    if (!owned.has_value()) continue;
    blobs.push_back(
        {t.id, owned->epoch, t.covered,
         IncarnationBytes(0) + OwnerSection(t.owner) + std::string(t.blob)});
    index.push_back(i);
  }
  if (blobs.empty()) return absl::OkStatus();
  std::vector<bool> stored;
  if (absl::Status s = shared_->WriteSnapshots(blobs, &stored); !s.ok()) {
    return s;
  }
  for (size_t j = 0; j < index.size(); ++j) written[index[j]] = stored[j];
  return absl::OkStatus();
}

}  // namespace linattn
