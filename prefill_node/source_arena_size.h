// The default size of a prefill stage's source arena (transfer/source_arena.h; k3-prefill
// --source-arena-mib), which the memory planner counts too. 1 GiB of device memory holds the images of
// several long prompts of a stage at once; a quarter of that on the host, whose images need no
// registration to be put at full speed and only save their allocation there.
#pragma once
#include <cstdint>

namespace k3::prefill {

inline constexpr int64_t kDefaultSourceArenaMiBDevice = 1024;
inline constexpr int64_t kDefaultSourceArenaMiBHost = 256;

}  // namespace k3::prefill
