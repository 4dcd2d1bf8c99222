// The .npy reader of the command-line client on arbitrary bytes: parsed or
// refused, never a crash; an accepted array holds exactly as many values as
// its shape says and serialises back to a file that parses the same.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "clients/cli/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto array = linattn::ParseNpy(
      absl::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
  if (!array.ok()) return 0;
  int64_t n = 1;
  for (int64_t d : array->shape) n *= d;
  if (static_cast<size_t>(n) != array->data.size()) std::abort();
  const std::string again =
      linattn::SerializeNpy(array->shape, array->data.data());
  auto reparsed = linattn::ParseNpy(again, "again");
  if (!reparsed.ok() || reparsed->shape != array->shape) std::abort();
  return 0;
}
