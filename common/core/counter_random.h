// The counter-based random numbers that generated weights are drawn from: value i of a tensor is a
// pure function of (tensor seed, i), so any part of any tensor can be produced anywhere (host
// threads, a GPU kernel, the Python mirror in tests/kimi_linear/synthetic_weights.py) with the same
// bits. Everything here is integer arithmetic and one float multiply, which every IEEE machine
// rounds the same way; no transcendental function is involved. Scheme: docs/MODEL_INIT.md.
#pragma once
#include <cmath>
#include <cstdint>
#include <string_view>

#if defined(__CUDACC__)
#define K3_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define K3_HOST_DEVICE inline
#endif

namespace k3::counter_random {

K3_HOST_DEVICE uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// FNV-1a: a string hash with a fixed definition (std::hash may differ between standard libraries).
inline uint64_t fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// The seed of one named tensor: its values never depend on which other tensors exist.
inline uint64_t tensor_seed(uint64_t seed, std::string_view name) { return splitmix64(seed ^ splitmix64(fnv1a(name))); }

// 64 random bits for element `index` of the tensor with seed `ts`.
K3_HOST_DEVICE uint64_t bits(uint64_t ts, uint64_t index) { return splitmix64(ts + index); }

// Uniform in (-a, a) with a = 2^24 * scale: the top 24 bits c as the odd integer 2c - 2^24 + 1, times
// scale. (2c - 2^24 + 1) is exact in float, so the one float multiply is the only rounding.
K3_HOST_DEVICE float uniform(uint64_t ts, uint64_t index, float scale) {
  const int32_t c = static_cast<int32_t>(bits(ts, index) >> 40) - (1 << 23);  // [-2^23, 2^23)
  return static_cast<float>(2 * c + 1) * scale;
}

// The scale for a uniform of standard deviation `stddev`: a = stddev * sqrt(3), scale = a / 2^24,
// computed in double and rounded once to float.
inline float uniform_scale(float stddev) {
  return static_cast<float>(static_cast<double>(stddev) * std::sqrt(3.0) / 16777216.0);
}

// Uniform in (0, 1] from the top 53 bits (never 0, so a log of it is finite).
K3_HOST_DEVICE double unit_open(uint64_t ts, uint64_t index) {
  return (static_cast<double>(bits(ts, index) >> 11) + 1.0) * 0x1.0p-53;
}

}  // namespace k3::counter_random
