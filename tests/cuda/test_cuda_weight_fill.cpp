// Generated weights drawn on the GPU (Backend::fill_uniform) are the host generator's bits, and a
// synthetic model uploaded to the GPU holds the tensors k3-genweights would write (bf16).
#include <catch2/catch.hpp>

#include <cstring>

#include "common/model/weights.h"
#include "common/model/weights_init.h"
#include "engine/model.h"
#include "tests/cuda/cuda_test_util.h"

using namespace k3;

TEST_CASE("fill_uniform on the GPU equals the host generator bit for bit", "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  for (const bool round : {true, false})
    for (const DType dt : {DType::BF16, DType::F32}) {
      INFO("round_to_bf16 " << round << ", dtype " << dtype_name(dt));
      const Shape shape{3001, 517};  // odd sizes: the grid-stride tail
      const ops::FillUniformParams host_p{.y = Tensor::zeros(shape, dt), .seed = 0x1234abcd9876ull, .scale = 3.1e-7f,
                                          .round_to_bf16 = round};
      bk.cpu->fill_uniform(host_p);
      Tensor dev = bk.gpu->alloc(shape, dt);
      bk.gpu->fill_uniform({.y = dev, .seed = host_p.seed, .scale = host_p.scale, .round_to_bf16 = round});
      const Tensor back = bk.gpu->to_host(dev);
      const Tensor want = host_p.y.to_f32();
      REQUIRE(back.to_f32().numel() == want.numel());
      CHECK(std::memcmp(back.to_f32().data(), want.data(), want.nbytes()) == 0);
      // Rows [1000, 2001) drawn alone from their first element: the whole draw's rows.
      Tensor rows = bk.gpu->alloc({1001, 517}, dt);
      bk.gpu->fill_uniform({.y = rows, .seed = host_p.seed, .scale = host_p.scale, .round_to_bf16 = round,
                            .first = 1000 * 517});
      const Tensor rows_back = bk.gpu->to_host(rows).to_f32();
      CHECK(std::memcmp(rows_back.data(), want.f32() + 1000 * 517, rows_back.nbytes()) == 0);
    }
}

TEST_CASE("a synthetic model's weights on the GPU are random_tensor's bf16 values", "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  const ModelConfig cfg = load_model_config_of("synthetic:kimi-linear-tiny:5").value();
  const WeightStore store = load_weights("synthetic:kimi-linear-tiny:5", cfg).value();
  // The uploaded expert stack and lm_head against the host draw of the same names.
  for (const std::string name : {"lm_head.weight", "model.layers.2.block_sparse_moe.experts.3.w2.weight",
                                 "model.layers.1.self_attn.k_proj.weight"}) {
    INFO(name);
    TensorSpec spec;
    for (const TensorSpec& s : expected_tensors(cfg))
      if (s.name == name) spec = s;
    const auto draw = uniform_draw(cfg, spec, 5);
    REQUIRE(draw.has_value());
    Tensor dev = bk.gpu->alloc(spec.shape, DType::BF16);
    bk.gpu->fill_uniform({.y = dev, .seed = draw->seed, .scale = draw->scale, .round_to_bf16 = true});
    const Tensor got = bk.gpu->to_host(dev).to_f32();
    const Tensor want = random_tensor(cfg, spec, 5, DType::BF16).to_f32();
    CHECK(std::memcmp(got.data(), want.data(), want.nbytes()) == 0);
  }
  // The whole model uploads through the device fill (a smoke check that every tensor is covered).
  CHECK(Model::create(*bk.gpu, cfg, store).is_ok());
}
