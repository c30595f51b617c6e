// The op registry (name -> params over named tensors) and the k3-op tool: every registered op runs
// from named inputs + string attributes; errors name the op and the bad input/attribute; a file
// written by the safetensors writer goes through k3-op and matches the direct backend call.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>

#include "common/io/safetensors.h"
#include "common/io/safetensors_writer.h"
#include "kernels/op_registry.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/kernels/op_examples.h"
#include "tests/support/scratch_dir.h"

using namespace k3;
using k3::testing::ScratchDir;
using namespace k3::test;


TEST_CASE("every registered op runs by name, outputs all declared fields, and is thread-count invariant") {
  auto one = cpu_backend(1), four = cpu_backend(4);
  for (const auto& info : op_infos()) {
    std::mt19937 rng(61);
    auto [inputs, attrs] = example(info.name, rng);
    std::map<std::string, Tensor> out1, out4;
    INFO("op " << info.name);
    Status s1 = run_named_op(*one, info.name, inputs, attrs, &out1);
    REQUIRE(s1.message() == "");
    REQUIRE(run_named_op(*four, info.name, inputs, attrs, &out4).is_ok());
    for (const auto& f : info.outputs) {
      INFO("output " << f.name);
      REQUIRE(out1.count(f.name));
      CHECK(out1[f.name].dtype() == (f.kind == OpFieldKind::I32 ? DType::I32 : DType::F32));
      CHECK(bitwise_equal(out1[f.name], out4[f.name]));
    }
    CHECK(out1.size() == info.outputs.size());
  }
}

TEST_CASE("run_named_op matches direct backend calls, updates in/out tensors and leaves inputs untouched") {
  std::mt19937 rng(62);
  auto be = cpu_backend(2);
  auto [inputs, attrs] = example("kda_chunk", rng);
  const Tensor state_before = inputs["state"].clone();
  std::map<std::string, Tensor> out;
  REQUIRE(run_named_op(*be, "kda_chunk", inputs, attrs, &out).is_ok());
  CHECK(bitwise_equal(inputs["state"], state_before));
  Tensor state = state_before.clone(), o = Tensor::zeros({6, 2, 3});
  be->kda_chunk({.q = inputs["q"], .k = inputs["k"], .v = inputs["v"], .g = inputs["g"], .beta = inputs["beta"],
                 .state = state, .slots = inputs["slots"], .cu_seqlens = inputs["cu_seqlens"], .o = o, .chunk_size = 3});
  CHECK(bitwise_equal(out["o"], o));
  CHECK(bitwise_equal(out["state"], state));

  // BF16 inputs are widened to F32 on the way in.
  Tensor x = randn({2, 4}, rng), xb = Tensor::zeros({2, 4}, DType::BF16);
  for (int i = 0; i < 8; ++i) xb.ptr<uint16_t>()[i] = f32_to_bf16(x.f32()[i]);
  std::map<std::string, Tensor> a, b;
  REQUIRE(run_named_op(*be, "sigmoid", {{"x", xb}}, {}, &a).is_ok());
  REQUIRE(run_named_op(*be, "sigmoid", {{"x", xb.to_f32()}}, {}, &b).is_ok());
  CHECK(bitwise_equal(a["y"], b["y"]));
}

TEST_CASE("run_named_op errors name the op and the bad input or attribute") {
  std::mt19937 rng(63);
  auto be = cpu_backend(1);
  std::map<std::string, Tensor> out;
  auto msg = [&](const std::string& op, Inputs in, Attrs at) {
    Status s = run_named_op(*be, op, in, at, &out);
    CHECK_FALSE(s.is_ok());
    CHECK(out.empty());
    return s.message();
  };
  using Catch::Contains;
  Tensor x = randn({2, 3}, rng);
  CHECK_THAT(msg("gemmm", {}, {}), Contains("unknown op 'gemmm'") && Contains("gemm, rmsnorm"));
  CHECK_THAT(msg("gemm", {{"x", x}}, {}), Contains("op gemm: missing input tensor 'w'"));
  CHECK_THAT(msg("gemm", {{"x", x}, {"w", x}, {"bias", x}}, {}), Contains("op gemm: unknown input tensor 'bias'"));
  CHECK_THAT(msg("gemm", {{"x", x}, {"w", x}}, {{"alpha", "fast"}}), Contains("op gemm") && Contains("attribute 'alpha' = 'fast' is not a number"));
  CHECK_THAT(msg("gemm", {{"x", x}, {"w", x}}, {{"alfa", "1"}}), Contains("op gemm: unknown attribute 'alfa'"));
  CHECK_THAT(msg("kda_gate", {{"f", x}, {"a_log", x}, {"dt_bias", x}}, {}), Contains("op kda_gate") && Contains("missing required attribute 'heads'"));
  CHECK_THAT(msg("gemm", {{"x", x}, {"w", randn({2, 4}, rng)}}, {}), Contains("op gemm") && Contains("gemm: w: expected shape [*, 3], got [2, 4]"));
  CHECK_THAT(msg("embedding", {{"table", x}, {"ids", x}}, {}), Contains("input 'ids' must be I32, got F32"));
}

TEST_CASE("k3-op runs an op from a safetensors file written by the writer") {
  namespace fs = std::filesystem;
  std::mt19937 rng(64);
  const ScratchDir scratch("op_test");  // removed however the test ends
  const fs::path dir = scratch.str();
  const std::string in = (dir / "in.safetensors").string(), out = (dir / "out.safetensors").string();
  Tensor x = randn({4, 6}, rng), w = randn({3, 6}, rng);
  REQUIRE(write_safetensors(in, {{"x", x}, {"w", w}}, {{"alpha", "2"}, {"format", "pt"}}).is_ok());
  const std::string tool = std::string(K3_BIN_DIR) + "/k3-op";
  REQUIRE(fs::exists(tool));
  REQUIRE(std::system((tool + " --op gemm --in " + in + " --out " + out + " --threads 2 > /dev/null").c_str()) == 0);
  auto file = SafetensorsFile::open(out);
  REQUIRE(file.is_ok());
  auto y = file->tensor("y");
  REQUIRE(y.is_ok());
  Tensor ref = Tensor::zeros({4, 3});
  cpu_backend(1)->gemm({.x = x, .w = w, .y = ref, .alpha = 2.f});
  CHECK(bitwise_equal(y->clone(), ref));

  // A bad attribute fails with a non-zero exit and no output file.
  const std::string bad = (dir / "bad.safetensors").string(), none = (dir / "none.safetensors").string();
  REQUIRE(write_safetensors(bad, {{"x", x}, {"w", w}}, {{"beta", "x1"}}).is_ok());
  CHECK(std::system((tool + " --op gemm --in " + bad + " --out " + none + " 2> /dev/null").c_str()) != 0);
  CHECK_FALSE(fs::exists(none));
}
