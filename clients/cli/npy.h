// Reading and writing float32 NumPy .npy files (format versions 1.0–3.0,
// C order, little-endian '<f4'). Anything else is refused with a message
// that names the file and what was found, never read as garbage.
#ifndef LINATTN_CLIENTS_CLI_NPY_H_
#define LINATTN_CLIENTS_CLI_NPY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace linattn {

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> data;  // row-major, product(shape) values
};

// Parses .npy bytes; `name` only labels error messages.
absl::StatusOr<NpyArray> ParseNpy(absl::string_view bytes,
                                  absl::string_view name);
absl::StatusOr<NpyArray> ReadNpy(const std::string& path);

// The bytes of a version 1.0 .npy file holding `data` with `shape`.
std::string SerializeNpy(const std::vector<int64_t>& shape, const float* data);
absl::Status WriteNpy(const std::string& path,
                      const std::vector<int64_t>& shape, const float* data);

}  // namespace linattn

#endif  // LINATTN_CLIENTS_CLI_NPY_H_
