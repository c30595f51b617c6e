#include "transfer/net_interface.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <cerrno>
#include <cstring>

namespace k3::transfer {

Result<std::string> net_device_of(const std::string& address) {
  in_addr want{};
  if (inet_pton(AF_INET, address.c_str(), &want) != 1)
    return invalid_argument("--interface '" + address + "' is not an IPv4 address");
  ifaddrs* all = nullptr;
  if (getifaddrs(&all) != 0) return io_error(std::string("getifaddrs: ") + std::strerror(errno));
  std::string found;
  for (ifaddrs* i = all; i && found.empty(); i = i->ifa_next)
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
        reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr == want.s_addr)
      found = i->ifa_name;
  freeifaddrs(all);
  if (found.empty()) return not_found("--interface " + address + ": no local network interface has this address");
  return found;
}

}  // namespace k3::transfer
