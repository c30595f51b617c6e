#include <catch2/catch.hpp>
#include <cmath>
#include <random>

#include "common/core/tensor.h"

using namespace k3;

TEST_CASE("bf16 and f16 conversions round to nearest even and keep specials") {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-100.f, 100.f);
  for (int i = 0; i < 10000; ++i) {
    float x = u(rng);
    REQUIRE(std::fabs(bf16_to_f32(f32_to_bf16(x)) - x) <= std::fabs(x) * (1.f / 256));
    REQUIRE(std::fabs(f16_to_f32(f32_to_f16(x)) - x) <= std::fabs(x) * (1.f / 2048) + 1e-7f);
  }
  REQUIRE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  REQUIRE(std::isinf(f16_to_f32(f32_to_f16(1e6f))));
  REQUIRE(f16_to_f32(f32_to_f16(1e-6f)) == Approx(1e-6f).epsilon(0.05));  // subnormal half
  REQUIRE(bf16_to_f32(f32_to_bf16(1.0f)) == 1.0f);
}

TEST_CASE("tensor views share storage and check their shapes") {
  Tensor t = Tensor::zeros({4, 3});
  REQUIRE(t.numel() == 12);
  REQUIRE(t.nbytes() == 48);
  Tensor rows = t.slice_rows(1, 3);
  rows.f32()[0] = 7.f;
  REQUIRE(t.f32()[3] == 7.f);
  REQUIRE(t.reshape({12}).f32()[3] == 7.f);
  REQUIRE_THROWS_WITH(t.reshape({5}), Catch::Contains("reshape [4, 3] -> [5]"));
  REQUIRE_THROWS_AS(t.i32(), Error);
  Tensor c = t.clone();
  c.f32()[3] = 1.f;
  REQUIRE(t.f32()[3] == 7.f);
}

TEST_CASE("Result carries a value or a status") {
  Result<int> ok = 3;
  REQUIRE(ok.is_ok());
  REQUIRE(*ok == 3);
  Result<int> bad = invalid_argument("field x: must be positive");
  REQUIRE_FALSE(bad.is_ok());
  REQUIRE(bad.status().message() == "field x: must be positive");
  REQUIRE_THROWS_WITH(bad.value(), Catch::Contains("field x"));
  REQUIRE(dtype_from_name("BF16").value() == DType::BF16);
  REQUIRE_FALSE(dtype_from_name("F8").is_ok());
}
