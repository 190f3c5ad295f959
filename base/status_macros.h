// Abseil 20220623 (Debian 12) has no status macros; these are the two we use.
#ifndef PREFIXD_BASE_STATUS_MACROS_H_
#define PREFIXD_BASE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define PREFIXD_CONCAT_INNER_(a, b) a##b
#define PREFIXD_CONCAT_(a, b) PREFIXD_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                          \
  do {                                                 \
    ::absl::Status prefixd_status_ = (expr);           \
    if (!prefixd_status_.ok()) return prefixd_status_; \
  } while (0)

// ASSIGN_OR_RETURN(auto x, StatusOrExpr()): binds the value or returns the
// error status.
#define ASSIGN_OR_RETURN(lhs, expr)                                            \
  PREFIXD_ASSIGN_OR_RETURN_IMPL_(PREFIXD_CONCAT_(prefixd_statusor_, __LINE__), \
                                 lhs, expr)
#define PREFIXD_ASSIGN_OR_RETURN_IMPL_(var, lhs, expr) \
  auto var = (expr);                                   \
  if (!var.ok()) return std::move(var).status();       \
  lhs = std::move(var).value()

#endif  // PREFIXD_BASE_STATUS_MACROS_H_
