// Conversions between the public proto messages and core types.
#ifndef LINATTN_SERVER_CONVERT_H_
#define LINATTN_SERVER_CONVERT_H_

#include <optional>

#include "absl/status/statusor.h"
#include "core/attention/spec.h"
#include "core/session/session_manager.h"
#include "linattn/v1/attention.pb.h"

namespace linattn {

struct SpecRequest {
  AttentionSpec spec;
  std::optional<float> epsilon;  // unset = the server's default
};
// INVALID_ARGUMENT naming "spec.<field>" for an unknown feature map.
absl::StatusOr<SpecRequest> FromProto(const v1::AttentionSpec& proto);
void ToProto(const AttentionSpec& spec, v1::AttentionSpec* proto);
void ToProto(const SessionInfo& info, v1::Session* proto);

}  // namespace linattn

#endif  // LINATTN_SERVER_CONVERT_H_
