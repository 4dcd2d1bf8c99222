// The one conversion from core's absl::Status to a gRPC status.
#ifndef LINATTN_SERVER_STATUS_H_
#define LINATTN_SERVER_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace linattn {

grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace linattn

#endif  // LINATTN_SERVER_STATUS_H_
