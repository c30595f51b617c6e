#include "transfer/cluster_key_files.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "transfer/curve_keys.h"

namespace k3::transfer {

Result<ClusterKeyFiles> ClusterKeyFiles::write(const std::string& dir, const std::vector<std::string>& names) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return io_error("keys dir " + dir + ": " + ec.message());
  if (::chmod(dir.c_str(), 0700) != 0) return io_error("keys dir " + dir + ": chmod 700: " + std::strerror(errno));
  ClusterKeyFiles out;
  PublicKeys pub;
  for (const auto& name : names) {
    K3_ASSIGN_OR_RETURN(auto kp, generate_keypair(name));
    std::string file = name;
    std::replace(file.begin(), file.end(), '/', '_');
    const std::string path = dir + "/" + file + ".key";
    K3_TRY(save_keypair(path, kp));
    K3_TRY(pub.add(name, kp.public_z85));
    out.keypairs_[name] = path;
  }
  out.public_keys_ = dir + "/public_keys";
  K3_TRY(save_public_keys(out.public_keys_, pub));
  return out;
}

std::vector<std::string> ClusterKeyFiles::flags(const std::string& name) const {
  return {"--control-key", keypairs_.at(name), "--control-public-keys", public_keys_};
}

}  // namespace k3::transfer
