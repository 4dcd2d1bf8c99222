// How a client of linattn-server connects: plaintext, TLS (the server's
// certificate verified against given or system CA certificates), or mTLS
// (this client presenting a certificate too), and an optional API key sent
// as `authorization: Bearer KEY` metadata on every call. Every program that
// opens a channel (linattn, linattn-load) takes the same flags through
// AddConnectionFlags, checks them with ResolveConnection before any call,
// and opens its channels with OpenChannel.
//
// The key is never a flag of its own: a command line is visible to every
// user of the machine (ps, /proc), so it comes from a file or from the
// environment (LINATTN_API_KEY).
//
// Thread-safety: ConnectionOptions is plain data; OpenChannel may be called
// from any thread, and its channels are gRPC's (thread-safe).
#ifndef LINATTN_CLIENTS_COMMON_CONNECTION_H_
#define LINATTN_CLIENTS_COMMON_CONNECTION_H_

#include <grpcpp/channel.h>
#include <grpcpp/support/channel_arguments.h>

#include <memory>
#include <string>

#include "absl/status/status.h"

namespace CLI {
class App;
}  // namespace CLI

namespace linattn {

// The environment variable an API key is read from when no --api-key-file
// is given.
inline constexpr char kApiKeyEnv[] = "LINATTN_API_KEY";

// The server a client talks to when no --server is given: the one `make
// run` starts, or the address in kServerEnv (as redis-cli and psql have
// theirs).
inline constexpr char kDefaultServer[] = "127.0.0.1:50051";
inline constexpr char kServerEnv[] = "LINATTN_SERVER";

// kServerEnv when set and not empty, else kDefaultServer.
std::string DefaultServer();

// Adds --server to `app` (`what` describes it in --help), defaulting to
// kDefaultServer and read from kServerEnv when the flag is not given.
// `server` must outlive the parse.
void AddServerFlag(
    CLI::App* app, std::string* server,
    const std::string& what = "host:port, or unix:/path of a local socket");

struct ConnectionOptions {
  // What the flags name (paths and a name); empty = not given.
  std::string tls_ca;           // PEM CA certificates that verify the server
  std::string tls_cert;         // PEM certificate chain this client presents
  std::string tls_key;          // PEM private key of tls_cert
  std::string tls_server_name;  // checked in the server's certificate
  std::string api_key_file;     // its first line is the key

  // The key sent on every call: from api_key_file or kApiKeyEnv (through
  // ResolveConnection), or set directly by a program; empty = none.
  std::string api_key;

  // The contents of tls_ca, tls_cert and tls_key, read by
  // ResolveConnection.
  std::string tls_ca_pem, tls_cert_pem, tls_key_pem;
};

// True when the channel is to use TLS: any of tls_ca, tls_cert, tls_key or
// tls_server_name is set (a server name or a client certificate only means
// something over TLS, so giving one asks for it).
bool UsesTls(const ConnectionOptions& options);

// Adds --tls-ca, --tls-cert, --tls-key, --tls-server-name and
// --api-key-file to `app` (a program or a subcommand), each also read from
// its environment variable (LINATTN_TLS_CA, LINATTN_TLS_CERT,
// LINATTN_TLS_KEY, LINATTN_TLS_SERVER_NAME, LINATTN_API_KEY_FILE), in a
// "Connection" section of --help. `options` must outlive the parse. Give
// every subcommand its own ConnectionOptions: CLI11 stores the environment's
// values into the options of subcommands that were not chosen too.
void AddConnectionFlags(CLI::App* app, ConnectionOptions* options);

// Checks the options and reads what they name, before any call is made:
// tls_cert and tls_key both or neither; every file named exists, is
// readable, is not empty, and for the TLS files holds PEM; the key is the
// first line of api_key_file with trailing whitespace removed or, with no
// file and no key set already, kApiKeyEnv (unset or empty = no key); a key
// must be something an HTTP header value carries unchanged (printable
// ASCII, not starting with a space). Messages name the flag and the file,
// never the key.
absl::Status ResolveConnection(ConnectionOptions* options);

// A channel to `target` (host:port or any gRPC target), connecting lazily:
// over TLS when UsesTls (with tls_server_name as the name checked in the
// server's certificate, GRPC_SSL_TARGET_NAME_OVERRIDE_ARG), else plaintext;
// with an API key, every call on it carries `authorization: Bearer KEY`.
// `options` should have been through ResolveConnection; files it names that
// were not read yet are read here, and if that fails the channel fails
// every call rather than connect with less than was asked for.
std::shared_ptr<grpc::Channel> OpenChannel(const std::string& target,
                                           const ConnectionOptions& options,
                                           grpc::ChannelArguments args = {});

}  // namespace linattn

#endif  // LINATTN_CLIENTS_COMMON_CONNECTION_H_
