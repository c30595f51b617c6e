// Timing and inputs of `k3-bench kernels` (kernel_timing.h).
#include "bench/kernel_timing.h"
#ifdef K3_HAVE_CUDA
#include <algorithm>
#include <atomic>
#include <exception>
#include <memory>
#include <random>

#include "kernels/cuda/cuda_check.h"

namespace k3::bench {
namespace {

// The host function that holds a stream: blocks (no spinning) until the flag is set.
void CUDART_CB wait_until_queued(void* flag) { static_cast<std::atomic<bool>*>(flag)->wait(false); }

// Releases the held stream; on unwinding also waits for it, so that the host function is done with
// the flag before the flag goes.
struct StreamHold {
  cudaStream_t s;
  std::atomic<bool>& queued;
  ~StreamHold() {
    queued.store(true);
    queued.notify_one();
    if (std::uncaught_exceptions() > 0) cudaStreamSynchronize(s);
  }
};

class Events {
 public:
  Events() {
    K3_CUDA_OK(cudaEventCreate(&a_));
    K3_CUDA_OK(cudaEventCreate(&b_));
  }
  ~Events() {
    cudaEventDestroy(a_);
    cudaEventDestroy(b_);
  }
  // Microseconds of device time taken by what `f` enqueues on `s`. The stream is held (a host
  // function that returns once everything is queued behind it) so that the start event is taken
  // with `f`'s work already queued. On an idle stream the start event is taken as soon as it is
  // queued, and the microseconds the host then takes to submit `f`'s work (a graph launch: several)
  // count as the kernel's own; nvbench holds its stream with a blocking kernel for the same reason.
  double time(cudaStream_t s, const std::function<void()>& f) {
    std::atomic<bool> queued{false};
    K3_CUDA_OK(cudaLaunchHostFunc(s, wait_until_queued, &queued));
    {
      StreamHold hold{s, queued};  // released (and, if `f` throws, drained) however this block ends
      K3_CUDA_OK(cudaEventRecord(a_, s));
      f();
      K3_CUDA_OK(cudaEventRecord(b_, s));
    }
    K3_CUDA_OK(cudaEventSynchronize(b_));
    float ms = 0;
    K3_CUDA_OK(cudaEventElapsedTime(&ms, a_, b_));
    return ms * 1e3;
  }

 private:
  cudaEvent_t a_ = nullptr, b_ = nullptr;
};

class Graph {
 public:
  Graph(cudaStream_t s, const std::function<void()>& f) {
    K3_CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    f();
    cudaGraph_t g = nullptr;
    K3_CUDA_OK(cudaStreamEndCapture(s, &g));
    K3_CUDA_OK(cudaGraphInstantiate(&exec_, g, 0));
    cudaGraphDestroy(g);
  }
  ~Graph() {
    if (exec_) cudaGraphExecDestroy(exec_);
  }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  void launch(cudaStream_t s) { K3_CUDA_OK(cudaGraphLaunch(exec_, s)); }

 private:
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace

void fill_uniform(void* p, int64_t n, bool bf16, float lo, float hi, uint64_t seed, cudaStream_t s) {
  constexpr int64_t kPattern = int64_t(1) << 22;
  const int64_t m = std::min(n, kPattern);
  if (m == 0) return;
  std::mt19937 rng{static_cast<uint32_t>(seed)};
  std::uniform_real_distribution<float> ud(lo, hi);
  std::vector<float> f(static_cast<size_t>(m));
  for (auto& v : f) v = ud(rng);
  std::vector<uint16_t> h;
  const void* src = f.data();
  const size_t esz = bf16 ? 2 : 4;
  if (bf16) {
    h.resize(f.size());
    for (size_t i = 0; i < f.size(); ++i) h[i] = f32_to_bf16(f[i]);
    src = h.data();
  }
  for (int64_t off = 0; off < n; off += m) {
    const int64_t len = std::min(m, n - off);
    K3_CUDA_OK(cudaMemcpyAsync(static_cast<char*>(p) + off * esz, src, size_t(len) * esz, cudaMemcpyHostToDevice, s));
  }
  K3_CUDA_OK(cudaStreamSynchronize(s));  // host pattern dies at return
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

double time_eager(cudaStream_t s, int warm, int iters, const std::function<void()>& f) {
  Events ev;
  for (int i = 0; i < warm; ++i) f();
  K3_CUDA_OK(cudaStreamSynchronize(s));
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) t.push_back(ev.time(s, f));
  return median(t);
}

double time_graphs(cudaStream_t s, int replays, const std::vector<std::function<void()>>& variants) {
  for (auto& v : variants) v();
  K3_CUDA_OK(cudaStreamSynchronize(s));
  std::vector<std::unique_ptr<Graph>> graphs;
  for (auto& v : variants) graphs.push_back(std::make_unique<Graph>(s, v));
  for (auto& g : graphs) g->launch(s);  // warm
  K3_CUDA_OK(cudaStreamSynchronize(s));
  Events ev;
  std::vector<double> t;
  for (int i = 0; i < replays; ++i) t.push_back(ev.time(s, [&] { graphs[i % graphs.size()]->launch(s); }));
  return median(t);
}

Tensor dev_ints(cuda::CudaBackend& be, const std::vector<int32_t>& v) {
  return be.from_host(Tensor::from_i32({int64_t(v.size())}, v), DType::I32);
}
void fill(cuda::CudaBackend& be, const Tensor& t, float lo, float hi, uint64_t seed) {
  fill_uniform(t.data(), t.numel(), t.dtype() == DType::BF16, lo, hi, seed, be.stream());
}

}  // namespace k3::bench
#endif  // K3_HAVE_CUDA
