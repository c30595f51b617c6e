// CURVE key files of the control plane: generate/save/load round trips, the 0600 mode on every file
// written, and the errors for loose permissions and every kind of bad content (each naming the file,
// the line and what is wrong).
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include "tests/support/scratch_dir.h"
#include "transfer/cluster_key_files.h"
#include "transfer/control_keys.h"
#include "transfer/curve_keys.h"

using namespace k3::transfer;
using k3::testing::ScratchDir;

namespace {
unsigned mode_of(const std::string& path) {
  struct stat st{};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return st.st_mode & 07777;
}
// Writes `text` as a 0600 file (the loaders check the mode before the content).
std::string private_file(const ScratchDir& dir, const std::string& name, const std::string& text) {
  dir.write(name, text);
  REQUIRE(::chmod(dir.file(name).c_str(), 0600) == 0);
  return dir.file(name);
}
void check_error(const k3::Status& s, std::initializer_list<std::string> parts) {
  REQUIRE_FALSE(s.is_ok());
  for (const auto& p : parts) {
    INFO("message: " << s.message() << "  expected to contain: " << p);
    CHECK(s.message().find(p) != std::string::npos);
  }
}
}  // namespace

TEST_CASE("this libzmq has CURVE", "[curve]") { REQUIRE(require_curve().is_ok()); }

TEST_CASE("keypair files round-trip with mode 0600 and distinct keys", "[curve]") {
  ScratchDir dir("curve");
  const auto a = generate_keypair("decode/d").value();
  const auto b = generate_keypair("decode/d").value();
  CHECK(a.public_z85.size() == kCurveKeyZ85Chars);
  CHECK(a.secret_z85.size() == kCurveKeyZ85Chars);
  CHECK(a.public_z85 != b.public_z85);
  CHECK(a.secret_z85 != b.secret_z85);
  const std::string path = dir.file("d.key");
  ::umask(0);  // a permissive umask must not widen the file's mode
  REQUIRE(save_keypair(path, a).is_ok());
  ::umask(022);
  CHECK(mode_of(path) == 0600);
  const auto back = load_keypair(path).value();
  CHECK(back.name == a.name);
  CHECK(back.public_z85 == a.public_z85);
  CHECK(back.secret_z85 == a.secret_z85);
  CHECK(raw_to_z85(z85_to_raw(a.public_z85).value()) == a.public_z85);
}

TEST_CASE("loading a keypair refuses loose permissions and bad content, naming what is wrong", "[curve]") {
  ScratchDir dir("curve");
  const auto kp = generate_keypair("prefill/p/0").value();
  const auto other = generate_keypair("prefill/p/1").value();
  const std::string good = "name prefill/p/0\npublic " + kp.public_z85 + "\nsecret " + kp.secret_z85 + "\n";

  SECTION("group/other-readable") {
    const std::string path = private_file(dir, "k", good);
    REQUIRE(::chmod(path.c_str(), 0644) == 0);
    check_error(load_keypair(path).status(), {path, "0644", "chmod 600"});
    REQUIRE(::chmod(path.c_str(), 0640) == 0);
    check_error(load_keypair(path).status(), {path, "0640"});
  }
  SECTION("missing file") { check_error(load_keypair(dir.file("none")).status(), {dir.file("none")}); }
  SECTION("a field missing") {
    const std::string path = private_file(dir, "k", "name prefill/p/0\npublic " + kp.public_z85 + "\n");
    check_error(load_keypair(path).status(), {path, "'secret' is missing"});
  }
  SECTION("an unknown field") {
    const std::string path = private_file(dir, "k", good + "colour blue\n");
    check_error(load_keypair(path).status(), {path, "line 4", "unknown field 'colour'"});
  }
  SECTION("a field twice") {
    const std::string path = private_file(dir, "k", good + "name x\n");
    check_error(load_keypair(path).status(), {path, "line 4", "'name' given twice"});
  }
  SECTION("a line with three words") {
    const std::string path = private_file(dir, "k", "name a b\n");
    check_error(load_keypair(path).status(), {path, "line 1", "expected"});
  }
  SECTION("a key that is not z85 / has the wrong length") {
    std::string bad = kp.secret_z85;
    bad[3] = '"';  // not in the z85 alphabet
    const std::string p1 = private_file(dir, "k1", "name x\npublic " + kp.public_z85 + "\nsecret " + bad + "\n");
    check_error(load_keypair(p1).status(), {p1, "'secret' is not a 40-character z85 key"});
    const std::string p2 =
        private_file(dir, "k2", "name x\npublic " + kp.public_z85.substr(0, 39) + "\nsecret " + kp.secret_z85 + "\n");
    check_error(load_keypair(p2).status(), {p2, "'public'"});
  }
  SECTION("a public key of another secret") {
    const std::string path =
        private_file(dir, "k", "name x\npublic " + other.public_z85 + "\nsecret " + kp.secret_z85 + "\n");
    check_error(load_keypair(path).status(), {path, "does not belong to the secret key"});
  }
  SECTION("comments and blank lines are fine") {
    const std::string path = private_file(dir, "k", "# mine\n\n" + good + "   # end\n\n");
    CHECK(load_keypair(path).value().public_z85 == kp.public_z85);
  }
}

TEST_CASE("public keys files: one key per name and name per key, strict lines", "[curve]") {
  ScratchDir dir("curve");
  const auto r = generate_keypair("router").value();
  const auto d = generate_keypair("decode/d").value();
  PublicKeys keys;
  REQUIRE(keys.add("router", r.public_z85).is_ok());
  REQUIRE(keys.add("decode/d", d.public_z85).is_ok());
  check_error(keys.add("router", d.public_z85), {"'router' has two public keys"});
  check_error(keys.add("decode/e", d.public_z85), {"also the key of 'decode/d'"});
  check_error(keys.add("x", "short"), {"'x' is not a 40-character z85 key"});
  REQUIRE(save_public_keys(dir.file("pub"), keys).is_ok());
  CHECK(mode_of(dir.file("pub")) == 0600);
  const auto back = load_public_keys(dir.file("pub")).value();
  CHECK(back.key_of("decode/d") == d.public_z85);
  CHECK(back.name_of(r.public_z85) == std::optional<std::string>("router"));
  CHECK_FALSE(back.key_of("decode/e"));

  dir.write("bad1", "router " + r.public_z85 + "\ndecode/d\n");
  check_error(load_public_keys(dir.file("bad1")).status(), {dir.file("bad1"), "line 2", "expected '<name> <z85"});
  dir.write("bad2", "router " + r.public_z85 + "\nrouter " + d.public_z85 + "\n");
  check_error(load_public_keys(dir.file("bad2")).status(), {"line 2", "two public keys"});
  dir.write("empty", "# nothing\n");
  check_error(load_public_keys(dir.file("empty")).status(), {"no keys"});
}

TEST_CASE("control keys: the flags, and a public keys file that disagrees with the keypair", "[curve]") {
  ScratchDir dir("curve");
  const auto files = ClusterKeyFiles::write(dir.str() + "/keys", {"router", "decode/d"}).value();
  CHECK(mode_of(dir.str() + "/keys") == 0700);
  CHECK(mode_of(files.keypair("router")) == 0600);
  auto keys = control_keys_from_flags(files.keypair("decode/d"), files.public_keys(), false).value();
  REQUIRE(keys);
  CHECK(keys->self.name == "decode/d");
  CHECK(keys->public_key_of("router").is_ok());
  check_error(keys->public_key_of("prefill/p/0").status(), {"no key for 'prefill/p/0'"});
  CHECK_FALSE(control_keys_from_flags("", "", true).value());  // the explicit opt-out
  check_error(control_keys_from_flags("", "", false).status(), {"--control-key", "--insecure-control-plane"});
  check_error(control_keys_from_flags(files.keypair("router"), "", false).status(), {"--control-public-keys"});
  check_error(control_keys_from_flags(files.keypair("router"), files.public_keys(), true).status(), {"cannot be combined"});
  // A keypair the public keys file does not know under its name with this key.
  const auto stray = generate_keypair("router").value();
  REQUIRE(save_keypair(dir.file("stray.key"), stray).is_ok());
  check_error(ControlKeys::load(dir.file("stray.key"), files.public_keys()).status(), {"another key for 'router'"});
}
