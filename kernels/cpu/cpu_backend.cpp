// The CPU backend: fp32 host tensors (I32 for indices), our own row-independent GEMM, and a thread
// pool owned by the instance. Every op is bitwise deterministic for any thread count.
#include <cstring>
#include <set>

#include "kernels/backend.h"
#include "kernels/cpu/check.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/thread_pool.h"

namespace k3 {
namespace {

class CpuBackend final : public Backend {
 public:
  CpuBackend(int threads, bool chunk_invariant) : chunk_invariant_(chunk_invariant), pool_(threads) {}

  BackendKind kind() const override { return BackendKind::Cpu; }
  const char* name() const override { return "cpu"; }
  DType compute_dtype() const override { return DType::F32; }

  Tensor alloc(const Shape& shape, DType dtype) override { return Tensor::zeros(shape, dtype); }

  // Host copies; BF16/F16 widen to F32 (the CPU backend computes in F32 only).
  Tensor to_host(const Tensor& t) override {
    K3_CHECK(t.device() == Device::Cpu, "cpu backend to_host: tensor is not on the host");
    if (t.dtype() == DType::BF16 || t.dtype() == DType::F16) return t.to_f32();
    return t.clone();
  }

  Tensor from_host(const Tensor& host, DType dtype) override {
    K3_CHECK(host.device() == Device::Cpu, "cpu backend from_host: tensor is not on the host");
    if (host.dtype() == dtype) return host.clone();
    if (dtype == DType::F32 && (host.dtype() == DType::BF16 || host.dtype() == DType::F16)) return widen(host);
    throw Error(std::string("cpu backend from_host: cannot convert ") + dtype_name(host.dtype()) + " to " +
                dtype_name(dtype));
  }

  void copy(const Tensor& src, Tensor& dst) override {
    K3_CHECK(src.dtype() == dst.dtype() && src.numel() == dst.numel(),
             "cpu backend copy: src " + shape_str(src.shape()) + " " + dtype_name(src.dtype()) + " vs dst " +
                 shape_str(dst.shape()) + " " + dtype_name(dst.dtype()));
    if (src.nbytes() && src.data() != dst.data()) std::memmove(dst.data(), src.data(), src.nbytes());
  }

  std::string supports(const std::string& op, const Shape&) const override {
    static const std::set<std::string> kOps = {
        "gemm", "rmsnorm", "l2norm", "short_conv", "kda_gate", "kda_chunk", "kda_recurrent", "kda_decode",
        "mla_prefill", "mla_decode", "lse_merge", "attnres_mix", "situ", "router_topk", "moe_experts",
        "add", "sigmoid_mul", "sigmoid", "embedding", "sample", "kda_chunk_checkpoints"};
    return kOps.count(op) ? std::string() : "cpu backend: unknown op '" + op + "'";
  }

  void gemm(const ops::GemmParams& p) override { cpu::gemm(pool_, p); }
  void rmsnorm(const ops::RmsNormParams& p) override { cpu::rmsnorm(pool_, p); }
  void l2norm(const ops::L2NormParams& p) override { cpu::l2norm(pool_, p); }
  void short_conv(const ops::ShortConvParams& p) override { cpu::short_conv(pool_, p); }
  void kda_gate(const ops::KdaGateParams& p) override { cpu::kda_gate(pool_, p); }
  bool chunk_invariant() const override { return chunk_invariant_; }
  // Chunk-invariant: the forms the CUDA backend runs in that mode, as their fp32 reference. The engine
  // sends only whole 64-token blocks at absolute multiples of 64 here (engine/kda_heads.h); the chunked
  // form takes them where CUDA's chunked kernel would (K = V = 128, 64-token chunks), the recurrence
  // elsewhere.
  void kda_chunk(const ops::KdaParams& p) override {
    const bool chunked_on_cuda = p.q.ndim() == 3 && p.v.ndim() == 3 &&
                                 kda_chunk_kernel_fits(p.q.dim(2), p.v.dim(2), p.chunk_size);
    if (chunk_invariant_ && !chunked_on_cuda) cpu::kda_recurrent(pool_, p);
    else cpu::kda_chunk(pool_, p);
  }
  void kda_recurrent(const ops::KdaParams& p) override { cpu::kda_recurrent(pool_, p); }
  void kda_decode(const ops::KdaDecodeParams& p) override { cpu::kda_decode(pool_, p); }
  void mla_prefill(const ops::MlaPrefillParams& p) override { cpu::mla_prefill(pool_, p); }
  void mla_decode(const ops::MlaDecodeParams& p) override { cpu::mla_decode(pool_, p); }
  void lse_merge(const ops::LseMergeParams& p) override { cpu::lse_merge(pool_, p); }
  void attnres_mix(const ops::AttnResMixParams& p) override { cpu::attnres_mix(pool_, p); }
  void situ(const ops::SituParams& p) override { cpu::situ(pool_, p); }
  void router_topk(const ops::RouterTopkParams& p) override { cpu::router_topk(pool_, p); }
  void moe_experts(const ops::MoeExpertsParams& p) override { cpu::moe_experts(pool_, p); }
  void add(const ops::AddParams& p) override { cpu::add(pool_, p); }
  void sigmoid_mul(const ops::SigmoidMulParams& p) override { cpu::sigmoid_mul(pool_, p); }
  void sigmoid(const Tensor& x, Tensor& y) override { cpu::sigmoid(pool_, x, y); }
  void embedding(const ops::EmbeddingParams& p) override { cpu::embedding(pool_, p); }
  void sample(const ops::SampleParams& p) override { cpu::sample(pool_, p); }

  // Weight set-up in parallel: a model's worth of elements (billions for the wider presets) would
  // otherwise be drawn or widened by one thread. Element-wise, so any split gives the same bits.
  void fill_uniform(const ops::FillUniformParams& p) override {
    K3_CHECK(p.y.device() == Device::Cpu, "fill_uniform: y is not a host tensor");
    check_fill_uniform(p);
    pool_.parallel_for(p.y.numel(), [&](int64_t i0, int64_t i1) { fill_uniform_range(p, i0, i1); }, kFillGrain);
  }

 private:
  static constexpr int64_t kFillGrain = 1 << 16;

  // BF16/F16 -> F32, as Tensor::to_f32 (the same conversion per element), split over the pool.
  Tensor widen(const Tensor& host) {
    Tensor t = Tensor::zeros(host.shape(), DType::F32);
    const auto* in = static_cast<const uint16_t*>(host.data());
    float* out = t.f32();
    const bool bf16 = host.dtype() == DType::BF16;
    pool_.parallel_for(host.numel(), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) out[i] = bf16 ? bf16_to_f32(in[i]) : f16_to_f32(in[i]);
    }, kFillGrain);
    return t;
  }

  bool chunk_invariant_;
  cpu::ThreadPool pool_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& opts) {
  return std::make_unique<CpuBackend>(cpu::resolve_thread_count(opts.threads), opts.chunk_invariant);
}

}  // namespace k3
