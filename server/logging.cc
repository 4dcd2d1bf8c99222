#include "server/logging.h"

#include <chrono>
#include <memory>

#include "absl/strings/str_format.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace linattn {
namespace {

using nlohmann::json;

constexpr char kAccessLogger[] = "access";

// JSON text of `value` whatever its strings hold.
template <typename Json>
std::string Dump(const Json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string UtcTime(std::chrono::system_clock::time_point t) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                      t.time_since_epoch())
                      .count();
  const std::time_t seconds = static_cast<std::time_t>(us / 1000000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  return absl::StrFormat("%04d-%02d-%02dT%02d:%02d:%02d.%06dZ",
                         tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                         tm.tm_hour, tm.tm_min, tm.tm_sec,
                         static_cast<int>(us % 1000000));
}

// One JSON object per line. An access line's payload is already the JSON
// of its fields (LogAccess), which become top-level members; any other
// message is the "msg" string.
class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg,
              spdlog::memory_buf_t& dest) override {
    nlohmann::ordered_json line = nlohmann::ordered_json::object();
    line["time"] = UtcTime(msg.time);
    const auto level = spdlog::level::to_string_view(msg.level);
    line["level"] = std::string(level.data(), level.size());
    line["logger"] =
        std::string(msg.logger_name.data(), msg.logger_name.size());
    const std::string payload(msg.payload.data(), msg.payload.size());
    if (msg.logger_name == kAccessLogger) {
      json fields = json::parse(payload, nullptr, /*allow_exceptions=*/false);
      if (fields.is_object()) {
        for (auto& [key, value] : fields.items()) line[key] = value;
      } else {
        line["msg"] = payload;
      }
    } else {
      line["msg"] = payload;
    }
    const std::string text = Dump(line);
    dest.append(text.data(), text.data() + text.size());
    dest.push_back('\n');
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>();
  }
};

bool json_lines = false;
std::shared_ptr<spdlog::logger> access_logger;  // set once, at start

}  // namespace

void SetUpLogging(const std::string& level, bool json_output, bool access_log) {
  auto logger = spdlog::stdout_logger_mt("linattn");
  spdlog::set_default_logger(logger);
  auto access = std::make_shared<spdlog::logger>(
      kAccessLogger, logger->sinks().begin(), logger->sinks().end());
  spdlog::register_logger(access);
  access_logger = access;
  const spdlog::level::level_enum threshold = spdlog::level::from_str(level);
  spdlog::set_level(threshold);
  // Access lines are info: written when the level lets info through,
  // unless turned off.
  access->set_level(access_log && threshold <= spdlog::level::info
                        ? spdlog::level::info
                        : spdlog::level::off);
  json_lines = json_output;
  if (json_output) {
    spdlog::set_formatter(std::make_unique<JsonFormatter>());
  }
  spdlog::flush_on(spdlog::level::info);
}

bool AccessLogOn() {
  return access_logger != nullptr &&
         access_logger->should_log(spdlog::level::info);
}

void LogAccess(const json& fields) {
  if (!AccessLogOn()) return;
  spdlog::logger* access = access_logger.get();
  if (json_lines) {
    access->info(Dump(fields));
    return;
  }
  std::string line = "access";
  for (const auto& [key, value] : fields.items()) {
    line += ' ';
    line += key;
    line += '=';
    line += Dump(value);  // strings quoted and escaped
  }
  access->info(line);
}

}  // namespace linattn
