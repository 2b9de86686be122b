// Status and Result<T>: how every cachegen function reports failure.
//
// No exception crosses the public API. A Status is either ok() or carries a
// code and a one-line human-readable message meant to be shown to a user as is
// ("corrupt stream: layer 3 section checksum mismatch").
#pragma once

#include <optional>
#include <string>
#include <utility>

namespace cachegen {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // the caller passed something unusable (bad shape, NaN input...)
  kCorrupt,          // a stream failed validation (checksum, bounds, magic)
  kUnsupported,      // well-formed but not supported (future format version...)
  kNotFound,
  kIOError,
  kInternal,
  kUnavailable,  // a service that is stopping, or a request whose client has gone: try again
};

class Status {
 public:
  Status() = default;  // ok
  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string msg) { return Status(StatusCode::kInvalidArgument, std::move(msg)); }
  static Status Corrupt(std::string msg) { return Status(StatusCode::kCorrupt, std::move(msg)); }
  static Status Unsupported(std::string msg) { return Status(StatusCode::kUnsupported, std::move(msg)); }
  static Status NotFound(std::string msg) { return Status(StatusCode::kNotFound, std::move(msg)); }
  static Status IOError(std::string msg) { return Status(StatusCode::kIOError, std::move(msg)); }
  static Status Internal(std::string msg) { return Status(StatusCode::kInternal, std::move(msg)); }
  static Status Unavailable(std::string msg) { return Status(StatusCode::kUnavailable, std::move(msg)); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "corrupt: <message>", or "ok".
  std::string ToString() const;

 private:
  Status(StatusCode code, std::string msg) : code_(code), message_(std::move(msg)) {}
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Either a value or a non-ok Status. Accessing value() of a failed Result is a
// programming error (asserted in debug builds).
template <typename T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {}  // NOLINT: must be non-ok
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() { return *value_; }
  const T& operator*() const { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace cachegen

// Propagate a non-ok Status from an expression to the caller.
#define CG_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::cachegen::Status cg_status_ = (expr);  \
    if (!cg_status_.ok()) return cg_status_; \
  } while (0)

#define CG_CONCAT_INNER_(a, b) a##b
#define CG_CONCAT_(a, b) CG_CONCAT_INNER_(a, b)
// `CG_ASSIGN_OR_RETURN(auto x, MakeX());` binds x or returns the error.
#define CG_ASSIGN_OR_RETURN(lhs, expr) CG_ASSIGN_OR_RETURN_IMPL_(CG_CONCAT_(cg_result_, __LINE__), lhs, expr)
#define CG_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()
