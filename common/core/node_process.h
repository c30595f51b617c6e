// What every long-running k3 binary (k3-prefill, k3-decode) does at its boundary: stop on SIGTERM/SIGINT,
// print protocol lines on stdout for its supervisor, report a fatal Status on stderr.
#pragma once
#include <atomic>
#include <string>

#include "common/core/status.h"

namespace k3 {

// Installs SIGTERM/SIGINT handlers that only set a flag (the one state a signal handler may touch);
// returns that flag. Call once from main.
const std::atomic<bool>& install_stop_signals();

// One line on stdout, flushed at once (supervisors and tests read these lines as they come).
void say_line(const std::string& line);

// "<program>: <status>" on stderr; returns the process exit code 1.
int fail_status(const char* program, const Status& s);

}  // namespace k3
