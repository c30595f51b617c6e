#include "transfer/advertise_endpoint.h"

namespace k3::transfer {

Result<std::string> advertised_endpoint(const std::string& bound, const std::string& advertise_host,
                                        const std::string& flag) {
  const std::string scheme = "tcp://";
  const size_t colon = bound.rfind(':');
  if (bound.rfind(scheme, 0) != 0 || colon == std::string::npos || colon < scheme.size())
    return invalid_argument("bound endpoint '" + bound + "' is not tcp://HOST:PORT");
  const std::string host = bound.substr(scheme.size(), colon - scheme.size());
  const std::string port = bound.substr(colon + 1);
  if (port.empty() || port.find_first_not_of("0123456789") != std::string::npos)
    return invalid_argument("bound endpoint '" + bound + "' has no numeric port (bind a port or '*' and read it back)");
  if (advertise_host.empty()) {
    if (host == "0.0.0.0" || host == "*" || host == "[::]" || host == "::")
      return invalid_argument("bound to every interface (" + bound + "): give " + flag +
                              " with an address or name peers can reach");
    return bound;
  }
  if (advertise_host.find_first_of(":/ ") != std::string::npos && advertise_host.front() != '[')
    return invalid_argument(flag + " '" + advertise_host + "': expected a host name or address without port or scheme");
  return scheme + advertise_host + ":" + port;
}

}  // namespace k3::transfer
