// Progress of loading a model's weights onto a backend, fed by a WeightStore's upload observer: nothing
// for a small model (under `min_bytes`: k3-tiny loads in a blink), else a ProgressMeter on stderr, a bar
// on a terminal and a line every 5 % in a log (a node started by k3-cluster, a pod, a Slurm step). A
// real K3 stage or rank uploads tens to hundreds of GB for minutes before it answers anything.
#pragma once
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>

#include "common/io/progress_meter.h"

namespace k3 {

class LoadProgress {
 public:
  // `out`: where the meter writes (stderr; tests give a file).
  explicit LoadProgress(std::string label, uint64_t min_bytes = uint64_t(1) << 30, std::FILE* out = stderr)
      : label_(std::move(label)), min_bytes_(min_bytes), out_(out) {}
  LoadProgress(const LoadProgress&) = delete;
  LoadProgress& operator=(const LoadProgress&) = delete;

  // For WeightStore::set_upload_observer; bound to this object, which must outlive the upload.
  std::function<void(uint64_t done, uint64_t total)> observer() {
    return [this](uint64_t done, uint64_t total) { seen(done, total); };
  }
  // The upload is over (prints the final line where anything was shown, unless the bytes already
  // reached the expected total and printed it).
  void finish() {
    if (meter_) meter_->finish();
  }

 private:
  void seen(uint64_t done, uint64_t total) {
    if (!meter_ && total >= min_bytes_ && done_ == 0)
      meter_ = std::make_unique<ProgressMeter>(label_, total, ProgressMeter::mode_for(out_, false), out_);
    if (meter_ && done > done_) meter_->add(done - done_);
    done_ = done;
    if (meter_ && done >= total) meter_->finish();  // the total is an estimate: done may pass it
  }

  std::string label_;
  uint64_t min_bytes_;
  std::FILE* out_;
  uint64_t done_ = 0;
  std::unique_ptr<ProgressMeter> meter_;
};

}  // namespace k3
