// The --listen address: host:port, or unix:PATH for clients on the same
// machine (a sidecar, the load tool), checked before gRPC sees it. gRPC
// itself accepts much that an operator did not mean (a port above 65535
// wraps, a missing port becomes 443), by default shares a port with
// another process (SO_REUSEPORT), which splits a replica's sessions
// between two servers, and removes whatever socket file is at a unix
// path, a live server's included; linattn refuses all of these with the
// flag named.
#ifndef LINATTN_SERVER_LISTEN_ADDRESS_H_
#define LINATTN_SERVER_LISTEN_ADDRESS_H_

#include <netdb.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace linattn {

struct ListenAddress {
  std::string host;       // as given: a name, an IPv4 address, or [IPv6]
  uint16_t port = 0;      // 0 = pick a free port
  std::string unix_path;  // set (absolute) for a unix socket; host/port unused
  bool is_unix() const { return !unix_path.empty(); }
  // host:port or unix:PATH, for gRPC and for logs.
  std::string ToString() const;
  // 127.0.0.0/8, [::1], localhost or a unix socket: only this machine can
  // connect (to a unix socket, the processes its file's mode lets in).
  bool IsLoopback() const;
};

// "127.0.0.1:50051", "0.0.0.0:0", "[::1]:8080", "localhost:50051", and with
// `allow_unix` "unix:/run/linattn.sock" (an absolute path that fits a
// socket address, 107 bytes). INVALID_ARGUMENT naming `flag` when it is
// anything else.
absl::StatusOr<ListenAddress> ParseListenAddress(absl::string_view text,
                                                 absl::string_view flag,
                                                 bool allow_unix = false);

// The HTTP listener's address when --http-listen is not given, from the
// gRPC listener's, so that servers started side by side with their own
// --listen ports get their own HTTP ports too: on the gRPC host when that
// is a loopback one (else 127.0.0.1: HTTP is opened to the network only by
// naming it), at port 8080 + (P − 50051) for a gRPC port P ≥ 50051 (50051
// → 8080, 50052 → 8081, …), a free port for P = 0, and 8080 for any other
// port and for a unix socket.
inline constexpr uint16_t kDefaultGrpcPort = 50051;
inline constexpr uint16_t kDefaultHttpPort = 8080;
std::string DefaultHttpListen(const ListenAddress& grpc);

// The address's host resolved for a passive TCP socket (getaddrinfo),
// INVALID_ARGUMENT naming `flag` when it cannot be.
using AddressList = std::unique_ptr<addrinfo, void (*)(addrinfo*)>;
absl::StatusOr<AddressList> ResolveListenAddress(const ListenAddress& address,
                                                 absl::string_view flag);

// OK when nothing listens on the address's port (port 0 always is);
// FAILED_PRECONDITION naming `flag` when another socket already listens
// there, with the system's reason otherwise. Binds a probe socket the way
// gRPC does (SO_REUSEADDR, no SO_REUSEPORT) and closes it. For a unix
// path: OK when nothing is there or only a socket nobody accepts on (left
// by a server that died; gRPC replaces it); FAILED_PRECONDITION when a
// server accepts on it or the path is not a socket.
absl::Status CheckCanListen(const ListenAddress& address,
                            absl::string_view flag);

}  // namespace linattn

#endif  // LINATTN_SERVER_LISTEN_ADDRESS_H_
