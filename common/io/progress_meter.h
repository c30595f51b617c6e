// Progress of a long write on stderr. On a terminal: one bar redrawn in place (bytes done / total,
// percent, MB/s, ETA), at most 5 times a second. Otherwise (a log file, a pipe): a plain line each
// time another 5 % is done, so logs show progress without a line per update.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace k3 {

class ProgressMeter {
 public:
  enum class Mode { Off, Terminal, Lines };
  // Mode::Terminal when `out` is a terminal, Mode::Lines otherwise; Mode::Off when `quiet`.
  static Mode mode_for(std::FILE* out, bool quiet);

  ProgressMeter(std::string label, uint64_t total_bytes, Mode mode, std::FILE* out = stderr);
  ProgressMeter(const ProgressMeter&) = delete;
  ProgressMeter& operator=(const ProgressMeter&) = delete;
  ~ProgressMeter();  // ends a terminal bar's line

  void add(uint64_t bytes);  // `bytes` more are done
  void finish();             // everything is done: prints the final state once

 private:
  void print(bool final);

  std::string label_;
  uint64_t total_;
  uint64_t done_ = 0;
  Mode mode_;
  std::FILE* out_;
  int next_step_ = 1;  // Lines: next multiple of 5 % to report
  bool finished_ = false;
  bool bar_open_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace k3
