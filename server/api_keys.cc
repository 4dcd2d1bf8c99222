#include "server/api_keys.h"

#include <openssl/evp.h>

#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/util/byte_size.h"
#include "core/util/file_io.h"
#include "nlohmann/json.hpp"

namespace linattn {
namespace {

using nlohmann::json;

bool IsTenantName(absl::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (const char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' &&
        c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

bool IsSha256Hex(absl::string_view hex) {
  if (hex.size() != 64) return false;
  for (const char c : hex) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// A quota field: absent = 0; a non-negative integer; byte sizes may also be
// strings with a unit ("1GiB").
absl::StatusOr<uint64_t> QuotaField(const json& entry, const char* field,
                                    bool bytes, const std::string& where) {
  auto it = entry.find(field);
  if (it == entry.end() || it->is_null()) return 0;
  if (it->is_number_unsigned()) return it->get<uint64_t>();
  if (bytes && it->is_string()) {
    auto parsed = ParseByteSize(it->get<std::string>());
    if (parsed.ok()) return *parsed;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      where, field, ": must be a whole number >= 0",
      bytes ? " of bytes, or a size with a unit (\"512MiB\")" : ""));
}

}  // namespace

std::string Sha256Hex(absl::string_view bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &n, EVP_sha256(), nullptr);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (unsigned int i = 0; i < n; ++i) {
    out.push_back(kHex[digest[i] >> 4]);
    out.push_back(kHex[digest[i] & 15]);
  }
  return out;
}

absl::StatusOr<std::shared_ptr<const ApiKeySet>> ApiKeySet::Parse(
    absl::string_view text, absl::string_view origin) {
  const json doc = json::parse(text.begin(), text.end(), nullptr,
                               /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": not a JSON object ({\"keys\": [...]})"));
  }
  auto keys = doc.find("keys");
  if (keys == doc.end() || !keys->is_array() || keys->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": keys: must be a non-empty array"));
  }
  auto set = std::make_shared<ApiKeySet>();
  std::vector<std::pair<std::string, std::string>> hashes;  // hash, tenant
  for (size_t i = 0; i < keys->size(); ++i) {
    const json& entry = (*keys)[i];
    const std::string where = absl::StrCat(origin, ": keys[", i, "].");
    if (!entry.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(origin, ": keys[", i, "]: must be an object"));
    }
    for (const auto& [field, value] : entry.items()) {
      if (field != "sha256" && field != "tenant" && field != "admin" &&
          field != "max_sessions" && field != "max_state_bytes" &&
          field != "tokens_per_second") {
        return absl::InvalidArgumentError(
            absl::StrCat(where, field,
                         ": unknown field (sha256, tenant, admin, "
                         "max_sessions, max_state_bytes, tokens_per_second)"));
      }
    }
    auto hash = entry.find("sha256");
    if (hash == entry.end() || !hash->is_string() ||
        !IsSha256Hex(hash->get<std::string>())) {
      return absl::InvalidArgumentError(
          absl::StrCat(where,
                       "sha256: must be the key's SHA-256 as 64 hex digits "
                       "(printf %s \"$KEY\" | sha256sum)"));
    }
    auto tenant = entry.find("tenant");
    if (tenant == entry.end() || !tenant->is_string() ||
        !IsTenantName(tenant->get<std::string>())) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "tenant: must be 1-64 characters of [A-Za-z0-9._-]"));
    }
    TenantEntry t;
    t.name = tenant->get<std::string>();
    if (auto admin = entry.find("admin"); admin != entry.end()) {
      if (!admin->is_boolean()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "admin: must be true or false"));
      }
      t.admin = admin->get<bool>();
    }
    auto sessions = QuotaField(entry, "max_sessions", false, where);
    if (!sessions.ok()) return sessions.status();
    auto bytes = QuotaField(entry, "max_state_bytes", true, where);
    if (!bytes.ok()) return bytes.status();
    t.quota = {*sessions, *bytes};
    if (auto rate = entry.find("tokens_per_second"); rate != entry.end()) {
      if (!rate->is_number() || !std::isfinite(rate->get<double>()) ||
          rate->get<double>() < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "tokens_per_second: must be a number >= 0"));
      }
      t.tokens_per_second = rate->get<double>();
    }
    auto [it, added] = set->tenants_.emplace(t.name, t);
    if (!added) {
      const TenantEntry& o = it->second;
      if (o.admin != t.admin || o.quota.max_sessions != t.quota.max_sessions ||
          o.quota.max_state_bytes != t.quota.max_state_bytes ||
          o.tokens_per_second != t.tokens_per_second) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "tenant: '", t.name,
            "' is named by an earlier key with other quotas or admin flag; "
            "keys of one tenant must agree"));
      }
    }
    hashes.emplace_back(absl::AsciiStrToLower(hash->get<std::string>()),
                        t.name);
  }
  for (const auto& [hash, name] : hashes) {
    if (!set->by_hash_.emplace(hash, &set->tenants_.at(name)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(origin, ": the key with sha256 ", hash.substr(0, 12),
                       "... is listed twice"));
    }
  }
  return std::shared_ptr<const ApiKeySet>(std::move(set));
}

const TenantEntry* ApiKeySet::Find(absl::string_view key) const {
  auto it = by_hash_.find(Sha256Hex(key));
  return it == by_hash_.end() ? nullptr : it->second;
}

absl::StatusOr<std::unique_ptr<ApiKeys>> ApiKeys::Load(std::string path) {
  auto keys = std::make_unique<ApiKeys>();
  keys->path_ = std::move(path);
  if (absl::Status s = keys->Reload(); !s.ok()) return s;
  return keys;
}

absl::Status ApiKeys::Reload() {
  if (path_.empty()) return absl::OkStatus();
  auto text = ReadWholeFile("--api-keys", path_);
  if (!text.ok()) return text.status();
  auto parsed = ApiKeySet::Parse(*text, absl::StrCat("--api-keys ", path_));
  if (!parsed.ok()) return parsed.status();
  std::lock_guard<std::mutex> lock(mu_);
  keys_ = *std::move(parsed);
  return absl::OkStatus();
}

std::shared_ptr<const ApiKeySet> ApiKeys::current() const {
  std::lock_guard<std::mutex> lock(mu_);
  return keys_;
}

absl::StatusOr<Tenant> ApiKeys::Authenticate(
    absl::string_view authorization) const {
  if (!enabled()) return Tenant();
  if (authorization.empty()) {
    return absl::UnauthenticatedError(
        "authorization: this server needs an API key (send \"authorization: "
        "Bearer KEY\")");
  }
  // The scheme is case-insensitive (RFC 9110); one space, then the key.
  if (authorization.size() < 7 ||
      !absl::EqualsIgnoreCase(authorization.substr(0, 7), "bearer ")) {
    return absl::UnauthenticatedError("authorization: must be \"Bearer KEY\"");
  }
  const absl::string_view key =
      absl::StripAsciiWhitespace(authorization.substr(7));
  const std::shared_ptr<const ApiKeySet> keys = current();
  const TenantEntry* entry = keys->Find(key);
  if (entry == nullptr) {
    return absl::UnauthenticatedError("authorization: not a valid API key");
  }
  TenantQuota quota = entry->quota;
  quota.tokens_per_second = entry->tokens_per_second;
  return Tenant::Named(entry->name, entry->admin, quota);
}

}  // namespace linattn
