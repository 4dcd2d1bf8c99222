// Ownership: what a replica holds in the shared store (docs/design.md §4,
// "Replicas and the shared store"), shared by its record log (whose every
// write names the session's epoch) and its gate (which takes sessions over
// and lets them go). Per session incarnation: the epoch this replica holds
// it under and the number of its records the store holds; and the latest
// sessions handed over, whose records still queued here must not be
// written.
//
// Thread-safe; a leaf lock (taken under the table's and the store's).
#ifndef LINATTN_SERVER_REPLICA_OWNERSHIP_H_
#define LINATTN_SERVER_REPLICA_OWNERSHIP_H_

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"

namespace linattn {

class Ownership {
 public:
  using Key = std::pair<std::string, uint64_t>;  // id, incarnation
  struct Owned {
    uint64_t epoch = 0;
    uint64_t appended = 0;  // the session's records the store holds
  };

  // The session is this replica's under `epoch`, with `appended` records.
  void Own(const Key& session, uint64_t epoch, uint64_t appended);
  // `n` more records of it were written.
  void Appended(const Key& session, uint64_t n);
  std::optional<Owned> Find(const Key& session) const;
  // Its delete was written.
  void Forget(const Key& session);
  // Another replica serves it now: forgotten, and remembered as handed
  // over (the latest kMaxHandedOver).
  void HandedOver(const Key& session);

  // What is known of each of `sessions` at one moment: held (its epoch),
  // handed over, or neither (not written yet, or deleted). A commit plans
  // from one such view, so a hand-over between its checks cannot make it
  // drop records of a request it did not refuse.
  struct View {
    std::map<Key, Owned> held;
    std::set<Key> handed_over;
  };
  View Look(std::span<const Key> sessions) const;

  struct Held {
    Key session;
    uint64_t epoch = 0;
  };
  // Every session held.
  std::vector<Held> All() const;
  // The sessions held of these ids.
  std::vector<Key> Of(std::span<const std::string> ids) const;

 private:
  static constexpr size_t kMaxHandedOver = 4096;
  mutable std::mutex mu_;
  std::map<Key, Owned> owned_ ABSL_GUARDED_BY(mu_);
  std::set<Key> handed_over_ ABSL_GUARDED_BY(mu_);
  std::deque<Key> handed_over_order_ ABSL_GUARDED_BY(mu_);
};

}  // namespace linattn

#endif  // LINATTN_SERVER_REPLICA_OWNERSHIP_H_
