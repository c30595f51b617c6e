// CURVE keys of the control plane (docs/SECURITY.md): one keypair per process, stored as text files.
//
// A keypair file (written 0600; loading refuses a file that group or others may read):
//     # k3serve control-plane keypair
//     name   decode/d
//     public <40 z85 characters>
//     secret <40 z85 characters>
// The public-keys file every process of a cluster gets (who may connect, and whom a client trusts as
// its server): one "name public_key" line per party; lines starting with '#' are comments ('#' is also a
// z85 digit, so there are no comments after a key) and blank lines are skipped.
//     router       <z85>
//     decode/d     <z85>
//     prefill/p/0  <z85>
// Loading is strict: a missing field, a key that is not 40 z85 characters, a public key that does not
// belong to the secret one, or a name or key given twice is an error naming the file, the line and
// what is wrong.
#pragma once
#include <map>
#include <optional>
#include <string>

#include "common/core/status.h"

namespace k3::transfer {

inline constexpr size_t kCurveKeyZ85Chars = 40;
inline constexpr size_t kCurveKeyBytes = 32;

struct CurveKeyPair {
  std::string name;        // control name of the owner, e.g. "decode/d"
  std::string public_z85;
  std::string secret_z85;
};

// Ok when this libzmq was built with CURVE (libsodium); otherwise an error saying so.
Status require_curve();

Result<CurveKeyPair> generate_keypair(const std::string& name);
// Writes the keypair file with mode 0600 (a temporary file renamed over `path`).
Status save_keypair(const std::string& path, const CurveKeyPair& kp);
Result<CurveKeyPair> load_keypair(const std::string& path);

// Public keys by control name; both directions are unique.
class PublicKeys {
 public:
  // Errors when the name or the key is already present.
  Status add(const std::string& name, const std::string& public_z85);
  std::optional<std::string> key_of(const std::string& name) const;
  std::optional<std::string> name_of(const std::string& public_z85) const;
  const std::map<std::string, std::string>& by_name() const { return by_name_; }

 private:
  std::map<std::string, std::string> by_name_;
  std::map<std::string, std::string> by_key_;
};

Status save_public_keys(const std::string& path, const PublicKeys& keys);
Result<PublicKeys> load_public_keys(const std::string& path);

// z85 text <-> the 32 raw key bytes (libzmq's socket options and ZAP use the raw form).
Result<std::string> z85_to_raw(const std::string& z85);
std::string raw_to_z85(const std::string& raw);

}  // namespace k3::transfer
