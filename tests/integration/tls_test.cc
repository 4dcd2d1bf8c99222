// TLS on a real linattn-server process, with certificates the test makes
// with openssl (tests/tls/make_certs.sh): both listeners serve TLS and
// refuse plaintext; with --tls-client-ca, clients without a certificate or
// with one of an unknown CA are refused on both; SIGHUP puts a rotated
// certificate in use for new connections while an open stream and every
// session go on; broken files are refused at start (naming the flag) and at
// a reload (keeping the certificate in use). Clients connect through the
// project's own connection code (clients/common), as `linattn` does.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "clients/common/connection.h"
#include "linattn/v1/attention.grpc.pb.h"
#include "tests/integration/server_process.h"
#include "tests/util/temp_dir.h"

namespace linattn {
namespace {

using testing::ServerProcess;

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string make = std::string("bash ") + LINATTN_SOURCE_DIR +
                             "/tests/tls/make_certs.sh " + dir_.Path("certs");
    ASSERT_EQ(std::system(make.c_str()), 0);
  }
  std::string Cert(const std::string& name) const {
    return dir_.Path("certs/" + name);
  }
  std::vector<std::string> TlsArgs(bool mutual) const {
    std::vector<std::string> args = {"--tls-cert", Cert("server.pem"),
                                     "--tls-key",  Cert("server.key"),
                                     "--model",    "none"};
    if (mutual) {
      args.push_back("--tls-client-ca");
      args.push_back(Cert("ca.pem"));
    }
    return args;
  }
  // A client of `server` trusting `ca` ("" = plaintext), presenting
  // `client` ("" = no certificate).
  std::unique_ptr<v1::AttentionService::Stub> Stub(
      const ServerProcess& server, const std::string& ca,
      const std::string& client = "") const {
    ConnectionOptions o;
    if (!ca.empty()) o.tls_ca = Cert(ca + ".pem");
    if (!client.empty()) {
      o.tls_cert = Cert(client + ".pem");
      o.tls_key = Cert(client + ".key");
    }
    EXPECT_TRUE(ResolveConnection(&o).ok());
    return v1::AttentionService::NewStub(OpenChannel(server.address(), o));
  }
  static grpc::Status List(v1::AttentionService::Stub& stub) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(10));
    v1::ListSessionsResponse out;
    return stub.ListSessions(&ctx, v1::ListSessionsRequest(), &out);
  }
  // GET /health over HTTPS trusting `ca`, presenting `client`; 0 when the
  // handshake (or the connection) failed.
  int Https(int port, const std::string& ca,
            const std::string& client = "") const {
    std::unique_ptr<httplib::SSLClient> c =
        client.empty() ? std::make_unique<httplib::SSLClient>("127.0.0.1", port)
                       : std::make_unique<httplib::SSLClient>(
                             "127.0.0.1", port, Cert(client + ".pem"),
                             Cert(client + ".key"));
    c->set_ca_cert_path(Cert(ca + ".pem").c_str());
    c->enable_server_certificate_verification(true);
    c->set_connection_timeout(5, 0);
    auto r = c->Get("/health");
    return r ? r->status : 0;
  }
  static int PlainHttp(int port) {
    httplib::Client c("127.0.0.1", port);
    c.set_connection_timeout(5, 0);
    c.set_read_timeout(5, 0);
    auto r = c.Get("/health");
    return r ? r->status : 0;
  }

  testing::TempDir dir_;
};

// A TLS client on a raw loopback connection, trusting `ca_file`.
struct RawTlsClient {
  int fd = -1;
  SSL* ssl = nullptr;
  ~RawTlsClient() {
    if (ssl != nullptr) SSL_free(ssl);
    if (fd >= 0) ::close(fd);
  }
  bool Connect(SSL_CTX* ctx, int port) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      return false;
    }
    ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    return SSL_connect(ssl) == 1;
  }
  // What arrives until `until`, the end of the connection or `limit`.
  std::string Read(std::chrono::milliseconds limit, const std::string& until) {
    std::string out;
    const auto deadline = std::chrono::steady_clock::now() + limit;
    char buffer[4096];
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd, POLLIN, 0};
      if (SSL_pending(ssl) == 0 && ::poll(&p, 1, 50) <= 0) continue;
      const int n = SSL_read(ssl, buffer, sizeof(buffer));
      if (n <= 0) break;
      out.append(buffer, static_cast<size_t>(n));
      if (out.find(until) != std::string::npos) break;
    }
    return out;
  }
};

// Over HTTPS too, slow clients hold no request thread: 16 that trickle
// their headers after the handshake and 16 that connect and never start
// one, against the fewest threads the server takes; /health answers within
// a second meanwhile, and the slow ones get 408 at their deadline.
TEST_F(TlsTest, SlowHttpsClientsStallNoOtherRequest) {
  std::vector<std::string> args = TlsArgs(false);
  args.insert(args.end(),
              {"--http-threads", "9", "--http-request-timeout-ms", "3000"});
  auto server = ServerProcess::Start(args);
  ASSERT_NE(server, nullptr);
  const int port = server->http_port();
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  ASSERT_EQ(SSL_CTX_load_verify_locations(ctx, Cert("ca.pem").c_str(), nullptr),
            1);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  std::vector<std::unique_ptr<RawTlsClient>> slow;
  for (int i = 0; i < 16; ++i) {
    slow.push_back(std::make_unique<RawTlsClient>());
    ASSERT_TRUE(slow.back()->Connect(ctx, port)) << i;
  }
  std::vector<int> silent;
  for (int i = 0; i < 16; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    silent.push_back(fd);
  }
  const std::string head =
      "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Padding: aaaaaaaaaaaaaaaa\r\n";
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    for (size_t at = 0; at < head.size() && !stop; ++at) {
      for (auto& c : slow) (void)SSL_write(c->ssl, &head[at], 1);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(Https(port, "ca"), 200);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  for (auto& c : slow) {
    EXPECT_THAT(c->Read(std::chrono::milliseconds(4000), "}}"),
                ::testing::HasSubstr("HTTP/1.1 408"));
  }
  stop = true;
  trickle.join();
  for (int fd : silent) ::close(fd);
  SSL_CTX_free(ctx);
}

TEST_F(TlsTest, BothListenersServeTlsAndRefusePlaintext) {
  auto server = ServerProcess::Start(TlsArgs(false));
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(List(*Stub(*server, "ca")).ok());
  EXPECT_EQ(List(*Stub(*server, "")).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // A client that trusts another CA does not take the server's word.
  EXPECT_EQ(List(*Stub(*server, "ca2")).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Https(server->http_port(), "ca"), 200);
  EXPECT_EQ(Https(server->http_port(), "ca2"), 0);
  EXPECT_EQ(PlainHttp(server->http_port()), 0);
}

TEST_F(TlsTest, MutualTlsRefusesClientsWithoutAKnownCertificate) {
  auto server = ServerProcess::Start(TlsArgs(true));
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(List(*Stub(*server, "ca", "client")).ok());
  for (const std::string client : {"", "rogue"}) {
    EXPECT_EQ(List(*Stub(*server, "ca", client)).error_code(),
              grpc::StatusCode::UNAVAILABLE)
        << client;
    EXPECT_EQ(Https(server->http_port(), "ca", client), 0) << client;
  }
  EXPECT_EQ(Https(server->http_port(), "ca", "client"), 200);
}

TEST_F(TlsTest, SighupRotatesTheCertificateAndKeepsStreamsAndSessions) {
  // The server reads copies, so that the test can replace them.
  const std::string cert = dir_.Path("serving.pem"),
                    key = dir_.Path("serving.key");
  std::filesystem::copy_file(Cert("server.pem"), cert);
  std::filesystem::copy_file(Cert("server.key"), key);
  auto server = ServerProcess::Start(
      {"--tls-cert", cert, "--tls-key", key, "--model", "none"});
  ASSERT_NE(server, nullptr);
  auto old_client = Stub(*server, "ca");
  v1::Session session;
  {
    grpc::ClientContext ctx;
    v1::CreateSessionRequest req;
    req.mutable_spec()->set_num_heads(1);
    req.mutable_spec()->set_key_dim(2);
    req.mutable_spec()->set_value_dim(2);
    ASSERT_TRUE(old_client->CreateSession(&ctx, req, &session).ok());
  }
  grpc::ClientContext stream_ctx;
  auto stream = old_client->Decode(&stream_ctx);
  v1::DecodeRequest step;
  step.set_session_id(session.session_id());
  for (int i = 0; i < 2; ++i) step.add_q(1), step.add_k(1), step.add_v(1);
  v1::DecodeResponse out;
  ASSERT_TRUE(stream->Write(step) && stream->Read(&out));
  EXPECT_EQ(out.position(), 1u);

  // A certificate of another CA: clients that trust only that CA get in
  // once it is in use.
  EXPECT_EQ(List(*Stub(*server, "ca2")).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  std::filesystem::copy_file(Cert("server2.pem"), cert,
                             std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(Cert("server2.key"), key,
                             std::filesystem::copy_options::overwrite_existing);
  ASSERT_EQ(kill(server->pid(), SIGHUP), 0);
  // gRPC's provider looks at the files every second.
  bool rotated = false;
  for (int i = 0; i < 100 && !rotated; ++i) {
    rotated = List(*Stub(*server, "ca2")).ok() &&
              Https(server->http_port(), "ca2") == 200;
    if (!rotated) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(rotated);
  // The stream opened before goes on, its session intact.
  ASSERT_TRUE(stream->Write(step) && stream->Read(&out));
  EXPECT_EQ(out.position(), 2u);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());

  // A broken file is refused at a reload; the certificate in use stays.
  std::ofstream(cert) << "not a certificate";
  ASSERT_EQ(kill(server->pid(), SIGHUP), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_TRUE(List(*Stub(*server, "ca2")).ok());
  EXPECT_EQ(Https(server->http_port(), "ca2"), 200);
  EXPECT_EQ(server->Stop(std::chrono::seconds(20)), 0);
}

TEST_F(TlsTest, BrokenFilesAreRefusedAtStartNamingTheFlag) {
  const std::string log = dir_.Path("log");
  for (const auto& [args, expected] :
       std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--tls-cert", Cert("server.pem"), "--tls-key", Cert("client.key")},
            "--tls-key: "},
           {{"--tls-cert", Cert("server.key"), "--tls-key", Cert("server.key")},
            "--tls-cert: "},
           {{"--tls-cert", Cert("server.pem")}, "--tls-cert: needs --tls-key"},
           {{"--tls-client-ca", Cert("ca.pem")}, "--tls-client-ca: needs"},
           {{"--tls-cert", Cert("server.pem"), "--tls-key", Cert("server.key"),
             "--tls-client-ca", Cert("server.key")},
            "--tls-client-ca: "}}) {
    EXPECT_EQ(ServerProcess::Start(args, log), nullptr);
    std::ifstream in(log);
    const std::string text((std::istreambuf_iterator<char>(in)),
                           std::istreambuf_iterator<char>());
    EXPECT_NE(text.find(expected), std::string::npos) << text;
  }
}

}  // namespace
}  // namespace linattn
