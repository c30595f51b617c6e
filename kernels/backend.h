// A backend runs the ops of kernels/ops.h on its device. Model code holds a Backend& and never
// branches on which one it is. Ask supports() before dispatch; run() of an unsupported shape
// throws k3::Error naming the op and the reason.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "kernels/ops.h"

namespace k3 {

enum class BackendKind { Cpu, Cuda };

// Backend work recorded once and replayed by one launch (a CUDA graph): the same kernels on the same
// addresses, so a replay computes bit for bit what the recorded work would have.
class StepGraph {
 public:
  virtual ~StepGraph() = default;
  virtual void launch() = 0;
  virtual int64_t nodes() const = 0;         // kernels, copies and memsets one launch replays
  virtual uint64_t workspace_epoch() const = 0;  // Backend::workspace_epoch() when it was recorded
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const = 0;
  virtual const char* name() const = 0;
  // The dtype this backend keeps activations and weights in (CPU: F32, CUDA: BF16).
  virtual DType compute_dtype() const = 0;

  // Allocates zeroed memory on the backend's device.
  virtual Tensor alloc(const Shape& shape, DType dtype) = 0;
  // Copies to a host tensor (F32 stays F32, BF16 becomes F32 when to_f32) and back.
  virtual Tensor to_host(const Tensor& t) = 0;
  virtual Tensor from_host(const Tensor& host, DType dtype) = 0;
  virtual void copy(const Tensor& src, Tensor& dst) = 0;   // same device, same bytes
  virtual void synchronize() {}
  // Sets every byte of t to zero (t lives on this backend).
  virtual void zero(Tensor& t);

  // Records the work `body` issues instead of running it; null where the backend cannot record.
  // Any allocation, host synchronisation or pageable copy inside body fails the recording (throws
  // k3::Error): strict checks that for every thread of the process, otherwise for the calling thread.
  std::unique_ptr<StepGraph> capture(const std::function<void()>& body, bool strict);
  // The same in two halves, for callers that cut one step into several recordings (a profile by
  // layer type): begin_capture returns false where the backend cannot record; end_capture throws
  // when the recording failed; abandon_capture ends one that is being given up.
  virtual bool begin_capture(bool strict) { return false; }
  virtual std::unique_ptr<StepGraph> end_capture() { return nullptr; }
  virtual void abandon_capture() {}
  // Bumped whenever a workspace the backend owns moves: a StepGraph recorded at another epoch would
  // read freed memory and must be recorded again.
  virtual uint64_t workspace_epoch() const { return 0; }

  // Batch invariance: a row's results independent of the other rows in the same call (fixed-order
  // GEMMs, attention splits of a fixed size). The CPU backend always is; CUDA when this is on (it
  // costs GEMM speed: docs/PERF.md).
  virtual void set_batch_invariant(bool on) {}
  virtual bool batch_invariant() const { return kind() == BackendKind::Cpu; }
  // Chunk invariance: a token's results also independent of how its sequence was cut into forwards,
  // as long as the cuts fall at multiples of 64 tokens (prompt whole or in such chunks; decode steps
  // after it). Where this is on, the model runs MLA rows through the per-row kernel a decode step uses
  // and KDA by the aligned-block rule of engine/kda_heads.h, and kda_chunk's arithmetic for a block
  // depends only on its state and rows (docs/ARCHITECTURE.md, "Batch and chunk invariance"). CUDA in
  // batch-invariant mode; the CPU keeps its faster forms, equal across chunkings only to rounding,
  // unless CpuBackendOptions::chunk_invariant.
  virtual bool chunk_invariant() const { return false; }
  // On a chunk-invariant backend: whether kda_decode gives the bits of the separate steps a prompt's
  // rows take (short_conv, l2norm, kda_gate, sigmoid, kda_recurrent), so the model may take it for
  // decode steps without breaking the promise. Off where not shown on the hardware.
  virtual bool kda_decode_matches_steps() const { return false; }
  // Whether the CUDA backend's chunked KDA kernel takes a head of K x V in chunks of `chunk` tokens (it
  // runs the token recurrence otherwise); the CPU's chunk-invariant mode mirrors the same split.
  static bool kda_chunk_kernel_fits(int64_t K, int64_t V, int chunk) { return K == 128 && V == 128 && chunk == 64; }

  // Empty string: supported; otherwise the reason it is not.
  virtual std::string supports(const std::string& op, const Shape& shape) const { return {}; }

  virtual void gemm(const ops::GemmParams& p) = 0;
  virtual void rmsnorm(const ops::RmsNormParams& p) = 0;
  virtual void l2norm(const ops::L2NormParams& p) = 0;
  virtual void short_conv(const ops::ShortConvParams& p) = 0;
  virtual void kda_gate(const ops::KdaGateParams& p) = 0;
  virtual void kda_chunk(const ops::KdaParams& p) = 0;       // chunkwise WY form (docs/MODEL.md §2.4)
  virtual void kda_recurrent(const ops::KdaParams& p) = 0;   // token recurrence (§2.3), the oracle
  virtual void kda_decode(const ops::KdaDecodeParams& p) = 0;
  virtual void mla_prefill(const ops::MlaPrefillParams& p) = 0;
  virtual void mla_decode(const ops::MlaDecodeParams& p) = 0;
  virtual void lse_merge(const ops::LseMergeParams& p) = 0;
  virtual void attnres_mix(const ops::AttnResMixParams& p) = 0;
  virtual void situ(const ops::SituParams& p) = 0;
  virtual void router_topk(const ops::RouterTopkParams& p) = 0;
  virtual void moe_experts(const ops::MoeExpertsParams& p) = 0;
  virtual void add(const ops::AddParams& p) = 0;
  virtual void sigmoid_mul(const ops::SigmoidMulParams& p) = 0;
  virtual void sigmoid(const Tensor& x, Tensor& y) = 0;      // element-wise, any shape
  virtual void embedding(const ops::EmbeddingParams& p) = 0;
  virtual void sample(const ops::SampleParams& p) = 0;

  // Data movement with host implementations (kernels/backend.cpp); device backends override.
  virtual void copy_cols(const ops::CopyColsParams& p);
  virtual void scatter_rows(const ops::ScatterRowsParams& p);
  virtual void head_gemm(const ops::HeadGemmParams& p);
  virtual void fill_uniform(const ops::FillUniformParams& p);

 protected:
  // fill_uniform's arguments every backend checks: y F32 or BF16, first >= 0.
  static void check_fill_uniform(const ops::FillUniformParams& p);
  // Elements [begin, end) of fill_uniform (each element depends only on its index), for a backend
  // that fills in parallel.
  static void fill_uniform_range(const ops::FillUniformParams& p, int64_t begin, int64_t end);
};

struct CpuBackendOptions {
  int threads = 0;  // 0: hardware concurrency (or K3_THREADS)
  // The CUDA batch-invariant mode's paths on the CPU (Backend::chunk_invariant: KDA's aligned-block
  // rule, with the chunked form where CUDA's chunked kernel runs and the recurrence elsewhere; MLA
  // prompt rows through mla_decode): their fp32 reference and a CPU test of the model logic behind them.
  // Off by default (the default forms are faster).
  bool chunk_invariant = false;
};

std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& opts = {});
// Returns null with a reason when the build has no CUDA backend or no GPU is visible.
std::unique_ptr<Backend> make_cuda_backend(int device, std::string* why_not);

}  // namespace k3
