#include "server/listen_address.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace linattn {

bool ListenAddress::IsLoopback() const {
  return is_unix() || host == "localhost" || host == "[::1]" ||
         absl::StartsWith(host, "127.");
}

std::string ListenAddress::ToString() const {
  return is_unix() ? absl::StrCat("unix:", unix_path)
                   : absl::StrCat(host, ":", port);
}

absl::StatusOr<ListenAddress> ParseListenAddress(absl::string_view text,
                                                 absl::string_view flag,
                                                 bool allow_unix) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": '", text, "' ", why,
        " (expected host:port, e.g. 127.0.0.1:50051, 0.0.0.0:50051 or "
        "[::1]:50051; port 0 picks a free port",
        allow_unix ? "; or unix:/absolute/path for a unix socket" : "", ")"));
  };
  if (absl::StartsWith(text, "unix:")) {
    if (!allow_unix) return bad("is a unix socket, which only --listen serves");
    ListenAddress out;
    out.unix_path = std::string(text.substr(5));
    if (out.unix_path.empty() || out.unix_path.front() != '/') {
      return bad("needs an absolute path after unix:");
    }
    if (out.unix_path.size() >= sizeof(sockaddr_un{}.sun_path)) {
      return bad(absl::StrCat("has a path longer than a socket address holds (",
                              sizeof(sockaddr_un{}.sun_path) - 1, " bytes)"));
    }
    if (out.unix_path.find('\0') != std::string::npos) {
      return bad("has a NUL byte in its path");
    }
    return out;
  }
  const size_t colon = text.rfind(':');
  if (colon == absl::string_view::npos) return bad("has no port");
  ListenAddress out;
  out.host = std::string(text.substr(0, colon));
  const absl::string_view port = text.substr(colon + 1);
  if (out.host.empty()) return bad("has no host");
  if (out.host.front() == '[') {
    if (out.host.size() < 3 || out.host.back() != ']' ||
        out.host.find_first_not_of("0123456789abcdefABCDEF:.", 1) !=
            out.host.size() - 1) {
      return bad("has a malformed IPv6 host");
    }
  } else {
    if (out.host.find(':') != std::string::npos) {
      return bad("has an IPv6 host without [brackets]");
    }
    for (char c : out.host) {
      if (!absl::ascii_isalnum(c) && c != '.' && c != '-' && c != '_') {
        return bad("has a host that is not a name or an address");
      }
    }
  }
  uint32_t number = 0;
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != absl::string_view::npos ||
      !absl::SimpleAtoi(port, &number) || number > 65535) {
    return bad("has a port that is not a number in 0..65535");
  }
  out.port = static_cast<uint16_t>(number);
  return out;
}

absl::StatusOr<AddressList> ResolveListenAddress(const ListenAddress& address,
                                                 absl::string_view flag) {
  std::string host = address.host;
  if (!host.empty() && host.front() == '[') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(address.port);
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
      rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": cannot resolve '", address.host, "': ", gai_strerror(rc)));
  }
  return AddressList(found, freeaddrinfo);
}

namespace {

absl::Status CheckCanListenUnix(const ListenAddress& address,
                                absl::string_view flag) {
  struct stat st {};
  if (lstat(address.unix_path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();  // bind says if it can't
    return absl::UnavailableError(absl::StrCat(
        flag, ": cannot use ", address.unix_path, ": ", std::strerror(errno)));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(flag, ": ", address.unix_path,
                     " exists and is not a socket; linattn does not replace "
                     "it"));
  }
  // Non-blocking: a server whose backlog is full answers EAGAIN at once
  // instead of holding the start.
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat(flag, ": socket(): ", std::strerror(errno)));
  }
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, address.unix_path.data(), address.unix_path.size());
  const int rc =
      connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof(sa));
  const int error = errno;
  close(fd);
  if (rc == 0 || error == EAGAIN) {
    return absl::FailedPreconditionError(
        absl::StrCat(flag, ": ", address.ToString(),
                     " is already in use (is another linattn-server "
                     "running there?)"));
  }
  if (error != ECONNREFUSED) {  // not provably abandoned: left alone
    return absl::FailedPreconditionError(
        absl::StrCat(flag, ": cannot tell whether a server listens on ",
                     address.unix_path, ": ", std::strerror(error)));
  }
  return absl::OkStatus();  // a socket left behind: gRPC replaces it
}

}  // namespace

std::string DefaultHttpListen(const ListenAddress& grpc) {
  if (grpc.is_unix()) return absl::StrCat("127.0.0.1:", kDefaultHttpPort);
  const std::string host = grpc.IsLoopback() ? grpc.host : "127.0.0.1";
  uint32_t port = kDefaultHttpPort;
  if (grpc.port == 0) {
    port = 0;
  } else if (grpc.port >= kDefaultGrpcPort) {
    const uint32_t derived = uint32_t{kDefaultHttpPort} +
                             (uint32_t{grpc.port} - uint32_t{kDefaultGrpcPort});
    if (derived <= 65535u) port = derived;
  }
  return absl::StrCat(host, ":", port);
}

absl::Status CheckCanListen(const ListenAddress& address,
                            absl::string_view flag) {
  if (address.is_unix()) return CheckCanListenUnix(address, flag);
  if (address.port == 0) return absl::OkStatus();
  auto found = ResolveListenAddress(address, flag);
  if (!found.ok()) return found.status();
  absl::Status status = absl::OkStatus();
  for (addrinfo* a = found->get(); a != nullptr && status.ok();
       a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0) {
      const int error = errno;
      status = error == EADDRINUSE
                   ? absl::FailedPreconditionError(absl::StrCat(
                         flag, ": ", address.ToString(),
                         " is already in use (is another linattn-server "
                         "running there? give this one its own ",
                         flag, " HOST:PORT)"))
                   : absl::UnavailableError(absl::StrCat(
                         flag, ": cannot bind ", address.ToString(), ": ",
                         std::strerror(error)));
    }
    close(fd);
  }
  return status;
}

}  // namespace linattn
