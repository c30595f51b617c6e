#include "common/io/progress_meter.h"

#include <unistd.h>

#include <algorithm>

namespace k3 {
namespace {

constexpr int kStepPercent = 5;
constexpr auto kRedraw = std::chrono::milliseconds(200);

std::string mb(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", bytes / 1e6);
  return buf;
}

std::string duration_text(double seconds) {
  if (seconds < 0 || seconds > 1e7) return "?";
  const long s = static_cast<long>(seconds + 0.5);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else if (s >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%lds", s);
  return buf;
}

}  // namespace

ProgressMeter::Mode ProgressMeter::mode_for(std::FILE* out, bool quiet) {
  if (quiet) return Mode::Off;
  return ::isatty(::fileno(out)) ? Mode::Terminal : Mode::Lines;
}

ProgressMeter::ProgressMeter(std::string label, uint64_t total_bytes, Mode mode, std::FILE* out)
    : label_(std::move(label)), total_(total_bytes), mode_(mode), out_(out) {}

ProgressMeter::~ProgressMeter() {
  if (bar_open_) std::fputc('\n', out_);
}

void ProgressMeter::add(uint64_t bytes) {
  done_ = std::min(total_, done_ + bytes);
  if (mode_ == Mode::Off || finished_) return;
  if (mode_ == Mode::Terminal) {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_draw_ < kRedraw) return;
    last_draw_ = now;
    print(false);
    return;
  }
  const int percent = total_ == 0 ? 100 : static_cast<int>(done_ * 100 / total_);
  if (percent < next_step_ * kStepPercent || percent >= 100) return;  // 100 % is printed by finish()
  next_step_ = percent / kStepPercent + 1;
  print(false);
}

void ProgressMeter::finish() {
  if (finished_) return;
  done_ = total_;
  if (mode_ != Mode::Off) print(true);
  finished_ = true;
}

void ProgressMeter::print(bool final) {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double rate = elapsed > 0 ? done_ / elapsed : 0;  // bytes/s
  const double percent = total_ == 0 ? 100.0 : 100.0 * static_cast<double>(done_) / static_cast<double>(total_);
  const std::string eta = final ? duration_text(elapsed)
                                : (rate > 0 ? duration_text((total_ - done_) / rate) : std::string("?"));
  const char* eta_label = final ? "took" : "ETA";
  if (mode_ == Mode::Terminal) {
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(percent * kWidth / 100.0);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.append(static_cast<size_t>(kWidth - filled), '.');
    std::fprintf(out_, "\r%s [%s] %5.1f%% %s / %s %.1f MB/s %s %s\033[K", label_.c_str(), bar.c_str(), percent,
                 mb(done_).c_str(), mb(total_).c_str(), rate / 1e6, eta_label, eta.c_str());
    bar_open_ = true;
    if (final) {
      std::fputc('\n', out_);
      bar_open_ = false;
    }
  } else {
    std::fprintf(out_, "%s %3d%% %s / %s %.1f MB/s %s %s\n", label_.c_str(), static_cast<int>(percent),
                 mb(done_).c_str(), mb(total_).c_str(), rate / 1e6, eta_label, eta.c_str());
  }
  std::fflush(out_);
}

}  // namespace k3
