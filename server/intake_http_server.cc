#include "server/intake_http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

namespace linattn {
namespace {

using Clock = HttpIntake::Clock;

// The connection as httplib's request handling reads and writes it: first
// the bytes the intake read, then the socket (through `ssl` with TLS),
// every read within the request's deadline (a body that trickles in is cut
// off there too); writes wait at most `write_timeout` for room.
class IntakeStream final : public httplib::Stream {
 public:
  IntakeStream(int fd, SSL* ssl, std::string bytes, Clock::time_point deadline,
               std::chrono::milliseconds write_timeout)
      : fd_(fd),
        ssl_(ssl),
        bytes_(std::move(bytes)),
        deadline_(deadline),
        write_timeout_(write_timeout) {}

  bool is_readable() const override {
    return offset_ < bytes_.size() || Wait(POLLIN, Remaining());
  }
  bool is_writable() const override {
    return Wait(POLLOUT, static_cast<int>(write_timeout_.count()));
  }
  ssize_t read(char* ptr, size_t size) override {
    if (offset_ < bytes_.size()) {
      const size_t n = std::min(size, bytes_.size() - offset_);
      std::memcpy(ptr, bytes_.data() + offset_, n);
      offset_ += n;
      return static_cast<ssize_t>(n);
    }
    const bool decrypted = ssl_ != nullptr && SSL_pending(ssl_) > 0;
    if (!decrypted && !Wait(POLLIN, Remaining())) return -1;  // too late
    if (ssl_ != nullptr) {
      const int n = SSL_read(ssl_, ptr,
                             static_cast<int>(std::min<size_t>(size, 1 << 30)));
      if (n > 0) return n;
      const bool closed = SSL_get_error(ssl_, n) == SSL_ERROR_ZERO_RETURN;
      ERR_clear_error();
      return closed ? 0 : -1;
    }
    for (;;) {
      const ssize_t n = ::recv(fd_, ptr, size, 0);
      if (n >= 0 || errno != EINTR) return n;
    }
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    if (ssl_ != nullptr) {
      const int n = SSL_write(
          ssl_, ptr, static_cast<int>(std::min<size_t>(size, 1 << 30)));
      if (n > 0) return n;
      ERR_clear_error();
      return -1;
    }
    for (;;) {
      const ssize_t n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
      if (n >= 0 || errno != EINTR) return n;
    }
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    Address(::getpeername, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    Address(::getsockname, ip, port);
  }
  socket_t socket() const override { return fd_; }

  // What was read beyond this request (a pipelined next one).
  std::string Leftover() const { return bytes_.substr(offset_); }

 private:
  int Remaining() const {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline_ - Clock::now());
    return static_cast<int>(std::max<int64_t>(0, left.count()));
  }
  bool Wait(short events, int timeout_ms) const {
    pollfd p{fd_, events, 0};
    for (;;) {
      const int n = ::poll(&p, 1, timeout_ms);
      if (n >= 0 || errno != EINTR) return n > 0;
    }
  }
  template <class Get>
  void Address(Get get, std::string& ip, int& port) const {
    sockaddr_storage a{};
    socklen_t len = sizeof(a);
    ip.clear();
    port = 0;
    if (get(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) return;
    char text[INET6_ADDRSTRLEN] = {};
    if (a.ss_family == AF_INET) {
      const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
      ::inet_ntop(AF_INET, &v4->sin_addr, text, sizeof(text));
      port = ntohs(v4->sin_port);
    } else if (a.ss_family == AF_INET6) {
      const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
      ::inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof(text));
      port = ntohs(v6->sin6_port);
    }
    ip = text;
  }

  const int fd_;
  SSL* const ssl_;
  const std::string bytes_;
  size_t offset_ = 0;
  const Clock::time_point deadline_;
  const std::chrono::milliseconds write_timeout_;
};

void CloseSocket(int fd, SSL* ssl = nullptr) {
  if (ssl != nullptr) {
    (void)SSL_shutdown(ssl);
    ERR_clear_error();
    SSL_free(ssl);
  }
  ::shutdown(fd, SHUT_RDWR);
  ::close(fd);
}

// A blocked send or receive gives up after this long, whatever the call
// (SSL_write of a whole record, a record read in parts).
void SetSocketTimeouts(int fd) {
  timeval five{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &five, sizeof(five));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &five, sizeof(five));
}

}  // namespace

template <class Base>
template <class... Args>
IntakeServer<Base>::IntakeServer(const HttpIntakeOptions& intake, int threads,
                                 int probe_threads, Args&&... base_args)
    : Base(std::forward<Args>(base_args)...),
      intake_options_(intake),
      threads_(std::max(1, threads)),
      probe_threads_(std::max(1, probe_threads)) {
  // Accepting only parks the connection: one thread does it.
  this->new_task_queue = [] { return new httplib::ThreadPool(1); };
}

template <class Base>
IntakeServer<Base>::~IntakeServer() {
  Shutdown();
}

template <class Base>
absl::Status IntakeServer<Base>::Start() {
  // httplib listens with a backlog of 5: a burst of connections would wait
  // for the kernel to retry their handshakes. Listening again on Linux
  // only sets the backlog.
  if (this->svr_sock_ != INVALID_SOCKET) ::listen(this->svr_sock_, SOMAXCONN);
  if constexpr (std::is_same_v<Base, httplib::SSLServer>) {
    intake_options_.tls = this->ssl_context();
  }
  workers_ = std::make_unique<httplib::ThreadPool>(threads_);
  probe_workers_ = std::make_unique<httplib::ThreadPool>(probe_threads_);
  auto intake = HttpIntake::Start(intake_options_, [this](HttpIntake::Ready r) {
    // Under dispatch_mu_: once Shutdown has set stopping_, nothing more
    // joins a pool it is joining.
    std::lock_guard<std::mutex> lock(dispatch_mu_);
    if (stopping_) return CloseSocket(r.fd, r.ssl);
    httplib::ThreadPool& pool = r.probe ? *probe_workers_ : *workers_;
    pool.enqueue([this, r = std::move(r)]() mutable { Answer(std::move(r)); });
  });
  if (!intake.ok()) return intake.status();
  intake_ = *std::move(intake);
  return absl::OkStatus();
}

template <class Base>
void IntakeServer<Base>::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(dispatch_mu_);
    stopping_ = true;
  }
  // Workers first (each finishes its request and closes its connection,
  // touching the intake no more), then the connections still waiting.
  if (workers_ != nullptr) workers_->shutdown();
  if (probe_workers_ != nullptr) probe_workers_->shutdown();
  intake_.reset();
  workers_.reset();
  probe_workers_.reset();
}

template <class Base>
bool IntakeServer<Base>::process_and_close_socket(socket_t sock) {
  if (stopping_ || intake_ == nullptr) {
    CloseSocket(sock);
    return false;
  }
  intake_->Add(sock);
  return true;
}

template <class Base>
void IntakeServer<Base>::Answer(HttpIntake::Ready ready) {
  SetSocketTimeouts(ready.fd);
  IntakeStream stream(ready.fd, ready.ssl, std::move(ready.bytes),
                      ready.deadline, std::chrono::milliseconds(5000));
  bool closed = false;
  SSL* const ssl = ready.ssl;
  const bool ok =
      this->process_request(stream, /*close_connection=*/stopping_.load(),
                            closed, [ssl](httplib::Request& req) {
                              if (ssl != nullptr) req.ssl = ssl;
                            });
  if (!ok || closed || stopping_) {
    CloseSocket(ready.fd, ssl);
    return;
  }
  intake_->Add(ready.fd, stream.Leftover(), ssl);
}

template class IntakeServer<httplib::Server>;
template class IntakeServer<httplib::SSLServer>;
template IntakeServer<httplib::Server>::IntakeServer(const HttpIntakeOptions&,
                                                     int, int);
template IntakeServer<httplib::SSLServer>::IntakeServer(
    const HttpIntakeOptions&, int, int, std::function<bool(SSL_CTX&)>&&);

}  // namespace linattn
