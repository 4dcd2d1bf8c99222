#include "server/redis/redis_shared_store.h"

#include <charconv>
#include <set>

#include "absl/strings/str_cat.h"
#include "core/util/status_macros.h"

namespace linattn {
namespace {

// KEYS[1]: la:epoch; then per op: meta, log, snap.
// ARGV[1]: the writer's name; ARGV[2]: the number of ops; then per op:
// flags ('c' create, 'd' delete), the writer's epoch, the number of
// records, the records.
// Returns {'ok', {per op: new epoch | 0 | -1 exists | -2 lost}} or
// {'fenced', {op indexes}} having written nothing.
constexpr char kCommitScript[] = R"lua(
local owner = ARGV[1]
local nops = tonumber(ARGV[2])
local ops = {}
local a = 3
for i = 1, nops do
  local k = 1 + 3 * (i - 1)
  local op = {flags = ARGV[a], epoch = ARGV[a + 1], n = tonumber(ARGV[a + 2]),
              first = a + 3, meta = KEYS[k + 1], log = KEYS[k + 2],
              snap = KEYS[k + 3]}
  op.create = string.find(op.flags, 'c', 1, true) ~= nil
  op.delete = string.find(op.flags, 'd', 1, true) ~= nil
  a = a + 3 + op.n
  ops[i] = op
end
local fenced = {}
for i, op in ipairs(ops) do
  if op.create then
    if redis.call('EXISTS', op.meta) == 1 then op.skip = -1 end
  elseif redis.call('HGET', op.meta, 'epoch') ~= op.epoch then
    if op.delete then op.skip = -2 else fenced[#fenced + 1] = i end
  end
end
if #fenced > 0 then return {'fenced', fenced} end
local out = {}
for i, op in ipairs(ops) do
  if op.skip then
    out[i] = op.skip
  elseif op.delete then
    redis.call('DEL', op.meta, op.log, op.snap)
    out[i] = 0
  else
    local epoch = op.epoch
    if op.create then
      epoch = redis.call('INCR', KEYS[1])
      redis.call('HSET', op.meta, 'epoch', epoch, 'owner', owner, 'base', 0)
    end
    local j = op.first
    local last = op.first + op.n - 1
    while j <= last do
      local e = math.min(last, j + 999)
      redis.call('RPUSH', op.log, unpack(ARGV, j, e))
      j = e + 1
    end
    out[i] = tonumber(epoch)
  end
end
return {'ok', out}
)lua";

// KEYS: meta, log, snap. ARGV: epoch, blob, covered.
constexpr char kSnapshotScript[] = R"lua(
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return 0 end
local base = tonumber(redis.call('HGET', KEYS[1], 'base'))
local covered = tonumber(ARGV[3])
if covered < base then return 1 end
redis.call('SET', KEYS[3], ARGV[2])
redis.call('LTRIM', KEYS[2], covered - base, -1)
redis.call('HSET', KEYS[1], 'base', covered)
return 1
)lua";

// KEYS: the wants list. Takes every id it holds.
constexpr char kTakeWantsScript[] = R"lua(
local wants = redis.call('LRANGE', KEYS[1], 0, -1)
redis.call('DEL', KEYS[1])
return wants
)lua";

// KEYS: meta, log, snap, la:epoch. ARGV: name, lease ms, id.
constexpr char kAcquireScript[] = R"lua(
local owner = redis.call('HGET', KEYS[1], 'owner')
if not owner then return {'missing'} end
if owner ~= '' and owner ~= ARGV[1] then
  local lease = 'la:replica:' .. owner
  local left = redis.call('PTTL', lease)
  if left > 0 then
    redis.call('RPUSH', lease .. ':wants', ARGV[3])
    redis.call('PEXPIRE', lease .. ':wants', ARGV[2])
    return {'held', left, owner}
  end
end
local e = redis.call('INCR', KEYS[4])
redis.call('HSET', KEYS[1], 'epoch', e, 'owner', ARGV[1])
local base = redis.call('HGET', KEYS[1], 'base')
local snap = redis.call('GET', KEYS[3]) or ''
return {'taken', e, base, snap, redis.call('LRANGE', KEYS[2], 0, -1)}
)lua";

// KEYS: meta. ARGV: epoch.
constexpr char kReleaseScript[] = R"lua(
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'owner', '')
return 1
)lua";

bool ToU64(absl::string_view s, uint64_t* out) {
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size();
}

absl::Status Unexpected(absl::string_view what, const RedisReply& r) {
  return absl::InternalError(
      absl::StrCat("state store: unexpected reply to ", what,
                   r.is_error() ? absl::StrCat(": ", r.str) : std::string()));
}

}  // namespace

RedisSharedStore::RedisSharedStore(SharedStoreOptions options,
                                   RedisEndpoint endpoint)
    : options_(std::move(options)) {
  for (auto* client : {&commits_, &maintenance_, &takeovers_, &wants_}) {
    // The wants connection blocks up to kWantsBlock in BLPOP.
    *client = std::make_unique<RedisClient>(
        endpoint,
        client == &wants_ ? options_.timeout + kWantsBlock : options_.timeout);
    commit_script_ = (*client)->AddScript(kCommitScript);
    snapshot_script_ = (*client)->AddScript(kSnapshotScript);
    take_wants_script_ = (*client)->AddScript(kTakeWantsScript);
    acquire_script_ = (*client)->AddScript(kAcquireScript);
    release_script_ = (*client)->AddScript(kReleaseScript);
  }
}

absl::StatusOr<std::unique_ptr<SharedStore>> RedisSharedStore::Open(
    SharedStoreOptions options) {
  auto endpoint = ParseRedisUrl(options.url);
  if (!endpoint.ok()) return endpoint.status();
  if (options.replica.empty()) {
    return absl::InvalidArgumentError("state store: the replica needs a name");
  }
  std::unique_ptr<RedisSharedStore> store(
      new RedisSharedStore(std::move(options), *std::move(endpoint)));
  // Reachable, and this replica's lease taken, before anything is served.
  LINATTN_RETURN_IF_ERROR(store->Heartbeat());
  return std::unique_ptr<SharedStore>(std::move(store));
}

std::string RedisSharedStore::Meta(absl::string_view id) {
  return absl::StrCat("la:s:{", id, "}:meta");
}
std::string RedisSharedStore::Log(absl::string_view id) {
  return absl::StrCat("la:s:{", id, "}:log");
}
std::string RedisSharedStore::Snap(absl::string_view id) {
  return absl::StrCat("la:s:{", id, "}:snap");
}
std::string RedisSharedStore::Lease() const {
  return absl::StrCat("la:replica:", options_.replica);
}

absl::StatusOr<std::vector<SharedStore::OpResult>> RedisSharedStore::Commit(
    std::span<const Op> ops, std::vector<std::string>* fenced) {
  std::vector<std::string> keys{"la:epoch"};
  std::vector<std::string> args{options_.replica, std::to_string(ops.size())};
  keys.reserve(1 + 3 * ops.size());
  for (const Op& op : ops) {
    keys.push_back(Meta(op.id));
    keys.push_back(Log(op.id));
    keys.push_back(Snap(op.id));
    args.push_back(
        absl::StrCat(op.create ? "c" : "", op.remove ? "d" : "", "-"));
    args.push_back(std::to_string(op.epoch));
    args.push_back(std::to_string(op.records.size()));
    for (const std::string& r : op.records) args.push_back(r);
  }
  auto reply = commits_->Run(
      commits_->Eval(commit_script_, std::move(keys), std::move(args)));
  if (!reply.ok()) return reply.status();
  if (reply->type != RedisReply::Type::kArray || reply->elements.size() != 2 ||
      reply->elements[1].type != RedisReply::Type::kArray) {
    return Unexpected("a commit", *reply);
  }
  const std::vector<RedisReply>& list = reply->elements[1].elements;
  if (reply->elements[0].str == "fenced") {
    std::string names;
    for (const RedisReply& i : list) {
      if (i.integer < 1 || static_cast<size_t>(i.integer) > ops.size()) {
        return Unexpected("a commit", *reply);
      }
      const std::string& id = ops[i.integer - 1].id;
      if (fenced != nullptr) fenced->push_back(id);
      absl::StrAppend(&names, names.empty() ? "" : ", ", "'", id, "'");
    }
    return absl::AbortedError(absl::StrCat(
        "session_id: ", names, list.size() == 1 ? " has" : " have",
        " been taken over by another replica; nothing was written (send "
        "the request again: the session's owner serves it)"));
  }
  if (list.size() != ops.size()) return Unexpected("a commit", *reply);
  std::vector<OpResult> out(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    const int64_t v = list[i].integer;
    out[i].exists = v == -1;
    out[i].lost = v == -2;
    if (ops[i].create && v > 0) out[i].epoch = static_cast<uint64_t>(v);
  }
  return out;
}

absl::Status RedisSharedStore::WriteSnapshots(
    std::span<const Snapshot> snapshots, std::vector<bool>* written) {
  std::vector<RedisClient::Command> commands;
  commands.reserve(snapshots.size());
  for (const Snapshot& s : snapshots) {
    commands.push_back(maintenance_->Eval(
        snapshot_script_, {Meta(s.id), Log(s.id), Snap(s.id)},
        {std::to_string(s.epoch), s.blob, std::to_string(s.covered)}));
  }
  auto replies = maintenance_->Pipeline(commands);
  if (!replies.ok()) return replies.status();
  if (written != nullptr) written->assign(snapshots.size(), false);
  for (size_t i = 0; i < replies->size(); ++i) {
    const RedisReply& r = (*replies)[i];
    if (r.type != RedisReply::Type::kInteger) {
      return Unexpected("a snapshot", r);
    }
    if (written != nullptr) (*written)[i] = r.integer == 1;
  }
  return absl::OkStatus();
}

absl::Status RedisSharedStore::Heartbeat() {
  auto reply = maintenance_->Run({"SET", Lease(), options_.replica, "PX",
                                  std::to_string(options_.lease.count())});
  if (!reply.ok()) return reply.status();
  if (reply->is_error()) return Unexpected("a heartbeat", *reply);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> RedisSharedStore::AwaitWants() {
  const std::string key = Lease() + ":wants";
  auto first = wants_->Run(
      {"BLPOP", key,
       absl::StrCat(static_cast<double>(kWantsBlock.count()) / 1000.0)});
  if (!first.ok()) return first.status();
  if (first->type == RedisReply::Type::kNil) return std::vector<std::string>{};
  if (first->type != RedisReply::Type::kArray || first->elements.size() != 2) {
    return Unexpected("waiting for wants", *first);
  }
  std::set<std::string> ids{first->elements[1].str};
  auto rest = wants_->Run(wants_->Eval(take_wants_script_, {key}, {}));
  if (!rest.ok()) return rest.status();
  if (rest->type != RedisReply::Type::kArray) {
    return Unexpected("taking wants", *rest);
  }
  for (const RedisReply& r : rest->elements) ids.insert(r.str);
  return std::vector<std::string>(ids.begin(), ids.end());
}

absl::Status RedisSharedStore::DropLease() {
  auto reply = maintenance_->Run({"DEL", Lease(), Lease() + ":wants"});
  if (!reply.ok()) return reply.status();
  if (reply->is_error()) return Unexpected("dropping the lease", *reply);
  return absl::OkStatus();
}

absl::Status RedisSharedStore::Release(
    std::span<const std::pair<std::string, uint64_t>> sessions) {
  std::vector<RedisClient::Command> commands;
  for (const auto& [id, epoch] : sessions) {
    commands.push_back(maintenance_->Eval(release_script_, {Meta(id)},
                                          {std::to_string(epoch)}));
  }
  if (commands.empty()) return absl::OkStatus();
  auto replies = maintenance_->Pipeline(commands);
  if (!replies.ok()) return replies.status();
  for (const RedisReply& r : *replies) {
    if (r.type != RedisReply::Type::kInteger) return Unexpected("a release", r);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint64_t>> RedisSharedStore::Epochs(
    std::span<const std::string> ids) {
  std::vector<RedisClient::Command> commands;
  for (const std::string& id : ids) {
    commands.push_back({"HGET", Meta(id), "epoch"});
  }
  if (commands.empty()) return std::vector<uint64_t>{};
  auto replies = maintenance_->Pipeline(commands);
  if (!replies.ok()) return replies.status();
  std::vector<uint64_t> out(ids.size(), 0);
  for (size_t i = 0; i < replies->size(); ++i) {
    const RedisReply& r = (*replies)[i];
    if (r.type == RedisReply::Type::kNil) continue;
    if (r.type != RedisReply::Type::kString || !ToU64(r.str, &out[i])) {
      return Unexpected("reading an epoch", r);
    }
  }
  return out;
}

absl::StatusOr<SharedStore::Acquired> RedisSharedStore::Acquire(
    absl::string_view id) {
  auto reply = takeovers_->Run(takeovers_->Eval(
      acquire_script_, {Meta(id), Log(id), Snap(id), "la:epoch"},
      {options_.replica, std::to_string(options_.lease.count()),
       std::string(id)}));
  if (!reply.ok()) return reply.status();
  if (reply->type != RedisReply::Type::kArray || reply->elements.empty()) {
    return Unexpected("a takeover", *reply);
  }
  Acquired out;
  std::vector<RedisReply>& e = reply->elements;
  const std::string& what = e[0].str;
  if (what == "missing") return out;
  if (what == "held" && e.size() == 3) {
    out.outcome = Acquired::Outcome::kHeld;
    out.held_for = std::chrono::milliseconds(e[1].integer);
    out.holder = e[2].str;
    return out;
  }
  if (what != "taken" || e.size() != 5 ||
      e[4].type != RedisReply::Type::kArray || !ToU64(e[2].str, &out.base)) {
    return Unexpected("a takeover", *reply);
  }
  out.outcome = Acquired::Outcome::kTaken;
  out.epoch = static_cast<uint64_t>(e[1].integer);
  out.snapshot = std::move(e[3].str);
  for (RedisReply& r : e[4].elements) out.records.push_back(std::move(r.str));
  return out;
}

}  // namespace linattn
