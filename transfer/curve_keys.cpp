#include "transfer/curve_keys.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

namespace k3::transfer {

namespace {

bool is_z85_key(const std::string& s) {
  if (s.size() != kCurveKeyZ85Chars) return false;
  uint8_t raw[kCurveKeyBytes];
  return zmq_z85_decode(raw, s.c_str()) != nullptr;
}

// Writes `text` to `path` with mode 0600: a private temporary file in the same directory, renamed over
// the target, so a reader never sees a partial file and the bytes are never readable by others.
Status write_private(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return io_error("key file " + tmp + ": cannot create: " + std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      return io_error("key file " + tmp + ": write failed: " + why);
    }
    done += static_cast<size_t>(n);
  }
  // The umask may have narrowed the mode, never widened it; make it exactly 0600 anyway.
  const bool ok = ::fchmod(fd, 0600) == 0 && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    return io_error("key file " + path + ": cannot write: " + why);
  }
  return Status::ok();
}

// The non-comment lines of a file, each split into whitespace-separated words, with line numbers.
struct Line {
  int number;
  std::vector<std::string> words;
};
Result<std::vector<Line>> read_lines(const std::string& path, const std::string& what) {
  std::ifstream in(path);
  if (!in) return not_found(what + " " + path + ": cannot open: " + std::strerror(errno));
  std::vector<Line> out;
  std::string text;
  for (int n = 1; std::getline(in, text); ++n) {
    // Only whole-line comments: '#' is a z85 digit, so it may appear inside keys.
    if (auto first = text.find_first_not_of(" \t"); first != std::string::npos && text[first] == '#') continue;
    std::istringstream words(text);
    Line l{n, {}};
    for (std::string w; words >> w;) l.words.push_back(w);
    if (!l.words.empty()) out.push_back(std::move(l));
  }
  return out;
}

}  // namespace

Status require_curve() {
  if (zmq_has("curve")) return Status::ok();
  return unsupported("this libzmq was built without CURVE (libsodium): the authenticated control plane cannot run; "
                     "install a libzmq with CURVE or pass --insecure-control-plane");
}

Result<std::string> z85_to_raw(const std::string& z85) {
  if (!is_z85_key(z85)) return invalid_argument("'" + z85 + "' is not a 40-character z85 CURVE key");
  std::string raw(kCurveKeyBytes, '\0');
  zmq_z85_decode(reinterpret_cast<uint8_t*>(raw.data()), z85.c_str());
  return raw;
}

std::string raw_to_z85(const std::string& raw) {
  char out[kCurveKeyZ85Chars + 1];
  if (raw.size() != kCurveKeyBytes || !zmq_z85_encode(out, reinterpret_cast<const uint8_t*>(raw.data()), raw.size()))
    return {};
  return out;
}

Result<CurveKeyPair> generate_keypair(const std::string& name) {
  K3_TRY(require_curve());
  if (name.empty() || name.find_first_of(" \t\n#") != std::string::npos)
    return invalid_argument("key name '" + name + "' must be non-empty without blanks or '#'");
  char pub[kCurveKeyZ85Chars + 1], sec[kCurveKeyZ85Chars + 1];
  if (zmq_curve_keypair(pub, sec) != 0) return internal_error(std::string("zmq_curve_keypair: ") + zmq_strerror(zmq_errno()));
  return CurveKeyPair{name, pub, sec};
}

Status save_keypair(const std::string& path, const CurveKeyPair& kp) {
  if (!is_z85_key(kp.public_z85) || !is_z85_key(kp.secret_z85))
    return invalid_argument("keypair of '" + kp.name + "' holds a key that is not 40 z85 characters");
  return write_private(path, "# k3serve control-plane keypair (keep private)\nname   " + kp.name + "\npublic " +
                                 kp.public_z85 + "\nsecret " + kp.secret_z85 + "\n");
}

Result<CurveKeyPair> load_keypair(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return not_found("keypair file " + path + ": " + std::strerror(errno));
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return invalid_argument("keypair file " + path + ": mode " + mode +
                            " lets group or others read the secret key; chmod 600 it");
  }
  K3_ASSIGN_OR_RETURN(auto lines, read_lines(path, "keypair file"));
  std::map<std::string, std::string> fields;
  for (const auto& l : lines) {
    const std::string where = "keypair file " + path + " line " + std::to_string(l.number);
    if (l.words.size() != 2) return invalid_argument(where + ": expected '<field> <value>'");
    const std::string& field = l.words[0];
    if (field != "name" && field != "public" && field != "secret")
      return invalid_argument(where + ": unknown field '" + field + "' (name, public, secret)");
    if (!fields.emplace(field, l.words[1]).second) return invalid_argument(where + ": field '" + field + "' given twice");
  }
  for (const char* f : {"name", "public", "secret"})
    if (!fields.count(f)) return invalid_argument("keypair file " + path + ": field '" + f + "' is missing");
  CurveKeyPair kp{fields["name"], fields["public"], fields["secret"]};
  for (auto [field, key] : {std::pair{"public", &kp.public_z85}, std::pair{"secret", &kp.secret_z85}})
    if (!is_z85_key(*key))
      return invalid_argument("keypair file " + path + ": field '" + field + "' is not a 40-character z85 key");
  char derived[kCurveKeyZ85Chars + 1];
  K3_TRY(require_curve());
  if (zmq_curve_public(derived, kp.secret_z85.c_str()) != 0 || kp.public_z85 != derived)
    return invalid_argument("keypair file " + path + ": the public key does not belong to the secret key");
  return kp;
}

Status PublicKeys::add(const std::string& name, const std::string& public_z85) {
  if (!is_z85_key(public_z85)) return invalid_argument("public key of '" + name + "' is not a 40-character z85 key");
  if (by_name_.count(name)) return invalid_argument("name '" + name + "' has two public keys");
  if (by_key_.count(public_z85))
    return invalid_argument("the public key of '" + name + "' is also the key of '" + by_key_.at(public_z85) + "'");
  by_name_[name] = public_z85;
  by_key_[public_z85] = name;
  return Status::ok();
}

std::optional<std::string> PublicKeys::key_of(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? std::nullopt : std::optional(it->second);
}

std::optional<std::string> PublicKeys::name_of(const std::string& public_z85) const {
  auto it = by_key_.find(public_z85);
  return it == by_key_.end() ? std::nullopt : std::optional(it->second);
}

Status save_public_keys(const std::string& path, const PublicKeys& keys) {
  std::string text = "# k3serve control-plane public keys: <name> <z85 public key>\n";
  for (const auto& [name, key] : keys.by_name()) text += name + " " + key + "\n";
  return write_private(path, text);
}

Result<PublicKeys> load_public_keys(const std::string& path) {
  K3_ASSIGN_OR_RETURN(auto lines, read_lines(path, "public keys file"));
  PublicKeys keys;
  for (const auto& l : lines) {
    const std::string where = "public keys file " + path + " line " + std::to_string(l.number);
    if (l.words.size() != 2) return invalid_argument(where + ": expected '<name> <z85 public key>'");
    if (Status s = keys.add(l.words[0], l.words[1]); !s.is_ok()) return invalid_argument(where + ": " + s.message());
  }
  if (keys.by_name().empty()) return invalid_argument("public keys file " + path + ": no keys");
  return keys;
}

}  // namespace k3::transfer
