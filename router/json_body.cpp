#include "router/json_body.h"

#include <cctype>
#include <vector>

#include "router/api_error.h"
#include "router/completion_request.h"

namespace k3::router {
namespace {

using json = nlohmann::json;

// A SAX consumer that builds nothing: it only tracks where in the document the parser is, so the
// failure it is told about can be named by path.
class PathTracker {
 public:
  bool null() { return value(); }
  bool boolean(bool) { return value(); }
  bool number_integer(json::number_integer_t) { return value(); }
  bool number_unsigned(json::number_unsigned_t) { return value(); }
  bool number_float(json::number_float_t, const json::string_t&) { return value(); }
  bool string(json::string_t&) { return value(); }
  bool binary(json::binary_t&) { return value(); }
  bool start_object(std::size_t) { return open(false); }
  bool start_array(std::size_t) { return open(true); }
  bool key(json::string_t& k) {
    frames_.back().key = k;
    return true;
  }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool parse_error(std::size_t, const std::string&, const json::exception& e) {
    failure_.reason = e.what();
    failure_.out_of_range = dynamic_cast<const json::out_of_range*>(&e) != nullptr;
    failure_.path = path();
    return false;
  }
  const JsonFailure& failure() const { return failure_; }

 private:
  struct Frame {
    bool array = false;
    long done = 0;  // array elements completed: the one being read has this index
    std::string key;
  };
  bool open(bool array) {
    frames_.push_back({.array = array});
    return true;
  }
  bool close() {
    frames_.pop_back();
    return value();
  }
  bool value() {
    if (!frames_.empty() && frames_.back().array) ++frames_.back().done;
    return true;
  }
  std::string path() const {
    std::string p;
    for (const Frame& f : frames_) {
      if (f.array) p += "[" + std::to_string(f.done) + "]";
      else if (!f.key.empty()) p += (p.empty() ? "" : ".") + f.key;
    }
    return p;
  }
  std::vector<Frame> frames_;
  JsonFailure failure_;
};

}  // namespace

JsonFailure locate_json_failure(const std::string& text) {
  PathTracker t;
  json::sax_parse(text, &t);
  return t.failure();
}

bool is_json_media_type(const std::string& content_type) {
  std::string t = content_type.substr(0, content_type.find(';'));
  for (char& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.pop_back();
  while (!t.empty() && (t.front() == ' ' || t.front() == '\t')) t.erase(0, 1);
  const size_t slash = t.find('/');
  if (slash == std::string::npos) return false;
  const std::string sub = t.substr(slash + 1);
  return sub == "json" || (sub.size() > 5 && sub.compare(sub.size() - 5, 5, "+json") == 0);
}

json parse_json_body(const std::string& text, int max_depth) {
  if (!json_depth_ok(text, max_depth))
    throw ApiError(400, "request body nests deeper than " + std::to_string(max_depth) + " levels", "", "invalid_json");
  json body = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!body.is_discarded()) return body;
  // Parse again for the reason and the place; cheap next to a failed request.
  const JsonFailure f = locate_json_failure(text);
  if (f.out_of_range)
    throw ApiError(400, (f.path.empty() ? std::string("a value") : f.path) + " is out of range: " + f.reason, f.path,
                   "number_out_of_range");
  throw ApiError(400, "request body is not valid JSON: " + (f.reason.empty() ? "malformed JSON" : f.reason) +
                          (f.path.empty() ? "" : " (in " + f.path + ")"),
                 "", "invalid_json");
}

}  // namespace k3::router
