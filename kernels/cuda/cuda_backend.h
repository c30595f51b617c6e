// The CUDA backend: BF16 activations and weights, F32 KDA state, gates, beta, softmax statistics
// and router scores (kernels/ops.h). All work goes to one stream owned by the instance; ops never
// allocate their outputs, and decode-size ops (kda_decode, mla_decode, lse_merge and the simple
// kernels) only touch workspaces that were sized by an earlier call, so a decode step captures in
// a CUDA graph once it has run eagerly once.
#pragma once
#include <cuda_runtime.h>

#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/cublaslt_gemm.h"
#include "kernels/cuda/device_buffer.h"

namespace k3::cuda {

struct FixedGemmArgs;  // gemm_fixed.h

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device);
  ~CudaBackend() override;

  BackendKind kind() const override { return BackendKind::Cuda; }
  const char* name() const override { return "cuda"; }
  DType compute_dtype() const override { return DType::BF16; }

  Tensor alloc(const Shape& shape, DType dtype) override;
  Tensor to_host(const Tensor& t) override;
  Tensor from_host(const Tensor& host, DType dtype) override;
  void copy(const Tensor& src, Tensor& dst) override;
  void synchronize() override;
  void zero(Tensor& t) override;
  // cuda_graph.cpp: stream capture into a CUDA graph (the decode step, engine/decode_step.h).
  bool begin_capture(bool strict) override;
  std::unique_ptr<StepGraph> end_capture() override;
  void abandon_capture() override;
  uint64_t workspace_epoch() const override { return epoch_; }
  std::string supports(const std::string& op, const Shape& shape) const override;

  void gemm(const ops::GemmParams& p) override;
  void rmsnorm(const ops::RmsNormParams& p) override;
  void l2norm(const ops::L2NormParams& p) override;
  void short_conv(const ops::ShortConvParams& p) override;
  void kda_gate(const ops::KdaGateParams& p) override;
  void kda_chunk(const ops::KdaParams& p) override;
  void kda_recurrent(const ops::KdaParams& p) override;
  void kda_decode(const ops::KdaDecodeParams& p) override;
  void mla_prefill(const ops::MlaPrefillParams& p) override;
  void mla_decode(const ops::MlaDecodeParams& p) override;
  void lse_merge(const ops::LseMergeParams& p) override;
  void attnres_mix(const ops::AttnResMixParams& p) override;
  void situ(const ops::SituParams& p) override;
  void router_topk(const ops::RouterTopkParams& p) override;
  void moe_experts(const ops::MoeExpertsParams& p) override;
  void add(const ops::AddParams& p) override;
  void sigmoid_mul(const ops::SigmoidMulParams& p) override;
  void sigmoid(const Tensor& x, Tensor& y) override;
  void embedding(const ops::EmbeddingParams& p) override;
  void sample(const ops::SampleParams& p) override;
  void copy_cols(const ops::CopyColsParams& p) override;
  void scatter_rows(const ops::ScatterRowsParams& p) override;
  void head_gemm(const ops::HeadGemmParams& p) override;
  void fill_uniform(const ops::FillUniformParams& p) override;

  // Routes mla_decode with R = 512, Dr = 64, H >= 64 to the Hopper wgmma kernel (mla_decode_wgmma.cu;
  // on by default: 1.4x the mma.sync kernel at the K3 shape on the H200); false selects the mma.sync
  // kernel (mla_decode.cu), which also serves every other shape.
  void set_mla_decode_wgmma(bool on) { mla_wgmma_ = on; }
  // On: gemm and head_gemm use the fixed-order kernels (gemm_fixed.h) instead of cuBLASLt, and
  // mla_decode splits the context in pieces of kInvariantSplitTokens whatever the batch.
  void set_batch_invariant(bool on) override { batch_invariant_ = on; }
  // The batch-invariant split size of mla_decode in tokens (a multiple of 64; default
  // kInvariantSplitTokens). For measuring what the size costs; every rank and call of one model must
  // use one size, or their partials differ.
  void set_mla_decode_invariant_split(int tokens) {
    if (tokens < 64 || tokens % 64 != 0)
      throw Error("mla_decode: invariant split of " + std::to_string(tokens) + " tokens is not a positive multiple of 64");
    mla_invariant_split_ = tokens;
  }
  int mla_decode_invariant_split() const { return mla_invariant_split_; }
  // Batch-invariant mla_decode: how many of the fixed splits one block takes in turn (0, the
  // default: as many as make the plan's block count). The result is bitwise the same for every value;
  // tests hold it to show that.
  void set_mla_decode_splits_per_block(int n) {
    if (n < 0) throw Error("mla_decode: splits per block " + std::to_string(n) + " is negative");
    mla_splits_per_block_ = n;
  }
  bool batch_invariant() const override { return batch_invariant_; }
  // Batch-invariant mode is chunk-invariant too: kda_chunk runs one scan form for every grid (no split
  // scan), and the model (seeing chunk_invariant) gives it only whole 64-token blocks at absolute
  // multiples of 64, the other KDA rows and every decode token to kda_recurrent, and sends prompt rows
  // through mla_decode.
  bool chunk_invariant() const override { return batch_invariant_; }
  // In batch-invariant mode kda_decode rounds and sums as the separate steps do
  // (KdaDecodeArgs::as_steps), and the model takes it there while this switch is on (the default:
  // tests/cuda/test_cuda_kda_invariant.cpp holds it to the steps' bits on the H200). Off: decode
  // tokens take the separate steps, for the bench and that test.
  void set_kda_decode_matches_steps(bool on) { kda_decode_as_steps_ = on; }
  bool kda_decode_matches_steps() const override { return batch_invariant_ && kda_decode_as_steps_; }
  static constexpr int kInvariantSplitTokens = 1024;
  bool mla_decode_wgmma() const { return mla_wgmma_; }
  // The wgmma kernel's S = Q Kᵀ split over dims between its warpgroups (partials summed through
  // shared memory) instead of over tokens; for measuring the two against each other.
  void set_mla_decode_split_s(bool on) { mla_split_s_ = on; }
  // The wgmma kernel's L2 prefetch distance in 64-token tiles (default 0 = off: on the H200 a
  // distance of 2 or 4 was slower, docs/PERF.md; kept for measuring).
  void set_mla_decode_l2_prefetch(int tiles) { mla_l2_prefetch_ = tiles; }
  int mla_decode_l2_prefetch() const { return mla_l2_prefetch_; }
  // wgmma kernel: KV tiles by TMA bulk tensor copies (default on) or by per-thread cp.async.
  void set_mla_decode_tma(bool on) { mla_tma_ = on; }
  bool mla_decode_tma() const { return mla_tma_; }
  // wgmma kernel: lazy running max (the O rescale only when the max grows by more than 2^8; default on).
  void set_mla_decode_lazy_rescale(bool on) { mla_lazy_ = on; }
  bool mla_decode_lazy_rescale() const { return mla_lazy_; }
  // wgmma kernel: blocks of 32 heads in transposed form, no padded rows (MlaDecodeArgs::wgmma_t32:
  // 0 = 64-head blocks only, 1 = a last group of 1-32 heads as one 32-head block, 2 = all 32-head).
  void set_mla_decode_t32(int mode) {
    if (mode < 0 || mode > 2) throw Error("mla_decode: t32 mode " + std::to_string(mode) + " not in 0..2");
    mla_t32_ = mode;
  }
  int mla_decode_t32() const { return mla_t32_; }
  // wgmma kernel: blocks of 48 heads in transposed form and in a seesaw (MlaDecodeArgs::wgmma_t48: 0 =
  // never, 1 = always, 2 = when they pad fewer rows than 64-head blocks, as for H = 96).
  void set_mla_decode_t48(int mode) {
    if (mode < 0 || mode > 2) throw Error("mla_decode: t48 mode " + std::to_string(mode) + " not in 0..2");
    mla_t48_ = mode;
  }
  int mla_decode_t48() const { return mla_t48_; }
  // wgmma kernel: 64-head blocks with the warpgroups in a seesaw over pairs of tiles (default on: 3-13 %
  // faster than the lockstep form on the H200, docs/PERF.md; MlaDecodeArgs::wgmma_seesaw; takes
  // precedence over set_mla_decode_t32, and needs the TMA loads and S split over tokens).
  void set_mla_decode_seesaw(bool on) { mla_seesaw_ = on; }
  bool mla_decode_seesaw() const { return mla_seesaw_; }
  // With the seesaw: the block that keeps each warpgroup's P in registers and refills each half of a
  // stage when the warpgroup reading it is done; 0 = never, 1 = always, 2 = on long splits (the
  // default; MlaDecodeArgs::wgmma_seesaw_halves).
  void set_mla_decode_seesaw_halves(int mode) {
    if (mode < 0 || mode > 2) throw Error("mla_decode: seesaw halves mode " + std::to_string(mode) + " not in 0..2");
    mla_seesaw_halves_ = mode;
  }
  int mla_decode_seesaw_halves() const { return mla_seesaw_halves_; }
  // wgmma kernel: the head groups of a request as one thread-block cluster (MlaDecodeArgs::wgmma_cluster).
  void set_mla_decode_cluster(bool on) { mla_cluster_ = on; }
  bool mla_decode_cluster() const { return mla_cluster_; }
  // wgmma kernel: 64-head blocks of three warpgroups in fixed roles, scores and two output halves, over
  // three KV stages (MlaDecodeArgs::wgmma_roles; off by default).
  void set_mla_decode_roles(bool on) { mla_roles_ = on; }
  bool mla_decode_roles() const { return mla_roles_; }
  // mla_decode: cut the context into `n` splits of equal whole tiles, over the plan and over the
  // batch-invariant split size (0, the default: the plan decides). For measuring the plan's choices.
  void set_mla_decode_splits(int n) {
    if (n < 0 || n > 64) throw Error("mla_decode: forced split count " + std::to_string(n) + " not in 0..64");
    mla_splits_ = n;
  }
  int mla_decode_splits() const { return mla_splits_; }
  // kda_chunk: long sequences with few heads scanned as segments at once and fixed up
  // (kda_split_plan.h; default on), or each sequence as one chain of chunks.
  void set_kda_chunk_split(bool on) { kda_split_ = on; }
  bool kda_chunk_split() const { return kda_split_; }
  // kda_chunk: the scan's wide grid (>= 2 blocks of 32 rows per SM) on wgmma (KdaArgs::scan_wgmma,
  // default on: 7 % less prefill time at T = 8192, H = 96 on the H200) or on mma.sync.
  void set_kda_chunk_scan_wgmma(bool on) { kda_scan_wgmma_ = on; }
  // Rows of V per block of that scan: 64, 32 (three blocks per SM instead of two), 128 (a head per
  // block, four warpgroups sharing its tiles), or 0 (default):
  // 32 where its grid fits one wave, else 64 (kda_scan_form.h).
  void set_kda_chunk_scan_wg_rows(int rows) {
    if (rows != 0 && rows != 32 && rows != 64 && rows != 128)
      throw Error("kda_chunk: wgmma scan rows " + std::to_string(rows) +
                  " must be 0 (by the grid), 32, 64 or 128 (a head per block)");
    kda_scan_wg_rows_ = rows;
  }
  bool mla_decode_split_s() const { return mla_split_s_; }
  // moe_experts' grouped GEMMs (the batch-invariant path, and many pairs): 0 (default) the form by the
  // grid (narrow, deep tiles where the wide ones would leave SMs idle), 1 always wide, 2 always narrow.
  // Every form gives the same bits; tests hold each to show it, k3-bench to time them.
  void set_moe_grouped_form(int form) {
    if (form < 0 || form > 2) throw Error("moe_experts: grouped GEMM form " + std::to_string(form) + " not in 0..2");
    moe_grouped_form_ = form;
  }
  int moe_grouped_form() const { return moe_grouped_form_; }

  cudaStream_t stream() const { return stream_; }
  int num_sms() const { return num_sms_; }
  const std::string& device_name() const { return device_name_; }

 private:
  // Device pointers for I32 index tensors that may live on the host (staged through one upload).
  std::vector<const int32_t*> device_ints(std::span<const Tensor* const> ts);
  std::vector<const int32_t*> device_ints(std::initializer_list<const Tensor*> ts) {
    return device_ints(std::span<const Tensor* const>(ts.begin(), ts.size()));
  }
  // buf.ensure(bytes), bumping the workspace epoch when the buffer moves (graphs recorded before are
  // stale). Used for the buffers a decode step reads (MLA split partials, grouped MoE); the others
  // (staged indices, KDA chunk work, sampled ids) never appear in a recordable step.
  void* grow(DeviceBuffer& buf, size_t bytes);
  // The fixed-order GEMM of batch-invariant mode, planned for this GPU, its split partials in gemm_work_.
  void gemm_fixed(const FixedGemmArgs& a);

  int device_ = 0;
  int num_sms_ = 0;
  bool mla_wgmma_ = true;  // set_mla_decode_wgmma
  bool mla_split_s_ = false;  // set_mla_decode_split_s
  int mla_l2_prefetch_ = 0;  // set_mla_decode_l2_prefetch
  bool mla_tma_ = true;  // set_mla_decode_tma
  bool mla_lazy_ = true;  // set_mla_decode_lazy_rescale
  int mla_t32_ = 0;  // set_mla_decode_t32
  int mla_t48_ = 0;  // set_mla_decode_t48
  bool mla_roles_ = false;    // set_mla_decode_roles
  int moe_grouped_form_ = 0;  // set_moe_grouped_form
  bool mla_seesaw_ = true;  // set_mla_decode_seesaw
  int mla_seesaw_halves_ = 2;  // set_mla_decode_seesaw_halves
  bool mla_cluster_ = false;  // set_mla_decode_cluster
  int mla_splits_ = 0;  // set_mla_decode_splits
  int mla_invariant_split_ = kInvariantSplitTokens;  // set_mla_decode_invariant_split
  int mla_splits_per_block_ = 0;  // set_mla_decode_splits_per_block
  bool kda_split_ = true;  // set_kda_chunk_split
  bool kda_scan_wgmma_ = true;  // set_kda_chunk_scan_wgmma
  int kda_scan_wg_rows_ = 0;  // set_kda_chunk_scan_wg_rows
  bool batch_invariant_ = false;
  bool kda_decode_as_steps_ = true;  // set_kda_decode_matches_steps
  std::string device_name_;
  // The stream is shared with every tensor this backend allocates: their memory returns to the
  // stream-ordered pool (cudaFreeAsync) on this stream, even when a tensor outlives the backend.
  struct Stream {
    cudaStream_t stream = nullptr;
    ~Stream();
  };
  std::shared_ptr<Stream> stream_owner_;
  cudaStream_t stream_ = nullptr;  // stream_owner_->stream
  std::unique_ptr<CublasLtGemm> gemm_;  // created after cudaSetDevice
  DeviceBuffer work_;     // float workspaces (KDA chunk prefill)
  DeviceBuffer mla_work_; // MLA decode split partials (own buffer: a prefill does not move it)
  DeviceBuffer ints_;     // staged index arrays
  DeviceBuffer sample_ids_;  // sampled token ids of one step
  DeviceBuffer moe_work_;    // grouped-MoE routing tables and expert rows
  DeviceBuffer gemm_work_;   // fixed-order GEMM split partials (decode steps)
  uint64_t epoch_ = 0;       // workspace_epoch()
  uint64_t capture_epoch_ = 0;  // epoch_ when the current capture began
  std::unique_ptr<Backend> host_;  // the host sampler for rows with temperature > 0
};

}  // namespace k3::cuda
