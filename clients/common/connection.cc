#include "clients/common/connection.h"

#include <fcntl.h>
#include <grpc/grpc.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/client_interceptor.h>
#include <grpcpp/support/interceptor.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace linattn {

namespace {

// PEM files and key files are small; the bound keeps a path such as
// /dev/zero or a log file given by mistake from being read without end.
constexpr size_t kMaxFileBytes = 1 << 20;

// The whole of `path`, named in errors with the flag that gave it: missing,
// unreadable, a directory, empty, or larger than kMaxFileBytes.
absl::StatusOr<std::string> ReadFlagFile(absl::string_view flag,
                                         const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat(flag, ": no such file: ", path));
    }
    return absl::PermissionDeniedError(
        absl::StrCat(flag, ": cannot read ", path, ": ", std::strerror(err)));
  }
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": ", path, " is a directory, not a file"));
  }
  std::string data;
  char buf[8192];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return absl::PermissionDeniedError(
          absl::StrCat(flag, ": cannot read ", path, ": ", std::strerror(err)));
    }
    if (n == 0) break;
    data.append(buf, static_cast<size_t>(n));
    if (data.size() > kMaxFileBytes) {
      ::close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": ", path, " is larger than ", kMaxFileBytes,
                       " bytes, which no certificate, key or API key is"));
    }
  }
  ::close(fd);
  if (data.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": ", path, " is empty"));
  }
  return data;
}

// A TLS file that is not PEM would otherwise fail only at the handshake,
// as an opaque UNAVAILABLE; refusing it here names the file.
absl::StatusOr<std::string> ReadPemFile(absl::string_view flag,
                                        const std::string& path) {
  absl::StatusOr<std::string> data = ReadFlagFile(flag, path);
  if (data.ok() && !absl::StrContains(*data, "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": ", path, " is not PEM (no -----BEGIN line)"));
  }
  return data;
}

// gRPC refuses metadata values outside printable ASCII, and an HTTP peer
// (a proxy in front of the server) strips a leading space, so a key with
// either would not arrive as it was written. `source` names where the key
// came from; the key itself never appears in a message.
absl::Status CheckApiKey(const std::string& key, absl::string_view source) {
  for (size_t i = 0; i < key.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(key[i]);
    if (c < 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          source,
          ": the API key has a character an HTTP header value cannot "
          "carry at byte ",
          i, " (a key is printable ASCII)"));
    }
  }
  if (!key.empty() && key[0] == ' ') {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": the API key starts with a space, which HTTP would drop"));
  }
  return absl::OkStatus();
}

// Reads the files `options` names into it; the environment is not looked
// at (ResolveConnection does that), so that OpenChannel can finish options
// a caller did not resolve without taking a key from elsewhere.
absl::Status ReadConnectionFiles(ConnectionOptions* o) {
  if (o->tls_cert.empty() != o->tls_key.empty()) {
    return absl::InvalidArgumentError(
        o->tls_cert.empty()
            ? "--tls-key: needs --tls-cert (the certificate the key belongs "
              "to)"
            : "--tls-cert: needs --tls-key (the certificate's private key)");
  }
  struct PemFile {
    const char* flag;
    const std::string& path;
    std::string& pem;
  };
  for (const PemFile& f : {PemFile{"--tls-ca", o->tls_ca, o->tls_ca_pem},
                           PemFile{"--tls-cert", o->tls_cert, o->tls_cert_pem},
                           PemFile{"--tls-key", o->tls_key, o->tls_key_pem}}) {
    if (f.path.empty()) continue;
    absl::StatusOr<std::string> contents = ReadPemFile(f.flag, f.path);
    if (!contents.ok()) return contents.status();
    f.pem = std::move(*contents);
  }
  if (!o->api_key_file.empty()) {
    absl::StatusOr<std::string> data =
        ReadFlagFile("--api-key-file", o->api_key_file);
    if (!data.ok()) return data.status();
    std::string key = data->substr(0, data->find('\n'));
    absl::StripTrailingAsciiWhitespace(&key);
    if (key.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--api-key-file: the first line of ", o->api_key_file,
                       " is empty (it holds the key)"));
    }
    if (absl::Status s =
            CheckApiKey(key, absl::StrCat("--api-key-file ", o->api_key_file));
        !s.ok()) {
      return s;
    }
    o->api_key = std::move(key);
  }
  return absl::OkStatus();
}

// Files named but not read: options that did not go through
// ResolveConnection (every file it reads is non-empty).
bool FilesUnread(const ConnectionOptions& o) {
  return (!o.tls_ca.empty() && o.tls_ca_pem.empty()) ||
         (!o.tls_cert.empty() && o.tls_cert_pem.empty()) ||
         (!o.tls_key.empty() && o.tls_key_pem.empty()) ||
         (!o.api_key_file.empty() && o.api_key.empty());
}

// Adds `authorization: Bearer KEY` to the initial metadata of every call.
// An interceptor rather than grpc::AccessTokenCredentials: gRPC refuses call
// credentials on a plaintext channel, and a key must also work over
// plaintext to a server on loopback.
class BearerInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit BearerInterceptor(std::string value) : value_(std::move(value)) {}

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::
                PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("authorization", value_);
    }
    methods->Proceed();
  }

 private:
  const std::string value_;
};

class BearerInterceptorFactory
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerInterceptorFactory(const std::string& api_key)
      : value_(absl::StrCat("Bearer ", api_key)) {}

  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new BearerInterceptor(value_);
  }

 private:
  const std::string value_;
};

std::shared_ptr<grpc::Channel> OpenResolved(const std::string& target,
                                            const ConnectionOptions& o,
                                            grpc::ChannelArguments args) {
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (UsesTls(o)) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = o.tls_ca_pem;  // empty: the system's CAs
    ssl.pem_private_key = o.tls_key_pem;
    ssl.pem_cert_chain = o.tls_cert_pem;
    credentials = grpc::SslCredentials(ssl);
    if (!o.tls_server_name.empty()) {
      args.SetString(GRPC_SSL_TARGET_NAME_OVERRIDE_ARG, o.tls_server_name);
    }
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  if (o.api_key.empty()) {
    return grpc::CreateCustomChannel(target, credentials, args);
  }
  std::vector<
      std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(std::make_unique<BearerInterceptorFactory>(o.api_key));
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      target, credentials, args, std::move(interceptors));
}

}  // namespace

bool UsesTls(const ConnectionOptions& o) {
  return !o.tls_ca.empty() || !o.tls_cert.empty() || !o.tls_key.empty() ||
         !o.tls_server_name.empty();
}

std::string DefaultServer() {
  const char* env = std::getenv(kServerEnv);
  return env != nullptr && env[0] != '\0' ? env : kDefaultServer;
}

void AddServerFlag(CLI::App* app, std::string* server,
                   const std::string& what) {
  *server = kDefaultServer;
  app->add_option("--server", *server,
                  what + " (default: the server `make run` starts)")
      ->envname(kServerEnv)
      ->type_name("ADDR")
      ->capture_default_str();
}

void AddConnectionFlags(CLI::App* app, ConnectionOptions* o) {
  constexpr char kGroup[] = "Connection";
  app->add_option("--tls-ca", o->tls_ca,
                  "PEM file of the CA certificates that verify the server's "
                  "certificate; turns TLS on")
      ->type_name("FILE")
      ->envname("LINATTN_TLS_CA")
      ->group(kGroup);
  app->add_option("--tls-cert", o->tls_cert,
                  "PEM certificate chain this client presents (mTLS; needs "
                  "--tls-key); turns TLS on, verifying the server against the "
                  "system's CA certificates unless --tls-ca")
      ->type_name("FILE")
      ->envname("LINATTN_TLS_CERT")
      ->group(kGroup);
  app->add_option("--tls-key", o->tls_key,
                  "PEM private key of --tls-cert (needs --tls-cert)")
      ->type_name("FILE")
      ->envname("LINATTN_TLS_KEY")
      ->group(kGroup);
  app->add_option("--tls-server-name", o->tls_server_name,
                  "the name the server's certificate must carry, instead of "
                  "the host of --server (when that is an IP address or a "
                  "proxy); turns TLS on")
      ->type_name("NAME")
      ->envname("LINATTN_TLS_SERVER_NAME")
      ->group(kGroup);
  app->add_option("--api-key-file", o->api_key_file,
                  absl::StrCat("file whose first line is the API key, sent "
                               "as `authorization: Bearer KEY` on every call "
                               "(default: the key in $",
                               kApiKeyEnv,
                               "); without TLS it crosses the network in "
                               "the clear"))
      ->type_name("FILE")
      ->envname("LINATTN_API_KEY_FILE")
      ->group(kGroup);
}

absl::Status ResolveConnection(ConnectionOptions* o) {
  if (absl::Status s = ReadConnectionFiles(o); !s.ok()) return s;
  if (o->api_key_file.empty() && o->api_key.empty()) {
    if (const char* env = std::getenv(kApiKeyEnv); env != nullptr) {
      std::string key(env);
      absl::StripTrailingAsciiWhitespace(&key);
      if (absl::Status s = CheckApiKey(key, kApiKeyEnv); !s.ok()) return s;
      o->api_key = std::move(key);
    }
  } else if (o->api_key_file.empty()) {
    // A key set by the program itself is held to the same rules.
    if (absl::Status s = CheckApiKey(o->api_key, "api_key"); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

std::shared_ptr<grpc::Channel> OpenChannel(const std::string& target,
                                           const ConnectionOptions& options,
                                           grpc::ChannelArguments args) {
  if (!FilesUnread(options)) {
    return OpenResolved(target, options, std::move(args));
  }
  ConnectionOptions resolved = options;
  if (!ReadConnectionFiles(&resolved).ok()) {
    // gRPC's answer to missing credentials: a channel on which every call
    // fails (INVALID_ARGUMENT), never a weaker connection than asked for.
    return grpc::CreateCustomChannel(target, nullptr, args);
  }
  return OpenResolved(target, resolved, std::move(args));
}

}  // namespace linattn
