// Reads a builtin's arguments by position or keyword, the way Python binds them, and names the
// function and argument in errors.
#pragma once
#include <string>

#include "common/jinja/lexer.h"
#include "common/jinja/value.h"

namespace k3::jinja {

class ArgReader {
 public:
  ArgReader(CallArgs& args, std::string fn, size_t pos) : args_(args), fn_(std::move(fn)), pos_(pos) {}

  // The argument at positional index `index` or keyword `name`; `fallback` when absent.
  Value get(size_t index, const char* name, Value fallback = Value()) {
    for (auto& [k, v] : args_.keyword) {
      if (k == name) {
        if (index < args_.positional.size()) fail("got '" + std::string(name) + "' twice");
        ++used_kw_;
        return v;
      }
    }
    if (index < args_.positional.size()) {
      used_pos_ = std::max(used_pos_, index + 1);
      return args_.positional[index];
    }
    return fallback;
  }
  Value require(size_t index, const char* name) {
    Value v = get(index, name);
    if (v.is_undefined()) fail("missing argument '" + std::string(name) + "'");
    return v;
  }
  // Every argument given was read (call after the gets).
  void done(size_t max_positional) {
    if (args_.positional.size() > max_positional) fail("takes at most " + std::to_string(max_positional) + " positional arguments");
    if (used_kw_ != args_.keyword.size()) fail("got an unexpected keyword argument");
  }
  [[noreturn]] void fail(const std::string& what) const { throw TemplateError{fn_ + ": " + what, pos_}; }

 private:
  CallArgs& args_;
  std::string fn_;
  size_t pos_;
  size_t used_pos_ = 0;
  size_t used_kw_ = 0;
};

}  // namespace k3::jinja
