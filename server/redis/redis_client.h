// RedisClient: one connection to a Redis server (hiredis), for the shared
// state store (docs/design.md §4, "Replicas and the shared store").
//
// Every call sends its commands and then reads their replies: a pipeline of
// any length is one round trip. A connection that fails (the server went
// away, a timeout) is dropped and made again by the next call, and the
// Lua scripts it was given are loaded again there (a restarted Redis has
// forgotten them). Calls are serialized by the client's own lock; a thread
// that must not wait behind another uses a client of its own.
#ifndef LINATTN_SERVER_REDIS_REDIS_CLIENT_H_
#define LINATTN_SERVER_REDIS_REDIS_CLIENT_H_

#include <chrono>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

struct redisContext;

namespace linattn {

struct RedisEndpoint {
  std::string host;
  int port = 6379;
  int db = 0;
  std::string text;  // as given, for messages
};
// "redis://HOST[:PORT][/DB]"; INVALID_ARGUMENT naming what is wrong.
absl::StatusOr<RedisEndpoint> ParseRedisUrl(absl::string_view url);

struct RedisReply {
  enum class Type { kNil, kString, kStatus, kInteger, kArray, kError };
  Type type = Type::kNil;
  std::string str;  // kString, kStatus, kError
  int64_t integer = 0;
  std::vector<RedisReply> elements;  // kArray
  bool is_error() const { return type == Type::kError; }
};

class RedisClient {
 public:
  RedisClient(RedisEndpoint endpoint, std::chrono::milliseconds timeout);
  ~RedisClient();
  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;

  // A script every connection loads (SCRIPT LOAD); returns its index for
  // Eval. Call before the first command.
  size_t AddScript(std::string source);

  // A command, its arguments binary-safe.
  using Command = std::vector<std::string>;
  // Sends every command, then reads every reply, in order: one round
  // trip. A reply that is a Redis error is a reply (kError), not a failed
  // call; UNAVAILABLE when the connection failed (nothing is known of
  // which commands ran).
  absl::StatusOr<std::vector<RedisReply>> Pipeline(
      std::span<const Command> commands);
  absl::StatusOr<RedisReply> Run(Command command);
  // EVALSHA of script `script` (AddScript) with `keys` and `args`, as a
  // Command for Pipeline.
  Command Eval(size_t script, std::vector<std::string> keys,
               std::vector<std::string> args) const;

  const RedisEndpoint& endpoint() const { return endpoint_; }

 private:
  absl::Status ConnectLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RedisEndpoint endpoint_;
  const std::chrono::milliseconds timeout_;
  std::vector<std::string> scripts_;
  std::vector<std::string> shas_;  // SHA-1 of each script, hex
  std::mutex mu_;
  redisContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace linattn

#endif  // LINATTN_SERVER_REDIS_REDIS_CLIENT_H_
