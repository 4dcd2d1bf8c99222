// config.json on arbitrary text: parsed or refused naming a field, never a
// crash; what is accepted has every size within the stated bounds.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "core/model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto config = linattn::ParseModelConfig(
      absl::string_view(reinterpret_cast<const char*>(data), size));
  if (!config.ok()) {
    if (config.status().message().empty()) std::abort();
    return 0;
  }
  if (config->hidden_size == 0 || config->num_heads == 0 ||
      config->vocab_size == 0 || config->num_hidden_layers == 0) {
    std::abort();
  }
  return 0;
}
