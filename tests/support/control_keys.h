// Control-plane keys for tests that start nodes or control sockets themselves: the launcher's own key
// writer (transfer/cluster_key_files.h) into a ScratchDir. flags(name) go on a node's command line;
// load(name) gives a test's own socket (e.g. a stand-in router) its keys.
#pragma once
#include <string>
#include <vector>

#include "tests/support/scratch_dir.h"
#include "transfer/cluster_key_files.h"
#include "transfer/control_keys.h"

namespace k3::test {

struct TestControlKeys {
  testing::ScratchDir dir{"control_keys"};
  transfer::ClusterKeyFiles files;

  explicit TestControlKeys(const std::vector<std::string>& names)
      : files(transfer::ClusterKeyFiles::write(dir.str() + "/keys", names).value()) {}

  std::vector<std::string> flags(const std::string& name) const { return files.flags(name); }
  transfer::ControlKeys load(const std::string& name) const {
    return transfer::ControlKeys::load(files.keypair(name), files.public_keys()).value();
  }
};

}  // namespace k3::test
