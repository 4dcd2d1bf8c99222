// TLS for both listeners (--tls-cert, --tls-key, --tls-client-ca), with
// the certificate reloaded on SIGHUP without dropping anything
// (docs/design.md, "TLS").
//
// The files are read and checked with OpenSSL before they are used — each
// PEM parses, the key is the certificate's, the CA bundle holds
// certificates — so a broken file is refused with its flag named, at start
// and at a reload (which then keeps what is in use).
//
//  * gRPC: grpc's TLS credentials with a file-watching certificate
//    provider over a private directory (0700) this class writes: the key
//    and chain in one file, replaced atomically, so the provider (which
//    polls every second) never reads a key with another certificate. Files
//    the operator edits take effect only at a reload, checked first.
//  * HTTP: cpp-httplib's SSLServer, whose context picks the context built
//    from the files in use for each new connection (a ClientHello
//    callback), so a reload swaps it for new connections while open ones
//    keep theirs.
//
// With --tls-client-ca, clients must present a certificate that CA signed
// (mTLS) on both listeners.
#ifndef LINATTN_SERVER_TLS_H_
#define LINATTN_SERVER_TLS_H_

#include <grpcpp/security/server_credentials.h>
#include <openssl/ssl.h>

#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"

namespace linattn {

struct TlsOptions {
  std::string cert;       // PEM certificate chain, leaf first
  std::string key;        // PEM private key of the leaf
  std::string client_ca;  // PEM CA bundle clients' certificates must chain to
  bool enabled() const { return !cert.empty() || !key.empty(); }
};

class TlsMaterial;  // the files as read and checked

class TlsIdentity {
 public:
  // Reads and checks the files (both --tls-cert and --tls-key, or
  // neither; --tls-client-ca only with them) and prepares the private
  // directory.
  static absl::StatusOr<std::unique_ptr<TlsIdentity>> Load(TlsOptions options);
  ~TlsIdentity();

  // Reads and checks the files again and puts them in use for new
  // connections of both listeners; on any error nothing changes.
  absl::Status Reload();

  std::shared_ptr<grpc::ServerCredentials> GrpcCredentials() const;
  // For httplib::SSLServer's setup callback: sets `ctx` up to serve the
  // current files and to switch each new connection to the files in use
  // when it says hello.
  bool SetUpHttpContext(SSL_CTX& ctx);
  bool mutual() const { return !options_.client_ca.empty(); }
  // The certificate in use: its subject and serial, for the log.
  std::string Describe() const;

 private:
  explicit TlsIdentity(TlsOptions options) : options_(std::move(options)) {}
  absl::Status Install(std::shared_ptr<TlsMaterial> material);
  static int OnClientHello(SSL* ssl, int* alert, void* self);

  const TlsOptions options_;
  std::string dir_;  // the gRPC provider's files
  mutable std::mutex mu_;
  std::shared_ptr<TlsMaterial> current_;  // guarded by mu_
};

}  // namespace linattn

#endif  // LINATTN_SERVER_TLS_H_
