#include "kernels/backend_select.h"

namespace k3 {

Status validate(const BackendChoice& c) {
  if (c.kind != "cpu" && c.kind != "cuda")
    return invalid_argument("backend: expected 'cpu' or 'cuda', got '" + c.kind + "'");
  if (c.device < 0) return invalid_argument("device: must be >= 0, got " + std::to_string(c.device));
  if (c.threads < 0) return invalid_argument("threads: must be >= 0, got " + std::to_string(c.threads));
  return Status::ok();
}

Status set_kernels(BackendChoice& c, const std::string& kernels) {
  if (kernels != "invariant" && kernels != "fast")
    return invalid_argument("kernels: expected 'invariant' or 'fast', got '" + kernels + "'");
  c.batch_invariant = kernels == "invariant";
  return Status::ok();
}

Result<std::unique_ptr<Backend>> make_backend(const BackendChoice& c) {
  K3_TRY(validate(c));
  if (c.kind == "cpu") return make_cpu_backend({.threads = c.threads});
  std::string why;
  std::unique_ptr<Backend> b = make_cuda_backend(c.device, &why);
  if (!b) return Status(Code::Unavailable, "backend cuda (device " + std::to_string(c.device) + ") is unavailable: " + why);
  b->set_batch_invariant(c.batch_invariant);
  return b;
}

}  // namespace k3
