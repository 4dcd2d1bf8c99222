#include "core/engine/maintenance.h"

#include <algorithm>
#include <memory>

namespace linattn {

namespace {
// Snapshots are taken and written in pieces of at most this much state, so
// that snapshotting every session at once (the drain) holds one piece in
// memory, not a second copy of every state.
constexpr uint64_t kSnapshotPieceBytes = uint64_t{64} << 20;
// A piece's sessions whose queues are held up (a Generate whose client reads
// slowly) do not hold up the rest: what is not taken in time waits for a
// later pass.
constexpr std::chrono::seconds kSnapshotWait{10};
}  // namespace

Maintenance::Maintenance(SessionManager* table, DurableStore* store, Take take,
                         std::chrono::milliseconds ttl, Periods periods,
                         EngineEvents* events)
    : table_(table), store_(store), take_(std::move(take)), events_(events) {
  if (ttl.count() > 0) {
    threads_.emplace_back([this, ttl] { EvictionLoop(ttl); });
  }
  if (store_ == nullptr) return;
  std::chrono::milliseconds upkeep = periods.upkeep;
  if (store_->options().durability == Durability::kBatch) {
    upkeep = std::min(upkeep, store_->options().sync_interval);
  }
  threads_.emplace_back([this, upkeep] { UpkeepLoop(upkeep); });
  if (Replica* replica = store_->replica()) {
    // Heartbeats on a thread of their own (four per lease time), so that a
    // long snapshot pass never lets the lease lapse.
    const auto beat = replica->heartbeat_period();
    threads_.emplace_back(
        [this, replica, beat] { HeartbeatLoop(*replica, beat); });
    threads_.emplace_back([this, replica] { HandOverLoop(*replica); });
  }
}

Maintenance::~Maintenance() { Stop(); }

void Maintenance::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

bool Maintenance::Sleep(std::chrono::milliseconds period) {
  std::unique_lock<std::mutex> lock(mu_);
  return !stop_cv_.wait_for(lock, period, [this] { return stopping_; });
}

void Maintenance::Report(const char* what, const absl::Status& status,
                         bool& failing) {
  if (events_ != nullptr && !status.ok() && !failing) {
    events_->StoreFailing(what, status);
  }
  if (events_ != nullptr && status.ok() && failing) {
    events_->StoreRecovered(what);
  }
  failing = !status.ok();
}

void Maintenance::EvictionLoop(std::chrono::milliseconds ttl) {
  const auto period = std::clamp(ttl / 4, std::chrono::milliseconds(10),
                                 std::chrono::milliseconds(1000));
  while (Sleep(period)) {
    const SessionManager::Evicted n = table_->EvictIdle(ttl);
    if (events_ != nullptr) events_->Evicted(n.attention, n.model, ttl);
  }
}

void Maintenance::UpkeepLoop(std::chrono::milliseconds period) {
  bool failing = false;
  while (Sleep(period)) {
    // A batch sync that fell due, and deletions of evicted sessions.
    absl::Status s = store_->Tick();
    if (s.ok()) {
      const std::vector<DurableStore::Due> due = store_->DueForSnapshot(256);
      Snapshot(due);
      s = store_->Maintain();
    }
    Report("upkeep", s, failing);
  }
}

void Maintenance::HeartbeatLoop(Replica& replica,
                                std::chrono::milliseconds period) {
  bool failing = false;
  while (Sleep(period)) {
    auto lost = replica.Beat();
    Report("lease", lost.status(), failing);
    if (!lost.ok() || lost->empty()) continue;
    if (events_ != nullptr) events_->TakenOver(lost->size());
    (void)replica.HandOver(*lost, /*release=*/false);
  }
}

void Maintenance::HandOverLoop(Replica& replica) {
  bool failing = false;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
    }
    auto wanted = replica.AwaitWanted();
    Report("wants", wanted.status(), failing);
    if (!wanted.ok()) {
      if (!Sleep(std::chrono::milliseconds(200))) return;
      continue;
    }
    if (wanted->empty()) continue;
    // Asked for by other replicas: snapshot (so the next owner replays
    // little), then released.
    const size_t written = Snapshot(store_->DueOf(*wanted));
    const absl::Status s = replica.HandOver(*wanted, /*release=*/true);
    if (events_ != nullptr) events_->HandedOver(wanted->size(), written, s);
  }
}

void Maintenance::FinalSnapshots() {
  if (store_ == nullptr) return;
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = store_->Tick();
  const std::vector<DurableStore::Due> all = store_->AllSessions();
  const size_t written = s.ok() ? Snapshot(all) : 0;
  if (s.ok()) s = store_->Maintain();
  if (s.ok() && store_->replica() != nullptr) {
    s = store_->replica()->DropLease();
  }
  if (events_ != nullptr) {
    events_->DrainSnapshots(
        written, all.size(),
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count(),
        s);
  }
}

size_t Maintenance::Snapshot(std::span<const DurableStore::Due> sessions) {
  size_t written = 0;
  for (size_t first = 0; first < sessions.size();) {
    size_t last = first;
    uint64_t bytes = 0;
    while (last < sessions.size() &&
           (last == first ||
            bytes + sessions[last].state_bytes <= kSnapshotPieceBytes)) {
      bytes += sessions[last++].state_bytes;
    }
    written += SnapshotPiece(sessions.subspan(first, last - first));
    first = last;
  }
  return written;
}

size_t Maintenance::SnapshotPiece(std::span<const DurableStore::Due> piece) {
  // Each blob is taken on the compute worker, in its session's order with
  // its other requests, together with the journal position it covers.
  struct Results {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<DurableStore::Taken> taken;
    size_t outstanding = 0;
    bool closed = false;  // the wait is over: late blobs are dropped
  };
  auto results = std::make_shared<Results>();
  results->outstanding = piece.size();
  DurableStore* const store = store_;
  for (const DurableStore::Due& due : piece) {
    take_(due, [results, store, due](absl::StatusOr<std::string> blob,
                                     uint64_t seq) {
      std::lock_guard<std::mutex> lock(results->mu);
      if (!blob.ok() || results->closed) {
        // It may be listed again (a late one once its request has run).
        store->SnapshotAbandoned(due);
      } else {
        results->taken.push_back({due, seq, *std::move(blob)});
      }
      --results->outstanding;
      results->cv.notify_all();
    });
  }
  std::vector<DurableStore::Taken> taken;
  {
    std::unique_lock<std::mutex> lock(results->mu);
    results->cv.wait_for(lock, kSnapshotWait,
                         [&] { return results->outstanding == 0; });
    results->closed = true;
    taken.swap(results->taken);
  }
  if (absl::Status s = store->WriteSnapshots(taken); !s.ok()) {
    if (events_ != nullptr) events_->StoreFailing("snapshots", s);
    return 0;
  }
  return taken.size();
}

}  // namespace linattn
