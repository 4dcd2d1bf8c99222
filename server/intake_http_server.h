// IntakeServer: cpp-httplib's Server (or SSLServer) with connections
// parked in an HttpIntake (server/http_intake.h) between requests, instead
// of each one holding a worker thread from accept to close. Workers answer
// requests whose heads have arrived: `threads` of them for every endpoint
// and `probe_threads` more that only GET /health uses, so a load
// balancer's probe is answered even while every other worker streams a
// completion. A worker reads the rest of the body within the request's
// deadline and writes the response, then gives the connection back.
#ifndef LINATTN_SERVER_INTAKE_HTTP_SERVER_H_
#define LINATTN_SERVER_INTAKE_HTTP_SERVER_H_

#include <httplib.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <utility>

#include "server/http_intake.h"

namespace linattn {

// What the frontend starts and shuts down, whichever the base.
class IntakeControl {
 public:
  virtual ~IntakeControl() = default;
  // After binding, before listen_after_bind: the intake's thread and the
  // workers, and the listening socket's backlog raised to SOMAXCONN.
  virtual absl::Status Start() = 0;
  // After stop() and the listener's return: closes waiting connections and
  // joins the workers (each finishes the request it answers).
  virtual void Shutdown() = 0;
};

template <class Base>
class IntakeServer : public Base, public IntakeControl {
 public:
  // `base_args`: Base's constructor's (SSLServer's context setup).
  template <class... Args>
  IntakeServer(const HttpIntakeOptions& intake, int threads, int probe_threads,
               Args&&... base_args);
  ~IntakeServer() override;

  absl::Status Start() override;
  void Shutdown() override;

 private:
  // A connection httplib accepted (on its accept pool): into the intake.
  bool process_and_close_socket(socket_t sock) override;
  // On a worker: one request of a connection whose head is in `ready`.
  void Answer(HttpIntake::Ready ready);

  HttpIntakeOptions intake_options_;
  const int threads_;
  const int probe_threads_;
  std::unique_ptr<HttpIntake> intake_;
  std::unique_ptr<httplib::ThreadPool> workers_;
  std::unique_ptr<httplib::ThreadPool> probe_workers_;
  std::mutex dispatch_mu_;  // orders dispatching against Shutdown
  std::atomic<bool> stopping_{false};
};

using IntakeHttpServer = IntakeServer<httplib::Server>;
using IntakeHttpsServer = IntakeServer<httplib::SSLServer>;

}  // namespace linattn

#endif  // LINATTN_SERVER_INTAKE_HTTP_SERVER_H_
