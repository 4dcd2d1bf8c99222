// RedisSharedStore: the shared state store in Redis (the keys and the
// ownership protocol are server/redis/shared_store.h's). Commits, snapshots,
// takeovers and releases are Lua scripts, each one round trip, so that an
// epoch check and the writes it guards are one atomic step in Redis.
//
// Threading: safe for concurrent use. One connection for commits (the
// compute worker and the request threads that commit creates and deletes),
// one for the maintenance thread (heartbeats, snapshots), one for
// takeovers, one for the thread that waits for other replicas' wants: none
// waits behind another's round trip.
#ifndef LINATTN_SERVER_REDIS_REDIS_SHARED_STORE_H_
#define LINATTN_SERVER_REDIS_REDIS_SHARED_STORE_H_

#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/redis/shared_store.h"
#include "server/redis/redis_client.h"

namespace linattn {

class RedisSharedStore final : public SharedStore {
 public:
  // Connects to options.url (redis://HOST:PORT[/DB]) and takes this
  // replica's lease before anything is served: INVALID_ARGUMENT for a bad
  // URL or an unnamed replica, UNAVAILABLE when Redis cannot be reached.
  static absl::StatusOr<std::unique_ptr<SharedStore>> Open(
      SharedStoreOptions options);

  absl::StatusOr<std::vector<OpResult>> Commit(
      std::span<const Op> ops, std::vector<std::string>* fenced) override;
  absl::Status WriteSnapshots(std::span<const Snapshot> snapshots,
                              std::vector<bool>* written) override;
  absl::Status Heartbeat() override;
  absl::StatusOr<std::vector<std::string>> AwaitWants() override;
  absl::Status DropLease() override;
  absl::Status Release(
      std::span<const std::pair<std::string, uint64_t>> sessions) override;
  absl::StatusOr<std::vector<uint64_t>> Epochs(
      std::span<const std::string> ids) override;
  absl::StatusOr<Acquired> Acquire(absl::string_view id) override;
  const SharedStoreOptions& options() const override { return options_; }

 private:
  RedisSharedStore(SharedStoreOptions options, RedisEndpoint endpoint);
  static std::string Meta(absl::string_view id);
  static std::string Log(absl::string_view id);
  static std::string Snap(absl::string_view id);
  std::string Lease() const;

  const SharedStoreOptions options_;
  std::unique_ptr<RedisClient> commits_;
  std::unique_ptr<RedisClient> maintenance_;
  std::unique_ptr<RedisClient> takeovers_;
  std::unique_ptr<RedisClient> wants_;  // blocks in AwaitWants
  size_t commit_script_ = 0, snapshot_script_ = 0, take_wants_script_ = 0,
         acquire_script_ = 0, release_script_ = 0;
};

}  // namespace linattn

#endif  // LINATTN_SERVER_REDIS_REDIS_SHARED_STORE_H_
