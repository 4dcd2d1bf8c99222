// API keys and the tenants they name (docs/design.md, "Tenants and keys").
//
// `--api-keys FILE` is a JSON file of keys stored as hashes:
//
//   {"keys": [
//     {"sha256": "<64 hex digits: SHA-256 of the key>", "tenant": "acme",
//      "admin": false, "max_sessions": 100, "max_state_bytes": "1GiB",
//      "tokens_per_second": 2000}
//   ]}
//
// Only the hash is in the file, so the file (a Kubernetes secret, a config
// map) gives no one a key; `printf %s "$KEY" | sha256sum` makes an entry's
// hash. Clients send the key as `authorization: Bearer KEY` (gRPC metadata
// or an HTTP header). Several keys may name one tenant (to rotate keys);
// they must then agree on its quotas and admin flag. The quotas (0 or
// absent = none of its own) are the tenant's sessions, their state bytes
// and a token rate (prefill and decode tokens per second, with a burst of
// one second's worth).
//
// The keys can be reloaded (SIGHUP): Reload reads the file again and
// swaps it in whole, or keeps the old keys when the new file is not valid.
#ifndef LINATTN_SERVER_API_KEYS_H_
#define LINATTN_SERVER_API_KEYS_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/session/tenant.h"

namespace linattn {

struct TenantEntry {
  std::string name;
  bool admin = false;
  TenantQuota quota;
  double tokens_per_second = 0;  // 0 = no rate of its own
};

// One file's keys.
class ApiKeySet {
 public:
  // Parses `json` (the file's text); errors name `origin` and the field
  // (`keys[2].sha256`).
  static absl::StatusOr<std::shared_ptr<const ApiKeySet>> Parse(
      absl::string_view json, absl::string_view origin);

  // The tenant whose key `key` is, or null.
  const TenantEntry* Find(absl::string_view key) const;
  size_t key_count() const { return by_hash_.size(); }
  const std::map<std::string, TenantEntry>& tenants() const { return tenants_; }

 private:
  std::unordered_map<std::string, const TenantEntry*> by_hash_;
  std::map<std::string, TenantEntry> tenants_;
};

// The keys a server checks, reloadable while it serves.
class ApiKeys {
 public:
  // No file: every call is the anonymous tenant (a server without keys).
  ApiKeys() = default;
  static absl::StatusOr<std::unique_ptr<ApiKeys>> Load(std::string path);

  bool enabled() const { return !path_.empty(); }
  // Reads the file again; on any error the keys in use stay.
  absl::Status Reload();

  // The tenant of a request whose `authorization` header (or metadata)
  // is `authorization` (empty when absent): UNAUTHENTICATED when keys are
  // on and it is missing, not "Bearer KEY", or not a key in the file.
  absl::StatusOr<Tenant> Authenticate(absl::string_view authorization) const;
  // The tenant named `name` as the current file describes it (for its
  // rate), or null.
  std::shared_ptr<const ApiKeySet> current() const;

 private:
  std::string path_;
  mutable std::mutex mu_;
  std::shared_ptr<const ApiKeySet> keys_;  // guarded by mu_
};

// SHA-256 of `bytes` as 64 lowercase hex digits.
std::string Sha256Hex(absl::string_view bytes);

}  // namespace linattn

#endif  // LINATTN_SERVER_API_KEYS_H_
