// One error type for the whole project (docs/STYLE.md habit 11).
// Recoverable failures travel as Status / Result<T>; K3_TRY propagates them.
// Programming errors and unsupported kernel shapes throw k3::Error (caught at tool/node boundaries).
#pragma once
#include <optional>
#include <source_location>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>

namespace k3 {

enum class Code { Ok, InvalidArgument, NotFound, OutOfRange, Unavailable, DeadlineExceeded, Aborted,
                  ResourceExhausted, Internal, Io, Unsupported };

const char* code_name(Code c);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok() { return {}; }
  bool is_ok() const { return code_ == Code::Ok; }
  explicit operator bool() const { return is_ok(); }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string to_string() const;

 private:
  Code code_ = Code::Ok;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {Code::InvalidArgument, std::move(m)}; }
inline Status not_found(std::string m) { return {Code::NotFound, std::move(m)}; }
inline Status io_error(std::string m) { return {Code::Io, std::move(m)}; }
inline Status internal_error(std::string m) { return {Code::Internal, std::move(m)}; }
inline Status unsupported(std::string m) { return {Code::Unsupported, std::move(m)}; }

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}            // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {      // NOLINT
    if (std::get<Status>(v_).is_ok()) v_ = Status(Code::Internal, "Result built from an ok Status");
  }
  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<Status>(v_);
  }
  T& value() &;
  const T& value() const&;
  T&& value() &&;
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  std::variant<T, Status> v_;
};

// Thrown for bugs and for shapes a backend does not support; carries where it was raised.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, std::source_location loc = std::source_location::current());
  explicit Error(const Status& s, std::source_location loc = std::source_location::current());
};

template <class T> T& Result<T>::value() & {
  if (!is_ok()) throw Error(std::get<Status>(v_));
  return std::get<T>(v_);
}
template <class T> const T& Result<T>::value() const& {
  if (!is_ok()) throw Error(std::get<Status>(v_));
  return std::get<T>(v_);
}
template <class T> T&& Result<T>::value() && {
  if (!is_ok()) throw Error(std::get<Status>(v_));
  return std::move(std::get<T>(v_));
}

inline const Status& status_of(const Status& s) { return s; }
template <class T> const Status& status_of(const Result<T>& r) { return r.status(); }

}  // namespace k3

#define K3_CONCAT_INNER(a, b) a##b
#define K3_CONCAT(a, b) K3_CONCAT_INNER(a, b)

// Propagates a non-ok Status (or the Status of a failed Result) to the caller.
#define K3_TRY(expr)                                          \
  do {                                                        \
    auto&& k3_try_value_ = (expr);                            \
    if (!k3_try_value_.is_ok()) return ::k3::status_of(k3_try_value_); \
  } while (0)

// Declares `lhs` from a Result, returning its Status on failure.
#define K3_ASSIGN_OR_RETURN(lhs, expr)                                       \
  auto K3_CONCAT(k3_res_, __LINE__) = (expr);                                \
  if (!K3_CONCAT(k3_res_, __LINE__).is_ok()) return K3_CONCAT(k3_res_, __LINE__).status(); \
  lhs = std::move(K3_CONCAT(k3_res_, __LINE__)).value()

// Check for programming errors / unsupported shapes: throws k3::Error with file:line.
#define K3_CHECK(cond, msg)                                            \
  do {                                                                 \
    if (!(cond)) throw ::k3::Error(std::string("check failed: " #cond ": ") + (msg)); \
  } while (0)
