// The filters, tests, methods and globals a chat template may call, each written to give what
// Jinja2 gives under Hugging Face's settings (tojson is json.dumps with ensure_ascii off). A name
// outside the set is an error naming it.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

#include "common/jinja/value.h"

namespace k3::jinja {

// Whether a filter / test of this name exists (checked when the template is parsed, as Jinja does).
bool is_filter_name(const std::string& name);
bool is_test_name(const std::string& name);

Value apply_filter(const std::string& name, const Value& input, CallArgs& args, size_t pos);
bool apply_test(const std::string& name, const Value& input, CallArgs& args, size_t pos);
// `obj.name` when obj has no item of that name: a bound method (str, dict and list methods), else
// undefined.
Value method_of(const Value& obj, const std::string& name, size_t pos);
// The template's globals: raise_exception, namespace, range, dict, strftime_now.
Dict builtin_globals();

// Python's json.dumps(v, ensure_ascii=False, indent=indent (<0: none), separators, sort_keys).
std::string json_dumps(const Value& v, int indent, std::string_view item_sep, std::string_view key_sep,
                       bool sort_keys, bool ensure_ascii, size_t pos);

// Python semantics shared by the interpreter and the filters.
Value item_of(const Value& obj, const Value& key, size_t pos);       // obj[key]; undefined when absent
int compare_values(const Value& a, const Value& b, size_t pos);      // <0, 0, >0; errors for unordered kinds
bool contains(const Value& container, const Value& item, size_t pos);  // Python `in`
size_t utf8_length(std::string_view s);                             // code points
std::vector<Value> iterate(const Value& v, size_t pos);             // Python iteration (dict: keys)
// Byte length of the Unicode whitespace code point (Python's str.isspace) starting at s[i]; 0 if none.
size_t python_space_at(std::string_view s, size_t i);
// Python's str.strip/lstrip/rstrip(chars): chars none strips Unicode whitespace, a string strips
// its code points.
std::string python_strip(std::string_view s, const Value& chars, bool left, bool right);

}  // namespace k3::jinja
