// The --threads / --backend / --device / --kernels flags, declared once for every role's command line
// (k3-router, k3-prefill, k3-decode, k3-generate), so that their spelling, allowed values and help
// read the same everywhere. Header-only: only the binaries, which already parse with CLI11, include it.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "kernels/backend_select.h"

namespace k3 {

// What the four flags hold until the command line is parsed.
struct BackendFlags {
  BackendChoice choice;
  std::string kernels = "invariant";  // "invariant" | "fast"

  // The choice with --kernels applied; names the value when it is neither.
  Result<BackendChoice> resolve() const {
    BackendChoice c = choice;
    if (Status st = set_kernels(c, kernels); !st.is_ok()) return st;
    return c;
  }
};

inline void add_backend_flags(CLI::App& app, BackendFlags& f) {
  app.add_option("--threads", f.choice.threads, "CPU threads (0 = all cores or K3_THREADS)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--backend", f.choice.kind, kBackendFlagHelp)->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--device", f.choice.device, kDeviceFlagHelp)->check(CLI::NonNegativeNumber);
  app.add_option("--kernels", f.kernels, kKernelsFlagHelp)->check(CLI::IsMember({"invariant", "fast"}));
}

}  // namespace k3
