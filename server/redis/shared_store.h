// SharedStore: sessions' records and snapshots in a store every replica
// reaches, with ownership fenced by epochs, so that several replicas can
// serve sessions and any of them can resume any session (docs/design.md §4,
// "Replicas and the shared store"). The replica's record log and gate
// (server/replica/) are written against this interface; the
// implementation is Redis's (server/redis/redis_shared_store.h, the only
// code that links hiredis),
// whose keys are ({id} is a Redis Cluster hash tag: a session's keys share
// a slot):
//   la:epoch                   the epoch counter (INCR)
//   la:replica:<name>          a replica's lease (its name, PX lease time),
//                              renewed by its heartbeat
//   la:replica:<name>:wants    ids other replicas asked it to hand over
//                              (a list: its holder waits on it in BLPOP)
//   la:s:{<id>}:meta           hash: epoch, owner (a replica's name, or ""
//                              once released), base (the number of the
//                              session's records its snapshot covers)
//   la:s:{<id>}:log            list: the session's records after its
//                              snapshot, each a record type (u8) then the
//                              record's body (incarnation 0, payload)
//   la:s:{<id>}:snap           its snapshot (incarnation 0, then the blob)
//
// Ownership: the replica that creates a session owns it, with a new epoch.
// A session is held while its owner's lease lives. Another replica that is
// asked for it takes it over (Acquire) once the owner's lease has lapsed
// or the owner released it (which it does when asked, through its wants
// list, and for every session at shutdown), taking a new epoch. Every
// write names the writer's epoch of each session and is refused whole if
// one is not the session's current epoch (the session was taken over):
// a replica that was paused or cut off can never write over a newer owner.
#ifndef LINATTN_SERVER_REDIS_SHARED_STORE_H_
#define LINATTN_SERVER_REDIS_SHARED_STORE_H_

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace linattn {

struct SharedStoreOptions {
  std::string url;      // redis://HOST:PORT[/DB]
  std::string replica;  // this replica's name (unique per process)
  std::chrono::milliseconds lease{2000};
  std::chrono::milliseconds timeout{2000};  // of one round trip
};

class SharedStore {
 public:
  virtual ~SharedStore() = default;

  // One session's part of a commit: its records in order, after creating it
  // (create) and/or before deleting it (remove).
  struct Op {
    std::string id;
    bool create = false;
    bool remove = false;
    uint64_t epoch = 0;                // the writer's epoch (not for a create)
    std::vector<std::string> records;  // type byte, then body
  };
  struct OpResult {
    bool exists = false;  // a create of an id the store holds: not written
    bool lost = false;    // a delete of a session taken over: not written
    uint64_t epoch = 0;   // a create's new epoch
  };
  // One round trip: every op is written, or (a session whose epoch is not
  // the writer's: ABORTED, its id in `fenced`) none is. UNAVAILABLE when
  // the store cannot be reached (nothing is known of whether the commit
  // landed).
  virtual absl::StatusOr<std::vector<OpResult>> Commit(
      std::span<const Op> ops, std::vector<std::string>* fenced) = 0;

  struct Snapshot {
    std::string id;
    uint64_t epoch = 0;
    uint64_t covered = 0;  // the number of the session's records it holds
    std::string blob;      // incarnation 0, then the snapshot
  };
  // Replaces each session's snapshot and drops the records it covers, one
  // round trip for all; a session taken over keeps its own (`written`
  // says which were).
  virtual absl::Status WriteSnapshots(std::span<const Snapshot> snapshots,
                                      std::vector<bool>* written) = 0;

  // Renews this replica's lease.
  virtual absl::Status Heartbeat() = 0;
  // The ids other replicas asked this one to hand over, once there are any
  // (or none after kWantsBlock).
  static constexpr std::chrono::milliseconds kWantsBlock{1000};
  virtual absl::StatusOr<std::vector<std::string>> AwaitWants() = 0;
  // Gives up the lease (shutdown): every session it held may be taken at
  // once.
  virtual absl::Status DropLease() = 0;
  // Marks each session released by this replica (if still its epoch).
  virtual absl::Status Release(
      std::span<const std::pair<std::string, uint64_t>> sessions) = 0;
  // The current epoch of each session (0: none).
  virtual absl::StatusOr<std::vector<uint64_t>> Epochs(
      std::span<const std::string> ids) = 0;

  struct Acquired {
    enum class Outcome { kTaken, kHeld, kMissing } outcome = Outcome::kMissing;
    uint64_t epoch = 0;
    std::chrono::milliseconds held_for{0};  // kHeld: the owner's lease left
    std::string holder;
    uint64_t base = 0;                 // records the snapshot covers
    std::string snapshot;              // empty: none
    std::vector<std::string> records;  // type byte, then body
  };
  // Takes session `id` over if it is not held, with a new epoch, and returns
  // its snapshot and records; asks its holder to hand it over otherwise.
  virtual absl::StatusOr<Acquired> Acquire(absl::string_view id) = 0;

  virtual const SharedStoreOptions& options() const = 0;
  std::string url() const { return options().url; }
};

}  // namespace linattn

#endif  // LINATTN_SERVER_REDIS_SHARED_STORE_H_
