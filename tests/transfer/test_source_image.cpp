// A prefill stage's source images: host images (made, taken over without a copy, filled by upload) and, where no
// GPU is visible, a device image request that fails with the reason instead of crashing. The device
// path itself runs on the GPU host (K3_TEST_MEMORY=cuda transfer_test_pd_transfer).
#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "transfer/source_image.h"
#ifdef K3_TRANSFER_HAVE_CUDA
#include <cuda_runtime.h>

#include "transfer/cuda/cuda_memory.h"
#endif

using namespace k3::transfer;

TEST_CASE("host source images: made zeroed, taken over without a copy, filled by upload", "[transfer]") {
  auto made = SourceImage::create(MemoryType::Host, 100).value();
  CHECK(made->size() == 100);
  CHECK(made->type() == MemoryType::Host);
  CHECK(std::all_of(made->data(), made->data() + 100, [](uint8_t b) { return b == 0; }));

  std::vector<uint8_t> bytes(64, 7);
  const uint8_t* where = bytes.data();
  auto adopted = SourceImage::adopt(std::move(bytes));
  CHECK(adopted->data() == where);   // the vector's buffer itself
  CHECK(adopted->size() == 64);

  auto copied = SourceImage::create(MemoryType::Host, 8).value();
  REQUIRE(copied->upload(std::vector<uint8_t>(8, 3)).is_ok());
  CHECK(copied->upload(std::vector<uint8_t>(9, 3)).code() == k3::Code::InvalidArgument);   // larger than the image
  CHECK(copied->size() == 8);
  CHECK(copied->data()[7] == 3);
}

TEST_CASE("a device source image is device memory on a GPU and a clear error without one", "[transfer]") {
#ifdef K3_TRANSFER_HAVE_CUDA
  auto img = SourceImage::create(MemoryType::Cuda, 4096);
  if (!cuda_device_count().is_ok()) {
    REQUIRE_FALSE(img.is_ok());
    INFO(img.status().to_string());
    CHECK_FALSE(img.status().message().empty());
    WARN("SKIPPED device contents: no GPU visible");
    return;
  }
  REQUIRE(img.is_ok());
  REQUIRE((*img)->upload(std::vector<uint8_t>(4096, 9)).is_ok());
  CHECK((*img)->type() == MemoryType::Cuda);
  std::vector<uint8_t> back(4096);
  REQUIRE(cudaMemcpy(back.data(), (*img)->data(), back.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(std::all_of(back.begin(), back.end(), [](uint8_t b) { return b == 9; }));
  // An empty image still has an address (a held image is never null).
  auto empty = SourceImage::create(MemoryType::Cuda, 0).value();
  CHECK(empty->data() != nullptr);
  CHECK(empty->size() == 0);
#else
  auto img = SourceImage::create(MemoryType::Cuda, 16);
  REQUIRE_FALSE(img.is_ok());
  CHECK(img.status().message().find("CUDA build") != std::string::npos);
#endif
}
