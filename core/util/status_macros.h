// Status propagation macros for absl::Status / absl::StatusOr.
//
// Debian's Abseil (20220623) ships neither absl/log nor a RETURN_IF_ERROR
// macro, so linattn defines its own two here:
//
//   LINATTN_RETURN_IF_ERROR(ValidateSpec(spec));
//   LINATTN_ASSIGN_OR_RETURN(auto state, AttentionState::Create(spec));
#ifndef LINATTN_CORE_UTIL_STATUS_MACROS_H_
#define LINATTN_CORE_UTIL_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define LINATTN_RETURN_IF_ERROR(expr)                                     \
  do {                                                                    \
    if (::absl::Status linattn_status_ = (expr); !linattn_status_.ok()) { \
      return linattn_status_;                                             \
    }                                                                     \
  } while (false)

#define LINATTN_STATUS_CONCAT_INNER_(a, b) a##b
#define LINATTN_STATUS_CONCAT_(a, b) LINATTN_STATUS_CONCAT_INNER_(a, b)

#define LINATTN_ASSIGN_OR_RETURN(lhs, expr) \
  LINATTN_ASSIGN_OR_RETURN_IMPL_(           \
      LINATTN_STATUS_CONCAT_(linattn_statusor_, __LINE__), lhs, expr)

#define LINATTN_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                   \
  if (!statusor.ok()) {                                     \
    return std::move(statusor).status();                    \
  }                                                         \
  lhs = std::move(statusor).value()

#endif  // LINATTN_CORE_UTIL_STATUS_MACROS_H_
