#include "server/http_json.h"

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "core/util/json_depth.h"
#include "server/observability.h"
#include "server/rate_limiter.h"

namespace linattn {

std::string DumpJson(const json& body) {
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

json ErrorJson(int status, absl::string_view message, absl::string_view param,
               absl::string_view code) {
  const char* type = status == 401   ? "authentication_error"
                     : status == 429 ? "rate_limit_error"
                     : status == 503 ? "service_unavailable"
                     : status >= 500 ? "server_error"
                                     : "invalid_request_error";
  return {{"error",
           {{"message", std::string(message)},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

void SendError(httplib::Response& res, int status, absl::string_view message,
               absl::string_view param, absl::string_view code) {
  SendJson(res, ErrorJson(status, message, param, code), status);
}

int HttpStatusOf(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

namespace {
constexpr absl::string_view kParamPayload = "linattn.http.param";
}  // namespace

absl::Status InvalidParam(absl::string_view param, absl::string_view message) {
  absl::Status status = absl::InvalidArgumentError(message);
  status.SetPayload(kParamPayload, absl::Cord(param));
  return status;
}

json StatusErrorJson(const absl::Status& status) {
  absl::string_view message = status.message();
  absl::ConsumePrefix(&message, "sampling.");
  std::string param;
  const size_t colon = message.find(": ");
  if (auto given = status.GetPayload(kParamPayload)) {
    param = std::string(*given);
  } else if (colon != absl::string_view::npos && colon > 0 &&
             message.substr(0, colon).find_first_of(" ,") ==
                 absl::string_view::npos) {
    param = std::string(message.substr(0, colon));
  }
  const int http = HttpStatusOf(status);
  const char* code = status.code() == absl::StatusCode::kNotFound ? "not_found"
                     : status.code() == absl::StatusCode::kResourceExhausted
                         ? "resource_exhausted"
                     : status.code() == absl::StatusCode::kAlreadyExists
                         ? "already_exists"
                         : "";
  return ErrorJson(http, message, param, code);
}

void SendStatus(httplib::Response& res, const absl::Status& status) {
  // A rate refusal says when to come back (whole seconds, rounded up).
  if (const std::optional<int64_t> ms = RetryAfterMs(status)) {
    res.set_header("Retry-After", std::to_string((*ms + 999) / 1000));
  }
  SendJson(res, StatusErrorJson(status), HttpStatusOf(status));
}

void SendJson(httplib::Response& res, const json& body, int status) {
  res.status = status;
  res.set_content(DumpJson(body), "application/json");
}

bool ParseJsonBody(const httplib::Request& req, httplib::Response& res,
                   json* out) {
  // Copying and converting parts of a document recurse per level: a
  // hostile nesting is refused before anything is parsed.
  if (!JsonDepthWithin(req.body, kMaxJsonDepth)) {
    SendError(res, 400,
              absl::StrCat("the request body nests deeper than ", kMaxJsonDepth,
                           " levels"));
    return false;
  }
  *out = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (out->is_discarded() || !out->is_object()) {
    SendError(res, 400,
              "the request body must be a JSON object (Content-Type: "
              "application/json)");
    return false;
  }
  return true;
}

absl::StatusOr<Tenant> AuthenticateHttp(const ApiKeys* keys,
                                        const httplib::Request& req,
                                        httplib::Response& res) {
  if (keys == nullptr) return Tenant();
  auto tenant = keys->Authenticate(req.get_header_value("Authorization"));
  if (tenant.ok()) CurrentHttpCall().tenant = tenant->name();
  if (!tenant.ok()) {
    // RFC 6750: the scheme to use; OpenAI's clients read the body.
    res.set_header("WWW-Authenticate", "Bearer");
    SendError(res, 401, tenant.status().message(), "", "invalid_api_key");
  }
  return tenant;
}

}  // namespace linattn
