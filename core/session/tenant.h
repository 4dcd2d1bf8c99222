// Tenant: whose sessions a request may see, and whom the sessions it
// creates belong to (docs/design.md, "Tenants").
//
// A server without API keys serves one anonymous tenant (name ""), so every
// request sees every session, as before tenants existed. With keys, each
// key names a tenant: a session belongs to the tenant that created it, and
// a request of another tenant is told it does not exist (NOT_FOUND, the
// same answer as for an id no one holds), unless the key is an admin's.
// The server's own work (recovery, snapshots, eviction) acts as
// Tenant::Server(), which sees every session.
#ifndef LINATTN_CORE_SESSION_TENANT_H_
#define LINATTN_CORE_SESSION_TENANT_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace linattn {

// What one tenant may hold at once in the session table (0 = no limit of
// its own; the server's limits still apply), and the rate of tokens its
// requests may bring (0 = none; enforced by the server's front ends,
// server/rate_limiter.h, not by the table).
struct TenantQuota {
  uint64_t max_sessions = 0;
  uint64_t max_state_bytes = 0;
  double tokens_per_second = 0;
};

class Tenant {
 public:
  // The anonymous tenant of a server without keys.
  Tenant() = default;
  // A tenant named by a key; `admin` sees and acts on every session.
  static Tenant Named(std::string name, bool admin = false,
                      TenantQuota quota = {}) {
    Tenant t;
    t.name_ = std::move(name);
    t.sees_all_ = admin;
    t.quota_ = quota;
    return t;
  }
  // The server itself: sees every session, owns what it creates under "".
  static Tenant Server() {
    Tenant t;
    t.sees_all_ = true;
    return t;
  }

  const std::string& name() const { return name_; }
  bool admin() const { return sees_all_; }
  const TenantQuota& quota() const { return quota_; }
  // Whether a session owned by `owner` is visible to this tenant.
  bool Sees(absl::string_view owner) const {
    return sees_all_ || owner == name_;
  }

 private:
  std::string name_;
  bool sees_all_ = false;
  TenantQuota quota_;
};

}  // namespace linattn

#endif  // LINATTN_CORE_SESSION_TENANT_H_
