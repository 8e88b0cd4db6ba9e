// Status and Expected<T>: the error values of everything a user, a file or a request can get wrong.
//
// Status is a small value type (LevelDB style): ok, or a code plus a message that names what is
// wrong (the file, the tensor, the field and its value). No exceptions cross the public API.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace sparrow {

enum class StatusCode {
  kOk,
  kInvalidArgument,  // a bad value from the caller (CLI flag, request field, config field)
  kNotFound,         // a file or tensor that should exist does not
  kCorrupt,          // a file whose bytes contradict its own header or the format
  kUnsupported,      // valid input that this build does not handle (yet)
  kIoError,          // the operating system refused (open, mmap, read, write)
  kUnavailable,      // a temporary refusal: try again later (a full queue)
  kCancelled,        // the caller cancelled the work
  kInternal,         // an invariant broke: a bug in Sparrow
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status ok() { return Status(); }
  static Status invalid_argument(std::string msg) { return {StatusCode::kInvalidArgument, std::move(msg)}; }
  static Status not_found(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
  static Status corrupt(std::string msg) { return {StatusCode::kCorrupt, std::move(msg)}; }
  static Status unsupported(std::string msg) { return {StatusCode::kUnsupported, std::move(msg)}; }
  static Status io_error(std::string msg) { return {StatusCode::kIoError, std::move(msg)}; }
  static Status unavailable(std::string msg) { return {StatusCode::kUnavailable, std::move(msg)}; }
  static Status cancelled(std::string msg) { return {StatusCode::kCancelled, std::move(msg)}; }
  static Status internal(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }

  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "Corrupt: model.safetensors: tensor 'x': ..." — for logs and CLI errors.
  std::string to_string() const;
  // Prepends context ("loading DIR: ") to the message, keeping the code.
  Status with_context(const std::string& context) const {
    if (is_ok()) return *this;
    return Status(code_, context + ": " + message_);
  }

 private:
  Status(StatusCode code, std::string msg) : code_(code), message_(std::move(msg)) {}
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

const char* status_code_name(StatusCode code);

inline std::string Status::to_string() const {
  if (is_ok()) return "OK";
  return std::string(status_code_name(code_)) + ": " + message_;
}

inline const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "Invalid argument";
    case StatusCode::kNotFound: return "Not found";
    case StatusCode::kCorrupt: return "Corrupt";
    case StatusCode::kUnsupported: return "Unsupported";
    case StatusCode::kIoError: return "I/O error";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kCancelled: return "Cancelled";
    case StatusCode::kInternal: return "Internal error";
  }
  return "Unknown";
}

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Expected(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    if (status_.is_ok()) status_ = Status::internal("Expected constructed from an OK status");
  }
  bool is_ok() const { return value_.has_value(); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const { return status_; }
  // The value; on an error, the process stops with the error's message (as a failed CHECK does),
  // never a read of a value that is not there. operator-> and operator* do not check.
  T& value() & { return require(), *value_; }
  const T& value() const& { return require(), *value_; }
  // By value: `for (auto x : f().value())` must not dangle.
  T value() && { return require(), std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() { return *value_; }
  const T& operator*() const { return *value_; }

 private:
  void require() const {
    if (value_.has_value()) return;
    std::fprintf(stderr, "sparrow: Expected::value() on an error: %s\n", status_.to_string().c_str());
    std::abort();
  }

  std::optional<T> value_;
  Status status_;
};

}  // namespace sparrow

// Propagates a non-OK Status from an expression returning Status.
#define SPARROW_RETURN_IF_ERROR(expr)          \
  do {                                         \
    ::sparrow::Status _st = (expr);            \
    if (!_st.is_ok()) return _st;              \
  } while (0)

#define SPARROW_CONCAT_INNER(a, b) a##b
#define SPARROW_CONCAT(a, b) SPARROW_CONCAT_INNER(a, b)
// SPARROW_ASSIGN_OR_RETURN(auto x, f()): x = f().value() or return f()'s status.
#define SPARROW_ASSIGN_OR_RETURN(lhs, expr) \
  SPARROW_ASSIGN_OR_RETURN_IMPL(SPARROW_CONCAT(_expected_, __LINE__), lhs, expr)
#define SPARROW_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.is_ok()) return tmp.status();              \
  lhs = std::move(tmp).value()
