// The values a chat template computes with, modelled on the Python objects Jinja2 hands a template
// (the reference the engine is tested against): undefined, None, bool, int, float, str, list, dict
// and callables (macros, bound methods, globals). Lists and dicts are shared by reference, as in
// Python, so `set ns.x = ...` on a namespace is seen by every holder. Dicts keep insertion order.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace k3::jinja {

class Value;
using List = std::vector<Value>;

// Insertion-ordered string-keyed map (chat templates index dicts by string keys only).
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;  // namespace(): the one dict `set obj.attr = ...` may write to
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);
};

// Arguments of a call: positional, then keyword in the order written.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};
using Callable = std::function<Value(CallArgs&)>;

class Value {
 public:
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Callable };

  Value() = default;  // undefined
  static Value none() { return Value(Kind::None); }
  Value(bool b) : data_(b) {}                                  // NOLINT: implicit like Python literals
  Value(int64_t i) : data_(i) {}                               // NOLINT
  Value(int i) : data_(int64_t{i}) {}                          // NOLINT
  Value(double d) : data_(d) {}                                // NOLINT
  Value(std::string s) : data_(std::move(s)) {}                // NOLINT
  Value(const char* s) : data_(std::string(s)) {}              // NOLINT
  Value(List l) : data_(std::make_shared<List>(std::move(l))) {}  // NOLINT
  Value(Dict d) : data_(std::make_shared<Dict>(std::move(d))) {}  // NOLINT
  Value(Callable c) : data_(std::make_shared<Callable>(std::move(c))) {}  // NOLINT

  Kind kind() const;
  bool is_undefined() const { return kind() == Kind::Undefined; }
  bool is_none() const { return kind() == Kind::None; }
  bool is_string() const { return kind() == Kind::String; }
  bool is_number() const { return kind() == Kind::Int || kind() == Kind::Float; }  // bool excluded
  bool is_list() const { return kind() == Kind::List; }
  bool is_dict() const { return kind() == Kind::Dict; }

  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const { return std::get<int64_t>(data_); }
  double as_number() const;  // int, float or bool as a double
  const std::string& as_string() const { return std::get<std::string>(data_); }
  List& list() const { return *std::get<std::shared_ptr<List>>(data_); }
  Dict& dict() const { return *std::get<std::shared_ptr<Dict>>(data_); }
  const Callable& callable() const { return *std::get<std::shared_ptr<Callable>>(data_); }
  const void* identity() const;  // the shared object behind a list/dict/callable (the `sameas` test)

  bool truthy() const;            // Python truthiness; undefined is false
  std::string str() const;        // Python str(): what {{ value }} prints
  std::string repr() const;       // Python repr(): how a value prints inside a list or dict
  std::string type_name() const;  // for error messages

  static Value from_json(const nlohmann::ordered_json& j);

 private:
  struct NoneTag {};
  explicit Value(Kind) : data_(NoneTag{}) {}
  std::variant<std::monostate, NoneTag, bool, int64_t, double, std::string, std::shared_ptr<List>,
               std::shared_ptr<Dict>, std::shared_ptr<Callable>>
      data_;
};

// Python ==: numbers compare by value across int/float/bool, containers element-wise.
bool values_equal(const Value& a, const Value& b);
// Python repr() of a float (shortest round-trip, "1.0", "1e-05", "inf").
std::string python_float_repr(double d);

}  // namespace k3::jinja
