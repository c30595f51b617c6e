#include "common/core/comm.h"

#include <algorithm>

namespace k3 {

Chunk even_chunk(size_t count, int parts, int index) {
  const size_t base = count / parts, extra = count % parts;
  const size_t i = static_cast<size_t>(index);
  return {i * base + std::min(i, extra), base + (i < extra ? 1 : 0)};
}

}  // namespace k3
