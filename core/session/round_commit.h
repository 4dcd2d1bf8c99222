// RoundCommit: the one commit protocol of both schedulers. A round of the
// attention Scheduler or an iteration of the GenerationEngine changes many
// sessions for many requests; with a durable store (docs/design.md §4,
// "Durable sessions") those changes are recorded, as one group commit,
// before any of them is made or acknowledged:
//
//   RoundCommit commit(store);          // null store: memory only
//   const uint32_t n = commit.Begin();  // a request's records follow
//   commit.records().AddStep(session, token, 1);
//   commit.Commit();                    // one write (and sync) for all
//   if (absl::Status s = commit.Outcome(n); !s.ok()) { /* not made */ }
//
// Each request's outcome is one of three: committed (OK), handed over
// (ABORTED: with a shared store, a session of the request was handed to
// another replica while it waited, so none of its records was written and
// nothing of it may be made here; the rest of the round commits), or
// failed (the commit's error: nothing of the round was written). Without a
// store every request is committed.
//
// Not thread-safe: one round builds and commits it.
#ifndef LINATTN_CORE_SESSION_ROUND_COMMIT_H_
#define LINATTN_CORE_SESSION_ROUND_COMMIT_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/session/durable_store.h"

namespace linattn {

// The refusal of a request whose session another replica took while it was
// under way: nothing of it after that is kept here.
absl::Status HandedOverError();

class RoundCommit {
 public:
  explicit RoundCommit(DurableStore* store = nullptr) : store_(store) {}
  RoundCommit(RoundCommit&&) = default;
  RoundCommit& operator=(RoundCommit&&) = default;

  bool durable() const { return store_ != nullptr; }
  // Opens the next request (numbered from 0); the records added next
  // belong to it.
  uint32_t Begin();
  // Where the open request's records go.
  DurableStore::Group& records() { return group_; }
  // Whether Commit has anything to write: records, or creates and deletes
  // the session table staged.
  bool HasWork() const;

  // Writes what the table staged, then every request's records, once.
  void Commit();
  // After Commit: OK (committed), ABORTED (handed over) or the commit's
  // error.
  absl::Status Outcome(uint32_t request) const;
  // After Commit: the commit's own error (OK when it was written, some
  // requests handed over or not).
  const absl::Status& status() const { return status_; }

 private:
  DurableStore* store_;
  DurableStore::Group group_;
  uint32_t requests_ = 0;
  absl::Status status_;
  std::vector<uint32_t> refused_;  // handed over, ascending
};

}  // namespace linattn

#endif  // LINATTN_CORE_SESSION_ROUND_COMMIT_H_
