// Reads typed fields out of one JSON config object and remembers which keys it consumed, so that
// whatever is left at the end is an unknown key. Shared by the config parsers of each model family.
#pragma once
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/core/status.h"

namespace k3::config_detail {

using Json = nlohmann::json;

// A typo must never fall back to a default: finish() names every key nobody read.
class FieldReader {
 public:
  FieldReader(const Json& obj, std::string prefix) : obj_(obj), prefix_(std::move(prefix)) {}

  std::string path(const std::string& key) const { return prefix_ + key; }

  Status read(const std::string& key, int& out) {
    const Json* v = take(key);
    if (!v) return Status::ok();
    if (!v->is_number_integer()) return type_error(key, "an integer", *v);
    int64_t x = v->get<int64_t>();
    if (x < INT32_MIN || x > INT32_MAX) return invalid_argument(path(key) + ": integer out of range");
    out = static_cast<int>(x);
    return Status::ok();
  }
  Status read(const std::string& key, int64_t& out) {
    const Json* v = take(key);
    if (!v) return Status::ok();
    if (!v->is_number_integer()) return type_error(key, "an integer", *v);
    out = v->get<int64_t>();
    return Status::ok();
  }
  Status read(const std::string& key, float& out) {
    const Json* v = take(key);
    if (!v) return Status::ok();
    if (!v->is_number()) return type_error(key, "a number", *v);
    out = static_cast<float>(v->get<double>());
    return Status::ok();
  }
  Status read(const std::string& key, bool& out) {
    const Json* v = take(key);
    if (!v) return Status::ok();
    if (!v->is_boolean()) return type_error(key, "a boolean", *v);
    out = v->get<bool>();
    return Status::ok();
  }
  Status read(const std::string& key, std::string& out) {
    const Json* v = take(key);
    if (!v) return Status::ok();
    if (!v->is_string()) return type_error(key, "a string", *v);
    out = v->get<std::string>();
    return Status::ok();
  }
  Status read(const std::string& key, std::vector<int>& out) {
    const Json* v = take(key);
    if (!v) return Status::ok();
    if (!v->is_array()) return type_error(key, "a list of integers", *v);
    out.clear();
    for (const Json& e : *v) {
      if (!e.is_number_integer()) return type_error(key, "a list of integers", *v);
      out.push_back(e.get<int>());
    }
    return Status::ok();
  }
  // "eos_token_id": a single id or a list of ids.
  Status read_int_or_list(const std::string& key, std::vector<int>& out) {
    const Json* v = obj_.contains(key) ? &obj_.at(key) : nullptr;
    if (v && v->is_number_integer()) {
      seen_.insert(key);
      out = {v->get<int>()};
      return Status::ok();
    }
    if (v && v->is_null()) {
      seen_.insert(key);
      out.clear();
      return Status::ok();
    }
    return read(key, out);
  }
  // A nullable id ("bos_token_id": null means none, stored as -1).
  Status read_optional_id(const std::string& key, int& out) {
    if (obj_.contains(key) && obj_.at(key).is_null()) {
      seen_.insert(key);
      out = -1;
      return Status::ok();
    }
    return read(key, out);
  }
  const Json* take_object(const std::string& key, Status& st) {
    const Json* v = take(key);
    if (v && !v->is_object()) {
      st = type_error(key, "an object", *v);
      return nullptr;
    }
    return v;
  }
  void ignore(const std::string& key) { seen_.insert(key); }
  bool has(const std::string& key) const { return obj_.contains(key); }
  // An integer that may be null (e.g. Kimi Linear's "q_lora_rank": null); null reads as `if_null`.
  Status read_nullable(const std::string& key, int& out, int if_null) {
    if (obj_.contains(key) && obj_.at(key).is_null()) {
      seen_.insert(key);
      out = if_null;
      return Status::ok();
    }
    return read(key, out);
  }
  // A list of strings (e.g. "layer_types").
  Status read(const std::string& key, std::vector<std::string>& out) {
    const Json* v = take(key);
    if (!v) return Status::ok();
    if (!v->is_array()) return type_error(key, "a list of strings", *v);
    out.clear();
    for (const Json& e : *v) {
      if (!e.is_string()) return type_error(key, "a list of strings", *v);
      out.push_back(e.get<std::string>());
    }
    return Status::ok();
  }

  // Every key not consumed is an error naming it.
  Status finish(const std::string& schema = "kimi_k3") const {
    for (auto it = obj_.begin(); it != obj_.end(); ++it)
      if (!seen_.count(it.key()))
        return invalid_argument("unknown config field '" + path(it.key()) +
                                "' (not part of the " + schema + " config schema; check the spelling)");
    return Status::ok();
  }

 private:
  const Json* take(const std::string& key) {
    if (!obj_.contains(key)) return nullptr;
    seen_.insert(key);
    return &obj_.at(key);
  }
  Status type_error(const std::string& key, const char* want, const Json& got) const {
    return invalid_argument(path(key) + " must be " + want + " (got " + got.dump() + ")");
  }

  const Json& obj_;
  std::string prefix_;
  std::set<std::string> seen_;
};

// Shortest decimal text that reads back as the same float, stored as the double of that text so
// the JSON shows "1e-05" rather than the float's binary expansion, and parses back bit-exactly.
inline Json float_json(float v) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  return Json(std::strtod(std::string(buf, res.ptr).c_str(), nullptr));
}

inline Status positive(const std::string& field, int64_t v) {
  if (v > 0) return Status::ok();
  return invalid_argument(field + " must be > 0 (got " + std::to_string(v) + ")");
}

}  // namespace k3::config_detail
