// Status propagation macros used across modules. Errors cross module boundaries as
// absl::Status / absl::StatusOr<T>; these keep call sites short.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define OSCARKV_CONCAT_INNER_(a, b) a##b
#define OSCARKV_CONCAT_(a, b) OSCARKV_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define OSCARKV_RETURN_IF_ERROR(expr)                 \
  do {                                                \
    ::absl::Status _oscarkv_status = (expr);          \
    if (!_oscarkv_status.ok()) return _oscarkv_status; \
  } while (0)

// `lhs = value of statusor_expr`, or returns its error status.
#define OSCARKV_ASSIGN_OR_RETURN(lhs, expr) \
  OSCARKV_ASSIGN_OR_RETURN_IMPL_(OSCARKV_CONCAT_(_oscarkv_sor_, __LINE__), lhs, expr)
#define OSCARKV_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.ok()) return std::move(tmp).status();       \
  lhs = std::move(tmp).value()
