// advertised_endpoint: the bound port with the advertised host; a wildcard bind needs an advertised host.
#include <catch2/catch.hpp>

#include "transfer/advertise_endpoint.h"

using k3::transfer::advertised_endpoint;

namespace {
// The endpoint, or the error text when there is none.
std::string advertised(const std::string& bound, const std::string& host) {
  auto r = advertised_endpoint(bound, host);
  return r.is_ok() ? r.value() : "error: " + r.status().message();
}
}  // namespace

TEST_CASE("advertised_endpoint keeps the bound port and replaces the host", "[transfer]") {
  CHECK(advertised("tcp://0.0.0.0:5701", "10.1.2.3") == "tcp://10.1.2.3:5701");
  CHECK(advertised("tcp://127.0.0.1:41234", "") == "tcp://127.0.0.1:41234");
  CHECK(advertised("tcp://0.0.0.0:5701", "decode-0.k3-decode") == "tcp://decode-0.k3-decode:5701");
  auto wild = advertised_endpoint("tcp://0.0.0.0:5701", "");
  REQUIRE(!wild.is_ok());
  CHECK(wild.status().message().find("--advertise-host") != std::string::npos);
  CHECK(!advertised_endpoint("ipc:///tmp/x", "h").is_ok());
  CHECK(!advertised_endpoint("tcp://0.0.0.0:*", "h").is_ok());
  auto bad = advertised_endpoint("tcp://0.0.0.0:5701", "tcp://h:1", "--x");
  REQUIRE(!bad.is_ok());
  CHECK(bad.status().message().find("--x 'tcp://h:1'") != std::string::npos);
}
