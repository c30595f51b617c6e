// What a process needs to speak on the authenticated control plane (docs/SECURITY.md): its own CURVE
// keypair and the public keys of every party of the cluster (servers accept exactly these clients and
// bind each key to its name; clients pin their server's key by the server's name).
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "common/core/status.h"
#include "transfer/curve_keys.h"

namespace k3::transfer {

struct ControlKeys {
  CurveKeyPair self;
  std::shared_ptr<const PublicKeys> cluster;

  static Result<ControlKeys> load(const std::string& keypair_path, const std::string& public_keys_path);
  // The public key of `name` (a client's server), or an error naming what is missing.
  Result<std::string> public_key_of(const std::string& name) const;
};

// Socket options of a CURVE server (our keypair; clients are checked by a ZapHandler in the socket's
// context) and of a CURVE client (our keypair plus the pinned key of `server_name`). Call before
// bind/connect. `raw_socket` is a libzmq socket handle.
Status apply_curve_server(void* raw_socket, const ControlKeys& keys);
Status apply_curve_client(void* raw_socket, const ControlKeys& keys, const std::string& server_name);

// The nodes' and the router's flags: --control-key FILE, --control-public-keys FILE, or
// --insecure-control-plane (nullopt: plaintext, anyone may connect). Anything else is an error that
// says which flag to add.
Result<std::optional<ControlKeys>> control_keys_from_flags(const std::string& keypair_path,
                                                          const std::string& public_keys_path, bool insecure);

// The --help texts of those flags (one definition for k3-router, k3-prefill and k3-decode).
inline constexpr const char* kControlKeyHelp =
    "this process's CURVE keypair file (0600; see docs/SECURITY.md; k3-cluster writes one per process)";
inline constexpr const char* kControlPublicKeysHelp =
    "public keys of every party of the cluster ('<name> <z85 key>' per line): servers accept only these "
    "clients, each under its own name; clients verify their server's key";
inline constexpr const char* kInsecureControlHelp =
    "run the ZeroMQ control plane without authentication or encryption (tests and trusted single-user "
    "machines only: any local process can then read prompts and inject tokens)";

}  // namespace k3::transfer
