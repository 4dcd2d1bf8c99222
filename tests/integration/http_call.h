// One HTTP request to a server on 127.0.0.1 (cpp-httplib's client), for the
// HTTP listener's tests.
#ifndef LINATTN_TESTS_INTEGRATION_HTTP_CALL_H_
#define LINATTN_TESTS_INTEGRATION_HTTP_CALL_H_

#include <httplib.h>

#include <string>

#include "nlohmann/json.hpp"

namespace linattn::testing {

struct HttpReply {
  int status = 0;       // 0 when no answer came
  nlohmann::json body;  // discarded when the body is not JSON
  std::string raw;      // the body as it came
  std::string content_type;
};

// GET, DELETE, or POST of `body` as application/json (sent as given, so a
// test may send what is not JSON).
// `bearer`: an API key, sent as "Authorization: Bearer KEY".
inline HttpReply HttpCall(int port, const std::string& method,
                          const std::string& path, const std::string& body = "",
                          const std::string& bearer = "") {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(60, 0);
  if (!bearer.empty()) client.set_bearer_token_auth(bearer.c_str());
  httplib::Result r = method == "GET" ? client.Get(path.c_str())
                      : method == "DELETE"
                          ? client.Delete(path.c_str())
                          : client.Post(path.c_str(), body, "application/json");
  HttpReply out;
  if (!r) return out;
  out.status = r->status;
  out.raw = r->body;
  out.content_type = r->get_header_value("Content-Type");
  out.body =
      nlohmann::json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  return out;
}

}  // namespace linattn::testing

#endif  // LINATTN_TESTS_INTEGRATION_HTTP_CALL_H_
