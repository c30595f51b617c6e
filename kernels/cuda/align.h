// The alignment 16-byte vector loads, cp.async copies and TMA tensor maps need of an address.
#pragma once
#include <cstdint>

namespace k3::cuda {

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace k3::cuda
