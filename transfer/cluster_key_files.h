// The control-plane keys of a whole cluster, as k3-cluster (and tests) write them (docs/SECURITY.md): one CURVE keypair file
// per process (0600, named after its control name) and one public-keys file listing them all, in a
// directory only the launcher's user may enter. Each process gets its own keypair and the public keys
// (flags()); the router's allow-list is the same public-keys file. The files stay for the launcher's
// lifetime, so a node started again (same name) registers with the same keypair.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "common/core/status.h"

namespace k3::transfer {

class ClusterKeyFiles {
 public:
  // Generates a keypair for each control name ("router", "decode/d", "prefill/p/0", ...) under `dir`
  // (created with mode 0700 when missing).
  static Result<ClusterKeyFiles> write(const std::string& dir, const std::vector<std::string>& names);
  // --control-key <its keypair> --control-public-keys <the public keys file>
  std::vector<std::string> flags(const std::string& name) const;
  const std::string& public_keys() const { return public_keys_; }
  const std::string& keypair(const std::string& name) const { return keypairs_.at(name); }

 private:
  std::string public_keys_;
  std::map<std::string, std::string> keypairs_;  // control name -> keypair file
};

}  // namespace k3::transfer
