#include "transfer/control_keys.h"

#include <spdlog/spdlog.h>
#include <zmq.h>

namespace k3::transfer {

Result<ControlKeys> ControlKeys::load(const std::string& keypair_path, const std::string& public_keys_path) {
  K3_TRY(require_curve());
  ControlKeys k;
  K3_ASSIGN_OR_RETURN(k.self, load_keypair(keypair_path));
  K3_ASSIGN_OR_RETURN(auto pub, load_public_keys(public_keys_path));
  // The file must agree with our own key: a stale public-keys file would lock us out in confusing ways.
  auto listed = pub.key_of(k.self.name);
  if (listed && *listed != k.self.public_z85)
    return invalid_argument("public keys file " + public_keys_path + " lists another key for '" + k.self.name +
                            "' than keypair file " + keypair_path);
  k.cluster = std::make_shared<const PublicKeys>(std::move(pub));
  return k;
}

Result<std::string> ControlKeys::public_key_of(const std::string& name) const {
  if (cluster)
    if (auto key = cluster->key_of(name)) return *key;
  return not_found("the control public keys have no key for '" + name + "'");
}

namespace {
Status set_key(void* sock, int opt, const std::string& z85, const char* what) {
  K3_ASSIGN_OR_RETURN(const std::string raw, z85_to_raw(z85));
  if (zmq_setsockopt(sock, opt, raw.data(), raw.size()) != 0)
    return internal_error(std::string("CURVE ") + what + ": " + zmq_strerror(zmq_errno()));
  return Status::ok();
}
Status set_own_keys(void* sock, const ControlKeys& keys) {
  K3_TRY(require_curve());
  K3_TRY(set_key(sock, ZMQ_CURVE_SECRETKEY, keys.self.secret_z85, "secret key"));
  return set_key(sock, ZMQ_CURVE_PUBLICKEY, keys.self.public_z85, "public key");
}
}  // namespace

Status apply_curve_server(void* sock, const ControlKeys& keys) {
  K3_TRY(set_own_keys(sock, keys));
  const int one = 1;
  if (zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof one) != 0)
    return internal_error(std::string("CURVE server: ") + zmq_strerror(zmq_errno()));
  return Status::ok();
}

Status apply_curve_client(void* sock, const ControlKeys& keys, const std::string& server_name) {
  if (server_name.empty()) return invalid_argument("CURVE client: the server's name is empty");
  K3_TRY(set_own_keys(sock, keys));
  K3_ASSIGN_OR_RETURN(const std::string server, keys.public_key_of(server_name));
  return set_key(sock, ZMQ_CURVE_SERVERKEY, server, "server key");
}

Result<std::optional<ControlKeys>> control_keys_from_flags(const std::string& keypair_path,
                                                          const std::string& public_keys_path, bool insecure) {
  if (insecure) {
    if (!keypair_path.empty() || !public_keys_path.empty())
      return invalid_argument("--insecure-control-plane cannot be combined with --control-key/--control-public-keys");
    spdlog::warn("control plane runs WITHOUT authentication (--insecure-control-plane)");
    return std::optional<ControlKeys>();
  }
  if (keypair_path.empty() || public_keys_path.empty())
    return invalid_argument("the control plane needs --control-key and --control-public-keys (k3-cluster writes "
                            "them; see docs/SECURITY.md), or --insecure-control-plane to run without authentication");
  K3_ASSIGN_OR_RETURN(auto keys, ControlKeys::load(keypair_path, public_keys_path));
  return std::optional<ControlKeys>(std::move(keys));
}

}  // namespace k3::transfer
