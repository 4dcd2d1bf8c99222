// The tensors of AttentionService requests and responses: q, k, v (and the
// rules' g and beta) as `repeated float` or packed little-endian float32
// (`<name>_bytes`), checked against a session's spec and read in place;
// outputs written in the form the request used (docs/design.md §3,
// layouts). Shapes are checked here, where a message enters; values
// (finite, gates ≤ 0, β in [0, 2]) are checked by core as the kernels read
// them.
#ifndef LINATTN_SERVER_ATTENTION_TENSORS_H_
#define LINATTN_SERVER_ATTENTION_TENSORS_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/attention/attention.h"
#include "linattn/v1/attention.pb.h"

namespace linattn {

// One tensor in either of its forms. *data receives its values, in place,
// when it holds `want` of them; an empty tensor in both forms gives
// nullptr. INVALID_ARGUMENT names `name` (or `name`_bytes) and `shape`.
absl::Status TensorOf(const char* name,
                      const google::protobuf::RepeatedField<float>& floats,
                      const std::string& bytes, uint64_t want,
                      absl::string_view shape, const float** data);

// The input of `tokens` tokens of `spec` from a request's tensors: q, k, v
// always; g and beta exactly when the rule takes them. The pointers read
// the request in place: it must outlive the input.
absl::StatusOr<SequenceInput> InputOf(const AttentionSpec& spec,
                                      uint64_t tokens,
                                      const v1::PrefillRequest& request);
absl::StatusOr<SequenceInput> InputOf(const AttentionSpec& spec,
                                      uint64_t tokens,
                                      const v1::DecodeRequest& request);

// Room in `response` for the output and denominator of `rows` (token, head)
// pairs of width `value_dim`, as bytes when `as_bytes` (the request's q
// came as q_bytes): {output, denominator}.
std::pair<float*, float*> OutputOf(bool as_bytes, uint64_t rows,
                                   uint32_t value_dim,
                                   v1::PrefillResponse* response);
std::pair<float*, float*> OutputOf(bool as_bytes, uint64_t rows,
                                   uint32_t value_dim,
                                   v1::DecodeResponse* response);

// The kernels' availability flags as the response's `available`.
void CopyAvailable(const std::vector<uint8_t>& from,
                   google::protobuf::RepeatedField<bool>* to);

}  // namespace linattn

#endif  // LINATTN_SERVER_ATTENTION_TENSORS_H_
