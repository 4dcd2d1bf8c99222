#include "server/redis/redis_client.h"

#include <hiredis/hiredis.h>

#include <charconv>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace linattn {
namespace {

bool ParseInt(absl::string_view text, int lo, int hi, int* out) {
  int value = 0;
  const auto [end, ec] =
      std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < lo ||
      value > hi) {
    return false;
  }
  *out = value;
  return true;
}

RedisReply Convert(const redisReply* r) {
  RedisReply out;
  switch (r->type) {
    case REDIS_REPLY_STRING:
      out.type = RedisReply::Type::kString;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_STATUS:
      out.type = RedisReply::Type::kStatus;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_ERROR:
      out.type = RedisReply::Type::kError;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_INTEGER:
      out.type = RedisReply::Type::kInteger;
      out.integer = r->integer;
      break;
    case REDIS_REPLY_ARRAY:
      out.type = RedisReply::Type::kArray;
      out.elements.reserve(r->elements);
      for (size_t i = 0; i < r->elements; ++i) {
        out.elements.push_back(Convert(r->element[i]));
      }
      break;
    default:
      out.type = RedisReply::Type::kNil;
  }
  return out;
}

timeval ToTimeval(std::chrono::milliseconds ms) {
  timeval tv;
  tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
  return tv;
}

}  // namespace

absl::StatusOr<RedisEndpoint> ParseRedisUrl(absl::string_view url) {
  RedisEndpoint e;
  e.text = std::string(url);
  constexpr absl::string_view kScheme = "redis://";
  if (!absl::StartsWith(url, kScheme)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state store '", url, "': expected redis://HOST[:PORT][/DB]"));
  }
  absl::string_view rest = url.substr(kScheme.size());
  if (const size_t slash = rest.find('/'); slash != absl::string_view::npos) {
    if (!ParseInt(rest.substr(slash + 1), 0, 15, &e.db)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state store '", url, "': the database must be a number 0..15"));
    }
    rest = rest.substr(0, slash);
  }
  // A port after the host ("[v6]:port" for an IPv6 address).
  const size_t close = rest.rfind(']');
  const size_t colon = rest.rfind(':');
  if (colon != absl::string_view::npos &&
      (rest.front() != '[' ||
       (close != absl::string_view::npos && colon == close + 1))) {
    if (!ParseInt(rest.substr(colon + 1), 1, 65535, &e.port)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state store '", url, "': the port must be a number 1..65535"));
    }
    rest = rest.substr(0, colon);
  }
  if (rest.size() >= 2 && rest.front() == '[' && rest.back() == ']') {
    rest = rest.substr(1, rest.size() - 2);
  }
  if (rest.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("state store '", url, "': the host is missing"));
  }
  e.host = std::string(rest);
  return e;
}

RedisClient::RedisClient(RedisEndpoint endpoint,
                         std::chrono::milliseconds timeout)
    : endpoint_(std::move(endpoint)), timeout_(timeout) {}

RedisClient::~RedisClient() {
  std::lock_guard<std::mutex> lock(mu_);
  DropLocked();
}

size_t RedisClient::AddScript(std::string source) {
  scripts_.push_back(std::move(source));
  shas_.emplace_back();
  return scripts_.size() - 1;
}

void RedisClient::DropLocked() {
  if (context_ != nullptr) redisFree(context_);
  context_ = nullptr;
}

absl::Status RedisClient::ConnectLocked() {
  if (context_ != nullptr) return absl::OkStatus();
  context_ = redisConnectWithTimeout(endpoint_.host.c_str(), endpoint_.port,
                                     ToTimeval(timeout_));
  auto fail = [&](absl::string_view what) {
    const std::string why =
        context_ != nullptr && context_->err ? context_->errstr : "";
    DropLocked();
    return absl::UnavailableError(absl::StrCat("state store ", endpoint_.text,
                                               ": ", what,
                                               why.empty() ? "" : ": ", why));
  };
  if (context_ == nullptr || context_->err) return fail("cannot connect");
  if (redisSetTimeout(context_, ToTimeval(timeout_)) != REDIS_OK) {
    return fail("setting the timeout");
  }
  (void)redisEnableKeepAlive(context_);
  auto run = [&](std::vector<std::string> args) -> absl::StatusOr<RedisReply> {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const std::string& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    auto* r = static_cast<redisReply*>(redisCommandArgv(
        context_, static_cast<int>(argv.size()), argv.data(), lens.data()));
    if (r == nullptr) return fail("no reply");
    RedisReply out = Convert(r);
    freeReplyObject(r);
    return out;
  };
  if (endpoint_.db != 0) {
    auto r = run({"SELECT", std::to_string(endpoint_.db)});
    if (!r.ok()) return r.status();
    if (r->is_error()) return fail(absl::StrCat("SELECT: ", r->str));
  }
  for (size_t i = 0; i < scripts_.size(); ++i) {
    auto r = run({"SCRIPT", "LOAD", scripts_[i]});
    if (!r.ok()) return r.status();
    if (r->type != RedisReply::Type::kString) {
      return fail(absl::StrCat("loading a script: ", r->str));
    }
    shas_[i] = r->str;
  }
  return absl::OkStatus();
}

RedisClient::Command RedisClient::Eval(size_t script,
                                       std::vector<std::string> keys,
                                       std::vector<std::string> args) const {
  Command c;
  c.reserve(3 + keys.size() + args.size());
  c.push_back("EVALSHA");
  // The SHA is filled in when the command is sent (it is known once a
  // connection loaded the script): the index stands in for it.
  c.push_back(absl::StrCat("#", script));
  c.push_back(std::to_string(keys.size()));
  for (std::string& k : keys) c.push_back(std::move(k));
  for (std::string& a : args) c.push_back(std::move(a));
  return c;
}

absl::StatusOr<std::vector<RedisReply>> RedisClient::Pipeline(
    std::span<const Command> commands) {
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status s = ConnectLocked(); !s.ok()) return s;
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const Command& c : commands) {
    argv.clear();
    lens.clear();
    for (size_t i = 0; i < c.size(); ++i) {
      const std::string* arg = &c[i];
      if (i == 1 && c[0] == "EVALSHA" && !arg->empty() && (*arg)[0] == '#') {
        arg = &shas_[std::stoul(arg->substr(1))];
      }
      argv.push_back(arg->data());
      lens.push_back(arg->size());
    }
    if (redisAppendCommandArgv(context_, static_cast<int>(argv.size()),
                               argv.data(), lens.data()) != REDIS_OK) {
      DropLocked();
      return absl::ResourceExhaustedError(absl::StrCat(
          "state store ", endpoint_.text, ": building a command failed"));
    }
  }
  std::vector<RedisReply> replies;
  replies.reserve(commands.size());
  bool lost_scripts = false;
  for (size_t i = 0; i < commands.size(); ++i) {
    void* raw = nullptr;
    if (redisGetReply(context_, &raw) != REDIS_OK || raw == nullptr) {
      const std::string why = context_->errstr;
      DropLocked();
      return absl::UnavailableError(absl::StrCat(
          "state store ", endpoint_.text, ": the connection failed (", why,
          "); whether the last write landed is not known"));
    }
    auto* r = static_cast<redisReply*>(raw);
    replies.push_back(Convert(r));
    freeReplyObject(r);
    if (replies.back().is_error() &&
        absl::StartsWith(replies.back().str, "NOSCRIPT")) {
      lost_scripts = true;
    }
  }
  // The server forgot the scripts (SCRIPT FLUSH): load them again with the
  // next connection. The commands that met NOSCRIPT did not run.
  if (lost_scripts) DropLocked();
  return replies;
}

absl::StatusOr<RedisReply> RedisClient::Run(Command command) {
  std::vector<Command> one;
  one.push_back(std::move(command));
  auto replies = Pipeline(one);
  if (!replies.ok()) return replies.status();
  return std::move(replies->front());
}

}  // namespace linattn
