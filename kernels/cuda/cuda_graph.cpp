// CudaBackend::capture: the work a body issues on the backend's stream, recorded into a CUDA graph
// and instantiated once. Stream capture refuses every call that would synchronise with the host or
// allocate (cudaMalloc, cudaFree, pageable or synchronous copies, stream or event syncs), so a
// recording that succeeds proves the body does none of them.
#include <string>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"

namespace k3::cuda {
namespace {

class CudaStepGraph final : public StepGraph {
 public:
  CudaStepGraph(cudaGraph_t graph, cudaGraphExec_t exec, cudaStream_t stream, int64_t nodes, uint64_t epoch)
      : graph_(graph), exec_(exec), stream_(stream), nodes_(nodes), epoch_(epoch) {}
  ~CudaStepGraph() override {
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
  }
  CudaStepGraph(const CudaStepGraph&) = delete;
  CudaStepGraph& operator=(const CudaStepGraph&) = delete;

  void launch() override { K3_CUDA_OK(cudaGraphLaunch(exec_, stream_)); }
  int64_t nodes() const override { return nodes_; }
  uint64_t workspace_epoch() const override { return epoch_; }

 private:
  cudaGraph_t graph_;
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
  int64_t nodes_;
  uint64_t epoch_;
};

}  // namespace

bool CudaBackend::begin_capture(bool strict) {
  K3_CUDA_OK(cudaSetDevice(device_));
  K3_CUDA_OK(cudaStreamBeginCapture(stream_, strict ? cudaStreamCaptureModeGlobal : cudaStreamCaptureModeThreadLocal));
  capture_epoch_ = epoch_;
  return true;
}

// Ends a capture that is being given up and forgets the error it left, so the stream is usable again.
void CudaBackend::abandon_capture() {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream_, &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(stream_, &g);
    if (g) cudaGraphDestroy(g);
  }
  (void)cudaGetLastError();
}

std::unique_ptr<StepGraph> CudaBackend::end_capture() {
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
  if (end != cudaSuccess || graph == nullptr) {
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    throw Error(std::string("cuda graph capture failed (an allocation, a host sync or a pageable copy inside the "
                            "step?): ") + cudaGetErrorString(end));
  }
  if (capture_epoch_ != epoch_) {  // cannot happen when capture refused the cudaMalloc, but never replay moved memory
    cudaGraphDestroy(graph);
    throw Error("cuda graph capture: a workspace moved while recording");
  }
  size_t nodes = 0;
  cudaGraphExec_t exec = nullptr;
  cudaError_t e = cudaGraphGetNodes(graph, nullptr, &nodes);
  if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, graph, 0);
  if (e != cudaSuccess) {
    cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    throw Error(std::string("cuda graph instantiate: ") + cudaGetErrorString(e));
  }
  return std::make_unique<CudaStepGraph>(graph, exec, stream_, int64_t(nodes), capture_epoch_);
}

}  // namespace k3::cuda
