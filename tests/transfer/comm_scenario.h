// The collective workload shared by the comm test and its rank processes: inputs are a pure function
// of (seed, size, rank), so the test recomputes every rank's input and a serial reference, and the
// rank processes report a digest of each output.
#pragma once
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace k3::test::comm {

inline uint64_t fnv(const void* p, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
  auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

// Floats over a wide exponent range and both signs, so the summation order shows in the bits.
inline std::vector<float> floats(uint64_t seed, int rank, size_t n, uint64_t salt) {
  std::mt19937_64 rng(seed * 1000003 + rank * 7919 + salt);
  std::uniform_real_distribution<float> mant(-1.f, 1.f);
  std::uniform_int_distribution<int> ex(-20, 20);
  std::vector<float> v(n);
  for (auto& x : v) x = std::ldexp(mant(rng), ex(rng));
  return v;
}

// Sizes, each times `scale`: 1 keeps every message small (UCX sends it eagerly); 1024 makes them tens of KiB
// to MiB, which UCX moves by rendezvous (the receiver's progress completes the sender), as a K3-width
// decode group's collectives are.
inline size_t sendrecv_bytes(size_t scale) { return 100 * scale; }
inline size_t all_reduce_count(uint64_t seed, int size, size_t scale) { return (1000 + seed % 7 + size) * scale; }
inline size_t rs_block(uint64_t seed, size_t scale) { return (17 + seed % 5) * scale; }
inline size_t gather_bytes(uint64_t seed, size_t scale) { return (37 + seed % 3) * scale; }
inline size_t a2a_block(uint64_t seed, size_t scale) { return (13 + seed % 4) * scale; }
// Bytes rank `src` sends to rank `dst` in all_to_allv: uneven, zero for some pairs.
inline size_t a2av_count(uint64_t seed, int src, int dst, size_t scale) {
  return (src * 7 + dst * 3 + seed) % 11 * (1 + (src + dst) % 3) * scale;
}
// Self-describing byte i of the block from src to dst.
inline uint8_t a2av_byte(int src, int dst, size_t i) { return static_cast<uint8_t>(src * 31 + dst * 7 + i * 13); }
inline std::vector<uint8_t> bytes(uint64_t seed, int rank, size_t n, uint64_t salt) {
  std::vector<uint8_t> v(n);
  std::mt19937_64 rng(seed * 31 + rank * 131 + salt);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// The serial references, given every rank's inputs.
inline std::vector<float> serial_sum(const std::vector<std::vector<float>>& per_rank) {
  std::vector<float> out = per_rank[0];
  for (size_t r = 1; r < per_rank.size(); ++r)
    for (size_t i = 0; i < out.size(); ++i) out[i] += per_rank[r][i];
  return out;
}

inline std::string hex(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

}  // namespace k3::test::comm
