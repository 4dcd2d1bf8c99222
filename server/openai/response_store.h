// The responses API's stored responses (server/openai/routes.h): a
// response kept with `store` is its JSON body here and its end state as
// the session named by its id in the generation engine; a follow-up's
// previous_response_id continues a fork of that session.
//
// Bounded by count and by the bytes of the bodies, per tenant and in all:
// a tenant's stored responses are at most max_count (and at most a quarter
// of its session quota, when its key sets one: each holds one of its
// sessions) and max_bytes, and so are all tenants' together. Past a bound,
// entries whose session is gone (idle TTL, deleted) go first; then, when
// the tenant storing is at its own bound, its own oldest with its session,
// else the oldest of the tenant holding the most: a tenant that holds
// fewer than another never loses one to make room for someone else's. A
// body larger than a sixteenth of the byte bound is not kept. Thread-safe.
#ifndef LINATTN_SERVER_OPENAI_RESPONSE_STORE_H_
#define LINATTN_SERVER_OPENAI_RESPONSE_STORE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/model/chat_template.h"
#include "core/scheduler/generation.h"
#include "core/session/tenant.h"
#include "server/http_json.h"

namespace linattn {

class ResponseStore {
 public:
  struct Entry {
    json body;                     // the response object as GET returns it
    uint64_t order = 0;            // stored after `order` others
    size_t bytes = 0;              // of its JSON text
    bool ended_at_marker = false;  // at the end-of-turn marker, not cut
    std::string owner;             // the tenant whose request stored it
    // The conversation its session holds: every message of the chain of
    // responses, ending with this reply as the model wrote it (what a
    // model's Jinja template renders a follow-up against).
    std::vector<ChatMessage> conversation;
  };

  // `engine` holds the sessions and outlives the store.
  ResponseStore(GenerationEngine* engine, size_t max_count, size_t max_bytes);

  // Keeps `body` as response `id` of `owner` (its session already named
  // `id`); false when it is too large, and then the caller deletes the
  // session and the answer says "store": false.
  bool Keep(const std::string& id, const json& body, bool ended_at_marker,
            const Tenant& owner, std::vector<ChatMessage> conversation);
  // Only `tenant`'s (another tenant's is as absent); an entry whose
  // session expired goes.
  std::optional<Entry> Find(const std::string& id, const Tenant& tenant);
  void Forget(const std::string& id);

 private:
  using Map = std::map<std::string, Entry>;
  Map::iterator EraseLocked(Map::iterator it);

  GenerationEngine* const engine_;
  const size_t max_count_;
  const size_t max_bytes_;
  std::mutex mu_;
  Map entries_;
  uint64_t next_order_ = 0;
  struct Held {
    size_t count = 0;
    size_t bytes = 0;
  };
  std::map<std::string, Held, std::less<>> held_;  // per owner
  size_t bytes_ = 0;                               // of every entry
};

}  // namespace linattn

#endif  // LINATTN_SERVER_OPENAI_RESPONSE_STORE_H_
