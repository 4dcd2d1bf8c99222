#include "server/http_intake.h"

#include <fcntl.h>
#include <openssl/err.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace linattn {
namespace {

// An error answer in the API's shape, closing the connection.
std::string ErrorResponse(int code, absl::string_view reason,
                          absl::string_view message) {
  const std::string body = absl::StrCat(
      R"({"error":{"message":")", message,
      R"(","type":"invalid_request_error","param":null,"code":)", code, "}}");
  return absl::StrCat("HTTP/1.1 ", code, " ", reason,
                      "\r\nConnection: close\r\nContent-Type: application/json"
                      "\r\nContent-Length: ",
                      body.size(), "\r\n\r\n", body);
}

const std::string& TimeoutResponse() {
  static const std::string r = ErrorResponse(
      408, "Request Timeout", "the request did not arrive in time");
  return r;
}

const std::string& TooLargeResponse() {
  static const std::string r =
      ErrorResponse(431, "Request Header Fields Too Large",
                    "the request's headers are too large");
  return r;
}

// How long an error answer's connection stays open for reading.
constexpr std::chrono::seconds kLinger{2};

void SetNonBlocking(int fd, bool on) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

// The Content-Length a request head names (nullopt: none, or not a number;
// httplib answers such a request).
std::optional<size_t> ContentLength(absl::string_view head) {
  const std::string lower = absl::AsciiStrToLower(head);
  const size_t at = lower.find("\r\ncontent-length:");
  if (at == std::string::npos) return std::nullopt;
  size_t i = at + 17;
  while (i < lower.size() && (lower[i] == ' ' || lower[i] == '\t')) ++i;
  size_t value = 0;
  size_t digits = 0;
  for (; i < lower.size() && absl::ascii_isdigit(lower[i]); ++i, ++digits) {
    if (digits >= 12) return std::nullopt;
    value = value * 10 + static_cast<size_t>(lower[i] - '0');
  }
  if (digits == 0) return std::nullopt;
  return value;
}

// Whether the head carries "Expect: 100-continue".
bool ExpectsContinue(absl::string_view head) {
  return absl::StrContains(absl::AsciiStrToLower(head),
                           "\r\nexpect: 100-continue");
}

// GET (or HEAD) /health, with or without a query.
bool IsProbe(const std::string& head) {
  for (absl::string_view method : {"GET /health", "HEAD /health"}) {
    if (absl::StartsWith(head, method) && head.size() > method.size()) {
      const char next = head[method.size()];
      if (next == ' ' || next == '?') return true;
    }
  }
  return false;
}

}  // namespace

HttpIntake::Clock::time_point HttpIntake::Due(const Connection& c) {
  if (c.lingering_until) return *c.lingering_until;
  return c.deadline ? *c.deadline : c.idle_until;
}

absl::StatusOr<std::unique_ptr<HttpIntake>> HttpIntake::Start(
    const HttpIntakeOptions& options, Dispatch dispatch) {
  std::unique_ptr<HttpIntake> intake(
      new HttpIntake(options, std::move(dispatch)));
  intake->epoll_ = ::epoll_create1(EPOLL_CLOEXEC);
  intake->wake_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (intake->epoll_ < 0 || intake->wake_ < 0) {
    return absl::InternalError(
        absl::StrCat("--http-listen: setting up the request intake failed: ",
                     std::strerror(errno)));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = intake->wake_;
  ::epoll_ctl(intake->epoll_, EPOLL_CTL_ADD, intake->wake_, &ev);
  intake->thread_ = std::thread([p = intake.get()] { p->Run(); });
  return intake;
}

HttpIntake::~HttpIntake() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  if (wake_ >= 0) {
    const uint64_t one = 1;
    (void)!::write(wake_, &one, sizeof(one));
  }
  if (thread_.joinable()) thread_.join();
  for (auto& [fd, c] : waiting_) {
    if (c.ssl != nullptr) SSL_free(c.ssl);
    ::close(fd);
  }
  for (Incoming& in : incoming_) {
    if (in.ssl != nullptr) SSL_free(in.ssl);
    ::close(in.fd);
  }
  if (epoll_ >= 0) ::close(epoll_);
  if (wake_ >= 0) ::close(wake_);
}

void HttpIntake::Add(int fd, std::string pending, SSL* ssl) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      incoming_.push_back(Incoming{fd, std::move(pending), ssl});
      const uint64_t one = 1;
      (void)!::write(wake_, &one, sizeof(one));
      return;
    }
  }
  if (ssl != nullptr) SSL_free(ssl);
  ::shutdown(fd, SHUT_RDWR);
  ::close(fd);
}

void HttpIntake::Close(int fd, const std::string* response) {
  auto it = waiting_.find(fd);
  SSL* const ssl = it != waiting_.end() ? it->second.ssl : nullptr;
  if (response != nullptr && it != waiting_.end()) {
    // Best effort: the socket is non-blocking, and the response is small.
    if (ssl != nullptr) {
      (void)SSL_write(ssl, response->data(),
                      static_cast<int>(response->size()));
      (void)SSL_shutdown(ssl);
      ERR_clear_error();
    } else {
      (void)!::send(fd, response->data(), response->size(), MSG_NOSIGNAL);
    }
    ::shutdown(fd, SHUT_WR);
    WantWrite(fd, it->second, false);  // only what it sends is of interest
    it->second.bytes.clear();
    it->second.lingering_until = Clock::now() + kLinger;
    return;
  }
  ::epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr);
  if (ssl != nullptr) SSL_free(ssl);
  ::shutdown(fd, SHUT_RDWR);
  ::close(fd);
  waiting_.erase(fd);
}

void HttpIntake::WantWrite(int fd, Connection& c, bool want) {
  if (c.want_write == want) return;
  c.want_write = want;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | (want ? EPOLLOUT : 0u);
  ev.data.fd = fd;
  ::epoll_ctl(epoll_, EPOLL_CTL_MOD, fd, &ev);
}

void HttpIntake::Admit() {
  std::vector<Incoming> incoming;
  {
    std::lock_guard<std::mutex> lock(mu_);
    incoming.swap(incoming_);
  }
  const Clock::time_point now = Clock::now();
  for (Incoming& in : incoming) {
    const int fd = in.fd;
    if (options_.tls != nullptr && in.ssl == nullptr) {
      in.ssl = SSL_new(options_.tls);
      if (in.ssl != nullptr && SSL_set_fd(in.ssl, fd) == 1) {
        SSL_set_accept_state(in.ssl);
      } else if (in.ssl != nullptr) {
        SSL_free(in.ssl);
        in.ssl = nullptr;
      }
    }
    if (waiting_.size() >= options_.max_connections ||
        (options_.tls != nullptr && in.ssl == nullptr)) {
      if (in.ssl != nullptr) SSL_free(in.ssl);
      ERR_clear_error();
      ::shutdown(fd, SHUT_RDWR);
      ::close(fd);
      continue;
    }
    SetNonBlocking(fd, true);
    Connection& c = waiting_[fd];
    c.ssl = in.ssl;
    c.bytes = std::move(in.pending);
    c.idle_until = now + options_.idle_timeout;
    if (!c.bytes.empty()) c.deadline = now + options_.request_timeout;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = fd;
    if (::epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      Close(fd);
      continue;
    }
    // A request that came right behind the previous one (pipelined; with
    // TLS it may wait decrypted inside the SSL, where epoll cannot see it).
    if (c.ssl != nullptr) {
      Read(fd);
    } else if (!c.bytes.empty()) {
      MaybeReady(fd, c, 0);
    }
  }
}

bool HttpIntake::MaybeReady(int fd, Connection& c, size_t searched_from) {
  if (c.need == 0) {
    const size_t end = c.bytes.find("\r\n\r\n", searched_from);
    if (end == std::string::npos) {
      if (c.bytes.size() > options_.max_head_bytes) {
        Close(fd, &TooLargeResponse());
        return true;
      }
      return false;
    }
    if (end + 4 > options_.max_head_bytes) {
      Close(fd, &TooLargeResponse());
      return true;
    }
    c.need = end + 4;
    const absl::string_view head =
        absl::string_view(c.bytes).substr(0, end + 2);
    const std::optional<size_t> length = ContentLength(head);
    // A client that waits for "100 Continue" before its body gets it from
    // the worker: its head goes at once.
    if (length && *length <= options_.max_buffered_body &&
        !ExpectsContinue(head)) {
      c.need += *length;
    }
  }
  if (c.bytes.size() < c.need) return false;
  ::epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr);
  SetNonBlocking(fd, false);
  Ready ready;
  ready.fd = fd;
  ready.bytes = std::move(c.bytes);
  ready.deadline = *c.deadline;
  ready.probe = IsProbe(ready.bytes);
  ready.ssl = c.ssl;
  waiting_.erase(fd);
  dispatch_(std::move(ready));
  return true;
}

void HttpIntake::Read(int fd) {
  auto it = waiting_.find(fd);
  if (it == waiting_.end()) return;
  Connection& c = it->second;
  if (c.lingering_until) {
    // At most 64 KiB a turn: a client sending flat out cannot hold the
    // intake's thread (epoll reports it again).
    char drop[4096];
    for (int i = 0; i < 16; ++i) {
      const ssize_t n = ::recv(fd, drop, sizeof(drop), 0);
      if (n > 0 || (n < 0 && errno == EINTR)) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      return Close(fd);  // the client closed too
    }
    return;
  }
  const size_t before = c.bytes.size();
  if (c.ssl != nullptr) {
    if (!ReadTls(fd, c)) return;
    MaybeReady(fd, c, before >= 3 ? before - 3 : 0);
    return;
  }
  char buffer[16 << 10];
  for (;;) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n > 0) {
      if (!c.deadline) c.deadline = Clock::now() + options_.request_timeout;
      c.bytes.append(buffer, static_cast<size_t>(n));
      if (c.bytes.size() >=
          (c.need != 0 ? c.need : options_.max_head_bytes + 1)) {
        break;
      }
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n < 0 && errno == EINTR) continue;
    // Closed by the client (a request sent whole and then its side shut
    // is still answered), or failed.
    if (n != 0 || !MaybeReady(fd, c, before >= 3 ? before - 3 : 0)) Close(fd);
    return;
  }
  MaybeReady(fd, c, before >= 3 ? before - 3 : 0);
}

bool HttpIntake::ReadTls(int fd, Connection& c) {
  char buffer[16 << 10];
  for (;;) {
    const int n = SSL_read(c.ssl, buffer, sizeof(buffer));
    if (n > 0) {
      if (!c.deadline) c.deadline = Clock::now() + options_.request_timeout;
      c.bytes.append(buffer, static_cast<size_t>(n));
      if (c.bytes.size() >=
          (c.need != 0 ? c.need : options_.max_head_bytes + 1)) {
        return true;
      }
      continue;
    }
    const int error = SSL_get_error(c.ssl, n);
    if (error == SSL_ERROR_WANT_READ) {
      WantWrite(fd, c, false);
      return true;
    }
    if (error == SSL_ERROR_WANT_WRITE) {
      WantWrite(fd, c, true);
      return true;
    }
    // Closed (a request sent whole and then the client's side shut is
    // still answered), a failed handshake (a plaintext client, an unknown
    // certificate), or an error.
    ERR_clear_error();
    if (c.bytes.empty() || !MaybeReady(fd, c, 0)) Close(fd);
    return false;
  }
}

void HttpIntake::Run() {
  epoll_event events[64];
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
    }
    // Until the nearest deadline (at most a second).
    Clock::time_point next = Clock::now() + std::chrono::seconds(1);
    for (const auto& [fd, c] : waiting_) {
      next = std::min(next, Due(c));
    }
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(
        next - Clock::now());
    const int n =
        ::epoll_wait(epoll_, events, 64,
                     static_cast<int>(std::max<int64_t>(0, wait.count()) + 1));
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_) {
        uint64_t count = 0;
        (void)!::read(wake_, &count, sizeof(count));
        continue;
      }
      Read(fd);
    }
    Admit();
    const Clock::time_point now = Clock::now();
    std::vector<std::pair<int, bool>> expired;  // fd, to answer 408
    for (const auto& [fd, c] : waiting_) {
      if (now >= Due(c)) {
        expired.emplace_back(fd, !c.lingering_until && c.deadline);
      }
    }
    for (const auto& [fd, mid_request] : expired) {
      Close(fd, mid_request ? &TimeoutResponse() : nullptr);
    }
  }
}

}  // namespace linattn
