// HttpIntake: where the HTTP listener's connections wait for their next
// request (server/http_frontend.h). One thread reads every waiting
// connection's request head (request line and headers) without blocking,
// and hands a connection to a worker only once its head is complete; the
// worker answers that one request and gives the connection back. A client
// that sends its head slowly, or opens a connection and sends nothing,
// holds a slot here (a few KiB), never a worker, so it cannot stall the
// requests of others; past a whole-request deadline it is answered 408 and
// closed, whatever the pace of its bytes.
//
// Per connection: after a response (or when accepted) it may stay idle for
// `idle_timeout`; from its next request's first byte, the head and the body
// must arrive within `request_timeout` (the worker reading the body holds
// the same deadline). A head larger than `max_head_bytes` is answered 431.
// A body whose Content-Length is at most `max_buffered_body` (an API call's
// JSON, as a rule) is read here too, so a client trickling a small body
// holds no worker either; a larger one is read by the worker. At most
// `max_connections` wait at once (each holding at most max_head_bytes +
// max_buffered_body + 16 KiB); more are closed when they arrive.
//
// TLS (`tls` set: the HTTPS listener's context): the intake runs each
// connection's handshake and decrypts its head without blocking too, so a
// slow handshake is bounded by the idle time and a slow head by the
// request's deadline; the worker goes on with the same SSL object.
//
// Thread-safe: Add from any thread.
#ifndef LINATTN_SERVER_HTTP_INTAKE_H_
#define LINATTN_SERVER_HTTP_INTAKE_H_

#include <openssl/ssl.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace linattn {

struct HttpIntakeOptions {
  std::chrono::milliseconds request_timeout{30'000};
  std::chrono::milliseconds idle_timeout{5'000};
  size_t max_head_bytes = 16 << 10;
  size_t max_buffered_body = 48 << 10;
  size_t max_connections = 1024;
  // The HTTPS listener's context, or null for plain HTTP.
  SSL_CTX* tls = nullptr;
};

class HttpIntake {
 public:
  using Clock = std::chrono::steady_clock;
  // A connection whose request head is complete: its socket (blocking
  // again, now the worker's to answer and give back or close), the bytes
  // read so far (the head and whatever followed it), the request's
  // deadline, whether it is a health probe (GET /health), and with TLS the
  // connection's SSL (the worker's now, as the socket).
  struct Ready {
    int fd = -1;
    std::string bytes;
    Clock::time_point deadline;
    bool probe = false;
    SSL* ssl = nullptr;
  };
  using Dispatch = std::function<void(Ready)>;

  static absl::StatusOr<std::unique_ptr<HttpIntake>> Start(
      const HttpIntakeOptions& options, Dispatch dispatch);
  // Closes every connection still waiting.
  ~HttpIntake();
  HttpIntake(const HttpIntake&) = delete;
  HttpIntake& operator=(const HttpIntake&) = delete;

  // Takes connection `fd` (accepted, or given back after a response) with
  // `pending` bytes already read from it and, with TLS, its SSL once it has
  // one. Once stopping, `fd` is closed.
  void Add(int fd, std::string pending = "", SSL* ssl = nullptr);

  const HttpIntakeOptions& options() const { return options_; }

 private:
  struct Connection {
    std::string bytes;
    Clock::time_point idle_until;
    std::optional<Clock::time_point> deadline;  // from its first byte
    // Bytes to hold before handing it over (its head and a small body);
    // 0 until the head is complete.
    size_t need = 0;
    SSL* ssl = nullptr;       // TLS
    bool want_write = false;  // its handshake waits to write
    // Answered with an error and shut for writing: what the client still
    // sends is read and dropped until then (closing with unread bytes
    // would reset the connection, and the client could lose the answer).
    std::optional<Clock::time_point> lingering_until;
  };
  HttpIntake(const HttpIntakeOptions& options, Dispatch dispatch)
      : options_(options), dispatch_(std::move(dispatch)) {}
  // When `c` is next due: its lingering ends, its request's deadline, or
  // its idle time.
  static Clock::time_point Due(const Connection& c);
  void Run();
  // Takes connections from Add (on the intake's thread).
  void Admit();
  // Reads what `fd` has; hands it over, closes it, or leaves it waiting.
  void Read(int fd);
  // Reads what a TLS connection has decrypted; false if it was closed.
  bool ReadTls(int fd, Connection& c);
  // Watches `fd` for writability too while its handshake needs it.
  void WantWrite(int fd, Connection& c, bool want);
  // Hands `fd` over if its head is complete; true if it left the intake.
  bool MaybeReady(int fd, Connection& c, size_t searched_from);
  // Closes `fd`; with `response`, sends it and lingers first.
  void Close(int fd, const std::string* response = nullptr);

  const HttpIntakeOptions options_;
  const Dispatch dispatch_;
  int epoll_ = -1;
  int wake_ = -1;  // an eventfd: Add and the destructor wake the thread
  std::thread thread_;
  std::mutex mu_;
  bool stopping_ = false;  // guarded by mu_
  struct Incoming {
    int fd;
    std::string pending;
    SSL* ssl;
  };
  std::vector<Incoming> incoming_;     // guarded by mu_
  std::map<int, Connection> waiting_;  // the intake thread's alone
};

}  // namespace linattn

#endif  // LINATTN_SERVER_HTTP_INTAKE_H_
