#include "server/tls.h"

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "core/util/file_io.h"
#include "core/util/status_macros.h"

namespace linattn {

// The files as read and checked, and the HTTP context serving them.
class TlsMaterial {
 public:
  ~TlsMaterial() { SSL_CTX_free(ctx); }
  std::string chain_pem, key_pem, ca_pem;
  SSL_CTX* ctx = nullptr;
  std::string description;  // the leaf's subject and serial
};

namespace {

// OpenSSL's reason for the last failure, and its queue emptied.
std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "no detail from OpenSSL";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using Bio = std::unique_ptr<BIO, BioFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;

Bio MemoryBio(const std::string& pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// Every certificate in `pem`, in order; none is an error naming `flag`.
absl::StatusOr<std::vector<X509Ptr>> Certificates(const std::string& pem,
                                                  const char* flag,
                                                  const std::string& path) {
  std::vector<X509Ptr> out;
  Bio bio = MemoryBio(pem);
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    out.emplace_back(x);
  }
  ERR_clear_error();  // the end of the file reads as an error
  if (out.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": ", path,
                     " holds no PEM certificate (-----BEGIN CERTIFICATE)"));
  }
  return out;
}

std::string Describe(X509* leaf) {
  char subject[512];
  X509_NAME_oneline(X509_get_subject_name(leaf), subject, sizeof(subject));
  std::string serial = "?";
  if (BIGNUM* bn = ASN1_INTEGER_to_BN(X509_get_serialNumber(leaf), nullptr)) {
    if (char* hex = BN_bn2hex(bn)) {
      serial = hex;
      OPENSSL_free(hex);
    }
    BN_free(bn);
  }
  return absl::StrCat(subject, " (serial ", serial, ")");
}

// Reads and checks the files, and builds the HTTP context serving them.
absl::StatusOr<std::shared_ptr<TlsMaterial>> Read(const TlsOptions& o) {
  auto m = std::make_shared<TlsMaterial>();
  LINATTN_ASSIGN_OR_RETURN(m->chain_pem, ReadWholeFile("--tls-cert", o.cert));
  LINATTN_ASSIGN_OR_RETURN(m->key_pem, ReadWholeFile("--tls-key", o.key));
  if (!o.client_ca.empty()) {
    LINATTN_ASSIGN_OR_RETURN(m->ca_pem,
                             ReadWholeFile("--tls-client-ca", o.client_ca));
  }
  LINATTN_ASSIGN_OR_RETURN(std::vector<X509Ptr> chain,
                           Certificates(m->chain_pem, "--tls-cert", o.cert));
  Bio key_bio = MemoryBio(m->key_pem);
  std::unique_ptr<EVP_PKEY, PkeyFree> key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-key: ", o.key, " holds no PEM private key (",
                     OpenSslError(), ")"));
  }
  m->ctx = SSL_CTX_new(TLS_server_method());
  if (m->ctx == nullptr) {
    return absl::InternalError(
        absl::StrCat("TLS: creating a context: ", OpenSslError()));
  }
  SSL_CTX_set_min_proto_version(m->ctx, TLS1_2_VERSION);
  if (SSL_CTX_use_certificate(m->ctx, chain[0].get()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-cert: ", o.cert, ": not usable: ", OpenSslError()));
  }
  for (size_t i = 1; i < chain.size(); ++i) {
    if (SSL_CTX_add1_chain_cert(m->ctx, chain[i].get()) != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tls-cert: ", o.cert, ": certificate ", i + 1,
                       " of the chain is not usable: ", OpenSslError()));
    }
  }
  if (SSL_CTX_use_PrivateKey(m->ctx, key.get()) != 1 ||
      SSL_CTX_check_private_key(m->ctx) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-key: ", o.key,
                     " is not the private key of the certificate in ", o.cert));
  }
  if (!o.client_ca.empty()) {
    LINATTN_ASSIGN_OR_RETURN(
        std::vector<X509Ptr> cas,
        Certificates(m->ca_pem, "--tls-client-ca", o.client_ca));
    X509_STORE* store = SSL_CTX_get_cert_store(m->ctx);
    for (const X509Ptr& ca : cas) {
      if (X509_STORE_add_cert(store, ca.get()) != 1 ||
          SSL_CTX_add_client_CA(m->ctx, ca.get()) != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--tls-client-ca: ", o.client_ca, ": ", OpenSslError()));
      }
    }
    // No certificate, or one the CA did not sign: the handshake fails.
    SSL_CTX_set_verify(
        m->ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  m->description = Describe(chain[0].get());
  return m;
}

// `data` into `path` atomically (written beside it, then renamed), 0600.
absl::Status Replace(const std::string& path, const std::string& data) {
  const std::string temp = path + ".new";
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out << data;
    if (!out.flush()) {
      return absl::InternalError(absl::StrCat("TLS: writing ", temp));
    }
  }
  chmod(temp.c_str(), 0600);
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("TLS: renaming ", temp));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<TlsIdentity>> TlsIdentity::Load(
    TlsOptions options) {
  if (options.cert.empty() != options.key.empty()) {
    return absl::InvalidArgumentError(
        options.cert.empty()
            ? "--tls-key: needs --tls-cert (the certificate it belongs to)"
            : "--tls-cert: needs --tls-key (its private key)");
  }
  if (!options.client_ca.empty() && options.cert.empty()) {
    return absl::InvalidArgumentError(
        "--tls-client-ca: needs --tls-cert and --tls-key (clients are "
        "verified over TLS)");
  }
  std::unique_ptr<TlsIdentity> t(new TlsIdentity(std::move(options)));
  LINATTN_ASSIGN_OR_RETURN(std::shared_ptr<TlsMaterial> material,
                           Read(t->options_));
  // The gRPC provider's files: a directory only this user can read.
  std::string pattern =
      (std::filesystem::temp_directory_path() / "linattn-tls-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError(
        absl::StrCat("TLS: creating a private directory like ", pattern));
  }
  t->dir_ = pattern;
  LINATTN_RETURN_IF_ERROR(t->Install(std::move(material)));
  return t;
}

TlsIdentity::~TlsIdentity() {
  if (!dir_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
}

absl::Status TlsIdentity::Install(std::shared_ptr<TlsMaterial> material) {
  // The key and the chain in one file: one rename replaces both.
  LINATTN_RETURN_IF_ERROR(Replace(
      dir_ + "/identity.pem", material->key_pem + "\n" + material->chain_pem));
  if (mutual()) {
    LINATTN_RETURN_IF_ERROR(Replace(dir_ + "/ca.pem", material->ca_pem));
  }
  std::lock_guard<std::mutex> lock(mu_);
  current_ = std::move(material);
  return absl::OkStatus();
}

absl::Status TlsIdentity::Reload() {
  LINATTN_ASSIGN_OR_RETURN(std::shared_ptr<TlsMaterial> material,
                           Read(options_));
  return Install(std::move(material));
}

std::string TlsIdentity::Describe() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_->description;
}

std::shared_ptr<grpc::ServerCredentials> TlsIdentity::GrpcCredentials() const {
  const std::string identity = dir_ + "/identity.pem";
  // Polled every second; Install replaces the files whole.
  constexpr unsigned int kRefreshSeconds = 1;
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider =
      mutual() ? std::make_shared<
                     grpc::experimental::FileWatcherCertificateProvider>(
                     identity, identity, dir_ + "/ca.pem", kRefreshSeconds)
               : std::make_shared<
                     grpc::experimental::FileWatcherCertificateProvider>(
                     identity, identity, kRefreshSeconds);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (mutual()) {
    options.watch_root_certs();
    options.set_cert_request_type(
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

bool TlsIdentity::SetUpHttpContext(SSL_CTX& ctx) {
  std::shared_ptr<TlsMaterial> m;
  {
    std::lock_guard<std::mutex> lock(mu_);
    m = current_;
  }
  // The base context serves the files as they are now, with the same
  // verification; each connection then switches to the files in use.
  SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION);
  if (SSL_CTX_use_certificate(&ctx, SSL_CTX_get0_certificate(m->ctx)) != 1 ||
      SSL_CTX_use_PrivateKey(&ctx, SSL_CTX_get0_privatekey(m->ctx)) != 1) {
    return false;
  }
  if (mutual()) {
    SSL_CTX_set_verify(&ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT,
                       nullptr);
  }
  SSL_CTX_set_client_hello_cb(&ctx, &TlsIdentity::OnClientHello, this);
  return true;
}

int TlsIdentity::OnClientHello(SSL* ssl, int*, void* self) {
  auto* t = static_cast<TlsIdentity*>(self);
  SSL_CTX* ctx = nullptr;
  {
    std::lock_guard<std::mutex> lock(t->mu_);
    ctx = t->current_->ctx;
    // SSL_set_SSL_CTX takes its own reference, so the connection keeps its
    // context after a reload drops ours.
    if (SSL_get_SSL_CTX(ssl) != ctx) SSL_set_SSL_CTX(ssl, ctx);
  }
  return SSL_CLIENT_HELLO_SUCCESS;
}

}  // namespace linattn
