// The attention snapshot parser on arbitrary bytes: it refuses or accepts,
// never crashes, never allocates more than the blob implies, and what it
// accepts serialises back to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "core/session/snapshot.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view blob(reinterpret_cast<const char*>(data), size);
  auto parsed = linattn::ParseSnapshot(blob);
  if (!parsed.ok()) return 0;
  if (linattn::SerializeSnapshot(parsed->spec, parsed->state) != blob) {
    std::abort();  // an accepted snapshot must round-trip exactly
  }
  if (linattn::SnapshotBytes(parsed->spec) != size) std::abort();
  return 0;
}
