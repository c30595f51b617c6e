// Tensor maps (kernels/cuda/tensor_map.h): shapes the TMA cannot copy are refused on the host with a
// message naming the argument, before the driver is asked (so these run without a GPU); on a GPU the
// shapes the KDA scans use encode.
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "common/core/status.h"
#include "kernels/cuda/tensor_map.h"
#include "tests/cuda/cuda_test_util.h"

using namespace k3;

namespace {
std::string refusal(auto&& make) {
  try {
    make();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("tensor map: shapes the copy engine cannot take are refused, naming the argument", "[cuda][plan]") {
  alignas(16) static float buf[64];
  void* base = buf;
  void* off = reinterpret_cast<char*>(buf) + 4;
  // fp32, 128B swizzle: boxes of 32 columns.
  CHECK_THAT(refusal([&] { cuda::make_f32_tensor_map_sw128(off, 128, 128, 32); }), Catch::Contains("16-byte aligned"));
  CHECK_THAT(refusal([&] { cuda::make_f32_tensor_map_sw128(base, 128, 126, 32); }), Catch::Contains("cols 126"));
  CHECK_THAT(refusal([&] { cuda::make_f32_tensor_map_sw128(base, 128, 16, 32); }), Catch::Contains("cols 16"));
  CHECK_THAT(refusal([&] { cuda::make_f32_tensor_map_sw128(base, 0, 128, 32); }), Catch::Contains("rows 0"));
  CHECK_THAT(refusal([&] { cuda::make_f32_tensor_map_sw128(base, 128, 128, 257); }), Catch::Contains("box_rows 257"));
  CHECK_THAT(refusal([&] { cuda::make_f32_tensor_map_sw128(base, int64_t(1) << 33, 128, 32); }),
             Catch::Contains("out of range"));
  // bf16: the swizzled box is 64 columns (128 bytes); a plain box a multiple of 8 up to 256.
  CHECK_THAT(refusal([&] { cuda::make_bf16_tensor_map(base, 64, 128, 32, 64, true); }),
             Catch::Contains("box_cols 32 is not 128 bytes"));
  CHECK_THAT(refusal([&] { cuda::make_bf16_tensor_map(base, 64, 128, 12, 64, false); }), Catch::Contains("box_cols 12"));
  CHECK_THAT(refusal([&] { cuda::make_bf16_tensor_map(base, 64, 100, 8, 64, false); }), Catch::Contains("cols 100"));
  CHECK_THAT(refusal([&] { cuda::make_bf16_tensor_map(base, 64, 64, 128, 64, false); }), Catch::Contains("box's 128"));
}

TEST_CASE("tensor map: the KDA scans' maps encode on the GPU", "[cuda]") {
  K3_GPU_OR_SKIP(bk);
  std::vector<float> host(size_t(4) * 128 * 128);
  auto& g = *bk.gpu;
  Tensor dev = g.from_host(Tensor::from_f32({4, 128, 128}, host), DType::F32);
  CHECK_NOTHROW(cuda::make_f32_tensor_map_sw128(dev.data(), 4 * 128, 128, 32));
  CHECK_NOTHROW(cuda::make_bf16_tensor_map(dev.data(), 4 * 128, 128, 64, 64, true));
  CHECK_NOTHROW(cuda::make_bf16_tensor_map(dev.data(), 4 * 128, 128, 32, 64, false));
}
