// The --listen address: host:port, checked before gRPC sees it. gRPC itself
// accepts much that an operator did not mean (a port above 65535 wraps, a
// missing port becomes 443) and by default shares a port with another
// process (SO_REUSEPORT), which splits a replica's sessions between two
// servers; linattn refuses all of these with the flag named.
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
  std::string host;              // as given: a name, an IPv4 address, or [IPv6]
  uint16_t port = 0;             // 0 = pick a free port
  std::string ToString() const;  // host:port, for gRPC and for logs
  // 127.0.0.0/8, [::1] or localhost: only this machine can connect.
  bool IsLoopback() const;
};

// "127.0.0.1:50051", "0.0.0.0:0", "[::1]:8080", "localhost:50051".
// INVALID_ARGUMENT naming `flag` when it is anything else.
absl::StatusOr<ListenAddress> ParseListenAddress(absl::string_view text,
                                                 absl::string_view flag);

// The address's host resolved for a passive TCP socket (getaddrinfo),
// INVALID_ARGUMENT naming `flag` when it cannot be.
using AddressList = std::unique_ptr<addrinfo, void (*)(addrinfo*)>;
absl::StatusOr<AddressList> ResolveListenAddress(const ListenAddress& address,
                                                 absl::string_view flag);

// OK when nothing listens on the address's port (port 0 always is);
// FAILED_PRECONDITION naming `flag` when another socket already listens
// there, with the system's reason otherwise. Binds a probe socket the way
// gRPC does (SO_REUSEADDR, no SO_REUSEPORT) and closes it.
absl::Status CheckCanListen(const ListenAddress& address,
                            absl::string_view flag);

}  // namespace linattn

#endif  // LINATTN_SERVER_LISTEN_ADDRESS_H_
