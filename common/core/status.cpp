#include "common/core/status.h"

#include <string>

namespace k3 {

const char* code_name(Code c) {
  switch (c) {
    case Code::Ok: return "ok";
    case Code::InvalidArgument: return "invalid_argument";
    case Code::NotFound: return "not_found";
    case Code::OutOfRange: return "out_of_range";
    case Code::Unavailable: return "unavailable";
    case Code::DeadlineExceeded: return "deadline_exceeded";
    case Code::Aborted: return "aborted";
    case Code::ResourceExhausted: return "resource_exhausted";
    case Code::Internal: return "internal";
    case Code::Io: return "io";
    case Code::Unsupported: return "unsupported";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  return std::string(code_name(code_)) + ": " + message_;
}

static std::string with_location(const std::string& what, const std::source_location& loc) {
  return what + " (raised at " + loc.file_name() + ":" + std::to_string(loc.line()) + ")";
}

Error::Error(const std::string& what, std::source_location loc) : std::runtime_error(with_location(what, loc)) {}
Error::Error(const Status& s, std::source_location loc) : std::runtime_error(with_location(s.to_string(), loc)) {}

}  // namespace k3
