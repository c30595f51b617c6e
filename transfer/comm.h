// The collective interface is defined once in common/core/comm.h (the engine uses it too); transfer/
// names it in its own namespace for the implementations and their callers.
#pragma once
#include "common/core/comm.h"

namespace k3::transfer {
using k3::Chunk;
using k3::Comm;
using k3::even_chunk;
}  // namespace k3::transfer
