// CudaBackend: validation at the host boundary (kernels/cuda/arg_checks.h: every error names the op
// and the field), then one launcher per op (kernels/cuda/launch.h). The attention-family ops are in
// cuda_backend_attention.cpp.
#include "kernels/cuda/cuda_backend.h"

#include <cmath>
#include <cstring>
#include <set>

#include "kernels/cuda/arg_checks.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm_fixed.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/tensor_map.h"

namespace k3 {
namespace cuda {

using namespace args;

CudaBackend::CudaBackend(int device) : device_(device) {
  K3_CUDA_OK(cudaSetDevice(device));
  cudaDeviceProp prop{};
  K3_CUDA_OK(cudaGetDeviceProperties(&prop, device));
  num_sms_ = prop.multiProcessorCount;
  device_name_ = prop.name;
  stream_owner_ = std::make_shared<Stream>();
  K3_CUDA_OK(cudaStreamCreateWithFlags(&stream_owner_->stream, cudaStreamNonBlocking));
  stream_ = stream_owner_->stream;
  // Activations are allocated and freed per op: keep freed blocks in the pool instead of returning
  // them to the driver at every synchronization (the default threshold of 0 would).
  cudaMemPool_t pool = nullptr;
  K3_CUDA_OK(cudaDeviceGetDefaultMemPool(&pool, device));
  uint64_t keep = UINT64_MAX;
  K3_CUDA_OK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  gemm_ = std::make_unique<CublasLtGemm>();
  host_ = make_cpu_backend({1});
  load_tensor_map_encoder();  // MLA decode's TMA loads encode a tensor map per call
}

CudaBackend::Stream::~Stream() {
  if (stream) {
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
  }
}

CudaBackend::~CudaBackend() {
  if (stream_) cudaStreamSynchronize(stream_);
  gemm_.reset();
}

Tensor CudaBackend::alloc(const Shape& shape, DType dtype) {
  const size_t bytes = size_t(shape_numel(shape)) * dtype_size(dtype);
  if (bytes == 0) return Tensor::view(nullptr, shape, dtype, Device::Cuda);
  // Stream-ordered: no device-wide synchronization per allocation or free (cudaMalloc/cudaFree would
  // serialize every op of a forward with the host).
  void* p = nullptr;
  K3_CUDA_OK(cudaMallocAsync(&p, bytes, stream_));
  std::shared_ptr<void> owner(p, [s = stream_owner_](void* q) { cudaFreeAsync(q, s->stream); });
  K3_CUDA_OK(cudaMemsetAsync(p, 0, bytes, stream_));
  return Tensor::view(p, shape, dtype, Device::Cuda, owner);
}

Tensor CudaBackend::to_host(const Tensor& t) {
  if (t.device() == Device::Cpu) return t.dtype() == DType::BF16 || t.dtype() == DType::F16 ? t.to_f32() : t.clone();
  Tensor h = Tensor::zeros(t.shape(), t.dtype());
  if (t.nbytes()) {
    K3_CUDA_OK(cudaMemcpyAsync(h.data(), t.data(), t.nbytes(), cudaMemcpyDeviceToHost, stream_));
    K3_CUDA_OK(cudaStreamSynchronize(stream_));
  }
  return t.dtype() == DType::BF16 || t.dtype() == DType::F16 ? h.to_f32() : h;
}

Tensor CudaBackend::from_host(const Tensor& host, DType dtype) {
  K3_CHECK(host.device() == Device::Cpu, "cuda backend from_host: tensor is not on the host");
  Tensor staged;
  if (host.dtype() == dtype) {
    staged = host;
  } else if (dtype == DType::BF16 && host.dtype() == DType::F32) {
    staged = Tensor::zeros(host.shape(), DType::BF16);
    const float* s = host.ptr<const float>();
    uint16_t* d = staged.ptr<uint16_t>();
    for (int64_t i = 0; i < host.numel(); ++i) d[i] = f32_to_bf16(s[i]);
  } else if (dtype == DType::F32 && (host.dtype() == DType::BF16 || host.dtype() == DType::F16)) {
    staged = host.to_f32();
  } else {
    throw Error(std::string("cuda backend from_host: cannot convert ") + dtype_name(host.dtype()) + " to " +
                dtype_name(dtype));
  }
  Tensor d = alloc(host.shape(), dtype);
  if (d.nbytes()) {
    // No stream sync: `staged` is pageable host memory, which the driver has consumed (copied to its
    // own staging) by the time an H2D cudaMemcpyAsync returns, so it may die at return. A sync here
    // cost a device drain per small upload (slots, page ids: several per layer in a decode step).
    K3_CUDA_OK(cudaMemcpyAsync(d.data(), staged.data(), d.nbytes(), cudaMemcpyHostToDevice, stream_));
  }
  return d;
}

void CudaBackend::copy(const Tensor& src, Tensor& dst) {
  K3_CHECK(src.dtype() == dst.dtype() && src.numel() == dst.numel(),
           "cuda backend copy: src " + shape_str(src.shape()) + " " + dtype_name(src.dtype()) + " vs dst " +
               shape_str(dst.shape()) + " " + dtype_name(dst.dtype()));
  if (src.nbytes() == 0 || src.data() == dst.data()) return;
  K3_CUDA_OK(cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDefault, stream_));
}

void CudaBackend::synchronize() { K3_CUDA_OK(cudaStreamSynchronize(stream_)); }

void CudaBackend::zero(Tensor& t) {
  need_device("zero", "t", t);
  if (t.nbytes()) K3_CUDA_OK(cudaMemsetAsync(t.data(), 0, t.nbytes(), stream_));
}

void CudaBackend::gemm_fixed(const FixedGemmArgs& a) {
  const FixedGemmPlan plan = plan_gemm_fixed(a, num_sms_);
  launch_gemm_fixed(a, plan, plan.workspace_bytes ? grow(gemm_work_, plan.workspace_bytes) : nullptr, stream_);
}

void* CudaBackend::grow(DeviceBuffer& buf, size_t bytes) {
  if (bytes > buf.bytes()) ++epoch_;
  return buf.ensure(bytes);
}

std::string CudaBackend::supports(const std::string& op, const Shape& shape) const {
  static const std::set<std::string> kOps = {
      "gemm", "rmsnorm", "l2norm", "short_conv", "kda_gate", "kda_chunk", "kda_recurrent", "kda_decode",
      "mla_prefill", "mla_decode", "lse_merge", "attnres_mix", "situ", "router_topk", "moe_experts", "add",
      "sigmoid_mul", "sigmoid", "embedding", "sample", "copy_cols", "scatter_rows", "head_gemm",
      "fill_uniform", "kda_chunk_checkpoints"};
  if (!kOps.count(op)) return "cuda backend: unknown op '" + op + "'";
  if (op == "kda_decode" && !shape.empty() && shape.back() != 64 && shape.back() != 128)
    return "cuda backend: kda_decode needs head dim 64 or 128";
  return {};
}

std::vector<const int32_t*> CudaBackend::device_ints(std::span<const Tensor* const> ts) {
  std::vector<const int32_t*> out;
  std::vector<int32_t> staged;
  std::vector<std::pair<size_t, size_t>> where;  // (index in out, offset in staged)
  for (const Tensor* t : ts) {
    if (t->device() == Device::Cuda || t->numel() == 0) {
      out.push_back(t->ptr<const int32_t>());
    } else {
      where.push_back({out.size(), staged.size()});
      out.push_back(nullptr);
      staged.insert(staged.end(), t->ptr<const int32_t>(), t->ptr<const int32_t>() + t->numel());
    }
  }
  if (!staged.empty()) {
    auto* d = static_cast<int32_t*>(ints_.ensure(staged.size() * 4));
    K3_CUDA_OK(cudaMemcpyAsync(d, staged.data(), staged.size() * 4, cudaMemcpyHostToDevice, stream_));  // pageable: no sync (from_host)
    for (auto [i, off] : where) out[i] = d + off;
  }
  return out;
}

void CudaBackend::gemm(const ops::GemmParams& p) {
  const char* op = "gemm";
  bf16(op, "x", p.x);
  bf16(op, "w", p.w);
  fin(op, "y", p.y, 2);
  K3_CHECK(p.x.ndim() == 2 && p.w.ndim() == 2, "gemm: x and w must be 2-D");
  const int64_t M = p.x.dim(0), K = p.x.dim(1), N = p.w.dim(0);
  need_shape(op, "w", p.w, {N, K});
  need_shape(op, "y", p.y, {M, N});
  if (K == 0) {
    K3_CHECK(p.beta == 0.f, "gemm: K = 0 with beta != 0 is not supported");
    if (p.y.nbytes()) K3_CUDA_OK(cudaMemsetAsync(p.y.data(), 0, p.y.nbytes(), stream_));
    return;
  }
  if (batch_invariant_) {
    gemm_fixed({.x = p.x.data(), .w = p.w.data(), .y = fout(op, "y", p.y), .M = M, .N = N, .K = K, .ldx = K, .ldw = K,
                .ldy = N, .alpha = p.alpha, .beta = p.beta});
    return;
  }
  GemmShape s{.M = M, .N = N, .K = K, .ldx = K, .ldw = K, .ldy = N, .y_f32 = p.y.dtype() == DType::F32};
  gemm_->run(s, p.x.data(), p.w.data(), p.y.data(), p.alpha, p.beta, stream_);
}

void CudaBackend::fill_uniform(const ops::FillUniformParams& p) {
  check_fill_uniform(p);
  launch_fill_uniform(fout("fill_uniform", "y", p.y), p.y.numel(), p.first, p.seed, p.scale, p.round_to_bf16, stream_);
}

void CudaBackend::head_gemm(const ops::HeadGemmParams& p) {
  const char* op = "head_gemm";
  bf16(op, "x", p.x);
  bf16(op, "w", p.w);
  fin(op, "y", p.y, 3);
  K3_CHECK(p.x.ndim() == 3 && p.w.ndim() == 3, "head_gemm: x and w must be 3-D");
  const int64_t M = p.x.dim(0), H = p.x.dim(1), K = p.x.dim(2), N = p.w.dim(1);
  need_shape(op, "w", p.w, {H, N, K});
  need_shape(op, "y", p.y, {M, H, N});
  if (batch_invariant_) {
    gemm_fixed({.x = p.x.data(), .w = p.w.data(), .y = fout(op, "y", p.y), .M = M, .N = N, .K = K, .ldx = H * K,
                .ldw = K, .ldy = H * N, .batch = H, .stride_x = K, .stride_w = N * K, .stride_y = N});
    return;
  }
  GemmShape s{.M = M, .N = N, .K = K, .ldx = H * K, .ldw = K, .ldy = H * N, .batch = H, .stride_x = K,
              .stride_w = N * K, .stride_y = N, .y_f32 = p.y.dtype() == DType::F32};
  gemm_->run(s, p.x.data(), p.w.data(), p.y.data(), 1.f, 0.f, stream_);
}

void CudaBackend::rmsnorm(const ops::RmsNormParams& p) {
  const char* op = "rmsnorm";
  const FIn x = fin(op, "x", p.x, 2);
  const int64_t M = p.x.dim(0), D = p.x.dim(1);
  need_shape(op, "y", p.y, {M, D});
  FIn w{};
  if (!p.w.empty()) {
    w = fin(op, "w", p.w);
    need_shape(op, "w", p.w, {D});
  }
  launch_rmsnorm(x, w, fout(op, "y", p.y), M, int(D), p.eps, stream_);
}

void CudaBackend::l2norm(const ops::L2NormParams& p) {
  const char* op = "l2norm";
  const FIn x = fin(op, "x", p.x, 2);
  need_shape(op, "y", p.y, p.x.shape());
  launch_l2norm(x, fout(op, "y", p.y), p.x.dim(0), int(p.x.dim(1)), p.eps, p.scale, stream_);
}

void CudaBackend::short_conv(const ops::ShortConvParams& p) {
  const char* op = "short_conv";
  const FIn x = fin(op, "x", p.x, 2);
  const int64_t T = p.x.dim(0), C = p.x.dim(1);
  const FIn w = fin(op, "w", p.w, 2);
  const int64_t W = p.w.dim(1);
  need_shape(op, "w", p.w, {C, W});
  const FOut cache = fout(op, "cache", p.cache, 3);
  K3_CHECK(p.cache.dim(1) == W - 1 && p.cache.dim(2) == C,
           "short_conv: cache: expected [slots, " + std::to_string(W - 1) + ", " + std::to_string(C) + "], got " +
               shape_str(p.cache.shape()));
  need_shape(op, "y", p.y, {T, C});
  K3_CHECK(p.y.data() != p.x.data() || T == 0, "short_conv: y must not alias x");
  const int64_t N = p.slots.numel();
  need_i32(op, "slots", p.slots, N);
  need_i32(op, "cu_seqlens", p.cu_seqlens, N + 1);
  const auto ptrs = device_ints({&p.slots, &p.cu_seqlens});
  launch_short_conv(x, w, cache, ptrs[0], ptrs[1], fout(op, "y", p.y), int(N), int(C), int(W), stream_);
}

void CudaBackend::attnres_mix(const ops::AttnResMixParams& p) {
  const char* op = "attnres_mix";
  K3_CHECK(!p.candidates.empty() && int(p.candidates.size()) <= kMaxAttnResCandidates,
           "attnres_mix: candidates: expected 1.." + std::to_string(kMaxAttnResCandidates) + ", got " +
               std::to_string(p.candidates.size()));
  AttnResCandidates c;
  c.m = int(p.candidates.size());
  const Shape& shape = p.candidates[0].shape();
  K3_CHECK(shape.size() == 2, "attnres_mix: candidates must be [M, D]");
  for (int j = 0; j < c.m; ++j) {
    c.c[j] = fin(op, "candidates[j]", p.candidates[j], 2);
    need_shape(op, "candidates[j]", p.candidates[j], shape);
  }
  need_shape(op, "query", p.query, {shape[1]});
  need_shape(op, "y", p.y, shape);
  launch_attnres_mix(c, f32(op, "query", p.query), fout(op, "y", p.y), shape[0], int(shape[1]), p.eps, stream_);
}

void CudaBackend::situ(const ops::SituParams& p) {
  const char* op = "situ";
  need_shape(op, "u", p.u, p.g.shape());
  need_shape(op, "y", p.y, p.g.shape());
  launch_situ(fin(op, "g", p.g), fin(op, "u", p.u), fout(op, "y", p.y), p.g.numel(), p.beta, p.beta_linear,
              p.act == ops::GluAct::Silu, stream_);
}

void CudaBackend::router_topk(const ops::RouterTopkParams& p) {
  const char* op = "router_topk";
  K3_CHECK(p.logits.ndim() == 2, "router_topk: logits must be [M, E]");
  const int64_t M = p.logits.dim(0), E = p.logits.dim(1);
  K3_CHECK(p.k > 0 && p.k <= E && p.k <= 64, "router_topk: k must be in 1..min(E, 64)");
  need_shape(op, "bias", p.bias, {E});
  need_shape(op, "ids", p.ids, {M, p.k});
  need_i32(op, "ids", p.ids, M * p.k);
  need_device(op, "ids", p.ids);
  need_shape(op, "weights", p.weights, {M, p.k});
  launch_router_topk(f32(op, "logits", p.logits), f32(op, "bias", p.bias), p.ids.ptr<int32_t>(),
                     f32(op, "weights", p.weights), M, int(E), p.k, p.scale, stream_);
}

void CudaBackend::moe_experts(const ops::MoeExpertsParams& p) {
  const char* op = "moe_experts";
  MoeArgs a;
  a.z = fin(op, "z", p.z, 2);
  a.M = int(p.z.dim(0));
  a.Dl = int(p.z.dim(1));
  K3_CHECK(p.ids.ndim() == 2 && p.ids.dim(0) == a.M, "moe_experts: ids must be [M, k]");
  a.k = int(p.ids.dim(1));
  need_i32(op, "ids", p.ids, int64_t(a.M) * a.k);
  need_device(op, "ids", p.ids);
  a.ids = p.ids.ptr<const int32_t>();
  need_shape(op, "weights", p.weights, {a.M, a.k});
  a.weights = f32(op, "weights", p.weights);
  a.w1 = fin(op, "w1", p.w1, 3);
  a.E = int(p.w1.dim(0));
  a.F = int(p.w1.dim(1));
  need_shape(op, "w1", p.w1, {a.E, a.F, a.Dl});
  a.w3 = fin(op, "w3", p.w3);
  need_shape(op, "w3", p.w3, {a.E, a.F, a.Dl});
  a.w2 = fin(op, "w2", p.w2);
  need_shape(op, "w2", p.w2, {a.E, a.Dl, a.F});
  a.y = fout(op, "y", p.y);
  need_shape(op, "y", p.y, {a.M, a.Dl});
  a.beta = p.beta;
  a.beta_linear = p.beta_linear;
  // Few pairs (decode): the per-row kernel unless the caller asked for batch invariance (its sums run
  // in another order than the grouped GEMM's, so a row's value would depend on the batch size).
  a.silu = p.act == ops::GluAct::Silu;
  if (!batch_invariant_ && moe_gemv_supported(a)) launch_moe_gemv(a, grow(moe_work_, moe_gemv_workspace_bytes(a)), stream_);
  else if (moe_grouped_supported(a)) launch_moe_grouped(a, grow(moe_work_, moe_grouped_workspace_bytes(a)), num_sms_, moe_grouped_form_, stream_);
  else launch_moe_experts(a, stream_);
}

void CudaBackend::add(const ops::AddParams& p) {
  need_shape("add", "b", p.b, p.a.shape());
  need_shape("add", "y", p.y, p.a.shape());
  launch_add(fin("add", "a", p.a), fin("add", "b", p.b), fout("add", "y", p.y), p.a.numel(), stream_);
}

void CudaBackend::sigmoid_mul(const ops::SigmoidMulParams& p) {
  const char* op = "sigmoid_mul";
  need_shape(op, "gate", p.gate, p.x.shape());
  need_shape(op, "y", p.y, p.x.shape());
  launch_sigmoid_mul(fin(op, "x", p.x), fin(op, "gate", p.gate), fout(op, "y", p.y), p.x.numel(), stream_);
}

void CudaBackend::sigmoid(const Tensor& x, Tensor& y) {
  K3_CHECK(x.numel() == y.numel(), "sigmoid: x and y sizes differ");
  launch_sigmoid(fin("sigmoid", "x", x), fout("sigmoid", "y", y), x.numel(), stream_);
}

void CudaBackend::embedding(const ops::EmbeddingParams& p) {
  const char* op = "embedding";
  const FIn table = fin(op, "table", p.table, 2);
  const int64_t M = p.ids.numel(), D = p.table.dim(1);
  need_i32(op, "ids", p.ids, M);
  need_shape(op, "y", p.y, {M, D});
  if (p.ids.device() == Device::Cpu)
    for (int64_t i = 0; i < M; ++i)
      K3_CHECK(p.ids.ptr<const int32_t>()[i] >= 0 && p.ids.ptr<const int32_t>()[i] < p.table.dim(0),
               "embedding: ids[" + std::to_string(i) + "] out of range");
  const int32_t* ids = device_ints({&p.ids})[0];
  launch_embedding(table, ids, fout(op, "y", p.y), M, D, p.table.dim(0), stream_);
}

// Greedy rows are decided on the device and only their ids come back; a row with temperature > 0
// brings its logits row to the host sampler (the CPU rule, bit for bit: same order, same uniform).
void CudaBackend::sample(const ops::SampleParams& p) {
  if (p.logits.device() == Device::Cpu) {
    host_->sample(p);
    return;
  }
  const char* op = "sample";
  const int64_t B = p.logits.dim(0), V = p.logits.ndim() == 2 ? p.logits.dim(1) : 0;
  K3_CHECK(p.logits.ndim() == 2 && V >= 1, "sample: logits must be [B, V] with V >= 1");
  f32(op, "logits", p.logits);
  K3_CHECK(static_cast<int64_t>(p.rows.size()) == B, "sample: rows: expected " + std::to_string(B) + " entries");
  K3_CHECK(p.out != nullptr, "sample: out: must not be null");
  for (int64_t b = 0; b < B; ++b) {
    const ops::SamplingRow& r = p.rows[b];
    const std::string at = "sample: rows[" + std::to_string(b) + "].";
    K3_CHECK(std::isfinite(r.temperature) && r.temperature >= 0.f, at + "temperature must be finite and >= 0");
    K3_CHECK(r.top_k >= 0, at + "top_k must be >= 0");
    K3_CHECK(r.top_p > 0.f && r.top_p <= 1.f, at + "top_p must be in (0, 1]");
    K3_CHECK(std::fabs(r.presence_penalty) <= 2.f && std::fabs(r.frequency_penalty) <= 2.f,
             at + "presence_penalty and frequency_penalty must be in [-2, 2]");
  }
  auto* ids = static_cast<int32_t*>(sample_ids_.ensure(size_t(std::max<int64_t>(B, 1)) * 4));
  launch_argmax_rows(static_cast<const float*>(p.logits.data()), B, V, ids, stream_);
  p.out->assign(B, 0);
  K3_CUDA_OK(cudaMemcpyAsync(p.out->data(), ids, size_t(B) * 4, cudaMemcpyDeviceToHost, stream_));
  K3_CUDA_OK(cudaStreamSynchronize(stream_));
  for (int64_t b = 0; b < B; ++b) {  // drawn, biased and penalized rows on the host (its rule, the same bits)
    if (p.rows[b].temperature <= 0.f && !ops::adjusted(p.rows[b])) continue;
    std::vector<int32_t> one;
    host_->sample({.logits = to_host(p.logits.slice_rows(b, b + 1)), .rows = {p.rows[b]}, .out = &one});
    (*p.out)[b] = one.at(0);
  }
}

void CudaBackend::copy_cols(const ops::CopyColsParams& p) {
  const char* op = "copy_cols";
  need_device(op, "src", p.src);
  need_device(op, "dst", p.dst);
  K3_CHECK(p.src.ndim() == 2 && p.dst.ndim() == 2, "copy_cols: src and dst must be 2-D");
  K3_CHECK(p.src.dtype() == p.dst.dtype(), "copy_cols: src and dst dtypes differ");
  const int64_t ns = p.src.dim(1), nd = p.dst.dim(1);
  const int64_t n = p.ncols < 0 ? ns - p.src_col : p.ncols;
  K3_CHECK(p.src_row_repeat >= 1 && p.dst.dim(0) == p.src.dim(0) * p.src_row_repeat,
           "copy_cols: dst rows must equal src rows x repeat");
  K3_CHECK(p.src_col >= 0 && p.src_col + n <= ns && p.dst_col >= 0 && p.dst_col + n <= nd,
           "copy_cols: column range out of bounds");
  const int elem = int(dtype_size(p.src.dtype()));
  K3_CHECK(elem == 2 || elem == 4, "copy_cols: element size must be 2 or 4 bytes");
  launch_copy_cols(p.src.data(), p.src.dim(0), ns, p.dst.data(), p.dst.dim(0), nd, p.src_col, p.dst_col, n,
                   p.src_row_repeat, elem, stream_);
}

void CudaBackend::scatter_rows(const ops::ScatterRowsParams& p) {
  const char* op = "scatter_rows";
  need_device(op, "src", p.src);
  need_device(op, "dst", p.dst);
  K3_CHECK(p.src.ndim() == 2 && p.dst.ndim() == 2 && p.src.dim(1) == p.dst.dim(1) && p.src.dtype() == p.dst.dtype(),
           "scatter_rows: src " + shape_str(p.src.shape()) + " and dst " + shape_str(p.dst.shape()) +
               " must agree in width and dtype");
  need_i32(op, "ids", p.ids, p.src.dim(0));
  if (p.ids.device() == Device::Cpu)
    for (int64_t r = 0; r < p.src.dim(0); ++r)
      K3_CHECK(p.ids.ptr<const int32_t>()[r] >= 0 && p.ids.ptr<const int32_t>()[r] < p.dst.dim(0),
               "scatter_rows: id " + std::to_string(p.ids.ptr<const int32_t>()[r]) + " out of range");
  const int32_t* ids = device_ints({&p.ids})[0];
  launch_scatter_rows(p.src.data(), ids, p.dst.data(), p.src.dim(0), int64_t(p.src.dim(1)) * dtype_size(p.src.dtype()),
                      stream_);
}

}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(int device, std::string* why_not) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    if (why_not) *why_not = std::string("no CUDA device visible: ") + (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return nullptr;
  }
  if (device < 0 || device >= count) {
    if (why_not) *why_not = "CUDA device " + std::to_string(device) + " out of range (have " + std::to_string(count) + ")";
    return nullptr;
  }
  try {
    return std::make_unique<cuda::CudaBackend>(device);
  } catch (const std::exception& ex) {
    if (why_not) *why_not = ex.what();
    return nullptr;
  }
}

}  // namespace k3
