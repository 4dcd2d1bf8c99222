// JSON in and out of the HTTP listener's handlers (server/http_frontend.h):
// OpenAI's error body, absl::Status → HTTP status, request bodies.
#ifndef LINATTN_SERVER_HTTP_JSON_H_
#define LINATTN_SERVER_HTTP_JSON_H_

#include <httplib.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/session/tenant.h"
#include "nlohmann/json.hpp"
#include "server/api_keys.h"

namespace linattn {

using nlohmann::json;

// JSON text whatever the strings hold (bytes that are not UTF-8, from a
// byte-level tokenizer's partial characters, become U+FFFD).
std::string DumpJson(const json& body);

// OpenAI's error body, {"error": {"message", "type", "param", "code"}}.
json ErrorJson(int status, absl::string_view message,
               absl::string_view param = "", absl::string_view code = "");
void SendError(httplib::Response& res, int status, absl::string_view message,
               absl::string_view param = "", absl::string_view code = "");
// A status from the engine: its HTTP status (400 INVALID_ARGUMENT and
// FAILED_PRECONDITION, 404 NOT_FOUND, 409 ALREADY_EXISTS, 429
// RESOURCE_EXHAUSTED, 503 UNAVAILABLE, 504 DEADLINE_EXCEEDED, 500 the
// rest) and, for a message that starts with a field name ("field: ..."),
// that field as `param`. "sampling." prefixes drop: the HTTP fields are
// top-level.
int HttpStatusOf(const absl::Status& status);
void SendStatus(httplib::Response& res, const absl::Status& status);
json StatusErrorJson(const absl::Status& status);
// INVALID_ARGUMENT whose OpenAI `param` is `param` whatever the message
// begins with (e.g. "prompt[3]: ..." answered with param "prompt").
absl::Status InvalidParam(absl::string_view param, absl::string_view message);

void SendJson(httplib::Response& res, const json& body, int status = 200);

// The tenant of a request's `Authorization: Bearer KEY` header (the
// anonymous tenant when `keys` is null or off); otherwise 401 is sent,
// with WWW-Authenticate, and the status returned.
absl::StatusOr<Tenant> AuthenticateHttp(const ApiKeys* keys,
                                        const httplib::Request& req,
                                        httplib::Response& res);

// The request body as a JSON object; false (the error sent) otherwise.
bool ParseJsonBody(const httplib::Request& req, httplib::Response& res,
                   json* out);

}  // namespace linattn

#endif  // LINATTN_SERVER_HTTP_JSON_H_
