// Status and StatusOr<T>: the one error type that crosses sparsekv's public boundary.
//
// A Status is either OK or carries a code and a human-readable message. Functions that can fail
// return Status (or StatusOr<T> when they also produce a value); both are [[nodiscard]]. Only the
// Python binding turns them into exceptions.
//
// Thread safety: Status and StatusOr are values; distinct objects may be used from any thread.
#pragma once

#include <cassert>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace sparsekv {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // the caller passed something that can never be valid
  kNotFound,            // unknown or already released request
  kAlreadyExists,       // e.g. admitting a request id twice
  kResourceExhausted,   // host pool pages or hot-cache blocks are used up
  kFailedPrecondition,  // the call is valid, but not in the current state
  kOutOfRange,          // a position or count outside what was reserved
  kUnavailable,         // a device or service is not present
  kDeadlineExceeded,    // an operation did not complete before its deadline
  kInternal,            // a backend call failed (e.g. a CUDA error)
  kUnimplemented,       // valid, but a part the library does not serve yet (e.g. a layer kind)
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "OK" or "<CodeName>: <message>".
  std::string ToString() const;

  // Marks a status as deliberately unused.
  void IgnoreError() const {}

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
inline Status ResourceExhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status FailedPrecondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status OutOfRange(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status DeadlineExceeded(std::string m) {
  return {StatusCode::kDeadlineExceeded, std::move(m)};
}
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status Unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }

// Holds either a T or a non-OK Status.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : rep_(std::move(status)) {  // NOLINT: implicit by design
    assert(!std::get<Status>(rep_).ok() && "StatusOr built from an OK status");
  }
  StatusOr(T value) : rep_(std::move(value)) {}  // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(rep_); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(rep_); }

  // REQUIRES: ok() (checked: std::bad_variant_access otherwise).
  T& value() & { return std::get<T>(rep_); }
  const T& value() const& { return std::get<T>(rep_); }
  T&& value() && { return std::get<T>(std::move(rep_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<Status, T> rep_;
};

}  // namespace sparsekv

#define SPARSEKV_CONCAT_INNER(a, b) a##b
#define SPARSEKV_CONCAT(a, b) SPARSEKV_CONCAT_INNER(a, b)

// Returns from the enclosing function if `expr` (a Status) is not OK.
#define SPARSEKV_RETURN_IF_ERROR(expr)                   \
  do {                                                   \
    ::sparsekv::Status sparsekv_status_ = (expr);        \
    if (!sparsekv_status_.ok()) return sparsekv_status_; \
  } while (0)

// `lhs = value of rexpr` (a StatusOr), or returns its error from the enclosing function.
#define SPARSEKV_ASSIGN_OR_RETURN(lhs, rexpr) \
  SPARSEKV_ASSIGN_OR_RETURN_IMPL(SPARSEKV_CONCAT(sparsekv_or_, __LINE__), lhs, rexpr)
#define SPARSEKV_ASSIGN_OR_RETURN_IMPL(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                   \
  if (!tmp.ok()) return tmp.status();                   \
  lhs = std::move(tmp).value()
