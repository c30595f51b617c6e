// Runs a shell command for CLI tests and captures its stdout (stderr goes to the test log).
#pragma once
#include <array>
#include <cstdio>
#include <string>
#include <cstdlib>
#include <sys/wait.h>

namespace k3::test {

struct CommandResult {
  int exit_code = -1;
  std::string out;
};

inline CommandResult run_command(const std::string& cmd) {
  CommandResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// A fresh empty directory under the build tree, removed on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    std::string templ = std::string(K3_BIN_DIR) + "/../tmp-" + tag + "-XXXXXX";
    std::system(("mkdir -p " + std::string(K3_BIN_DIR) + "/..").c_str());
    path_ = mkdtemp(templ.data()) ? templ : "";
  }
  ~TempDir() {
    if (!path_.empty()) std::system(("rm -rf '" + path_ + "'").c_str());
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace k3::test
