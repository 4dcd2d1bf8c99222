// The safetensors reader on arbitrary files: opened or refused, never a
// crash or a read outside the file; every tensor it accepts lies inside the
// file and converts to floats.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path =
      "/tmp/linattn_safetensors_fuzz_" + std::to_string(::getpid());
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size != 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  auto file = linattn::SafetensorsFile::Open(path);
  if (!file.ok()) return 0;
  for (const auto& [name, view] : (*file)->tensors()) {
    if (view.bytes > size) std::abort();
    std::vector<float> out(view.numel());
    view.ToFloat(out.data());
  }
  return 0;
}
