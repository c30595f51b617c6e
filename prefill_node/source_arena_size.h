// The default size of a prefill stage's source arena (transfer/source_arena.h; k3-prefill
// --source-arena-mib), which the memory planner counts too. 1 GiB of device memory holds the images of
// several long prompts of a stage at once; a quarter of that on the host, whose images need no
// registration to be put at full speed and only save their allocation there.
//
// The default busy poll of the stage's transfer waits (WriterOptions::busy_poll; k3-prefill
// --transfer-busy-poll-us): on a GPU a write list's device copies complete within a few hundred
// microseconds and a wake-up from the worker's event fd costs tens, so the writer thread polls for up
// to 1 ms before it sleeps (16 MiB puts on the H200: 0.84 -> 0.91 of ucx_perftest, docs/PERF.md). On
// the host it sleeps at once: there many processes share few cores.
#pragma once
#include <cstdint>

namespace k3::prefill {

inline constexpr int64_t kDefaultSourceArenaMiBDevice = 1024;
inline constexpr int64_t kDefaultSourceArenaMiBHost = 256;
inline constexpr int64_t kDefaultTransferBusyPollUsDevice = 1000;
inline constexpr int64_t kDefaultTransferBusyPollUsHost = 0;
// The busy poll of a stage whose source images are device memory, or host memory.
inline constexpr int64_t default_transfer_busy_poll_us(bool device_memory) {
  return device_memory ? kDefaultTransferBusyPollUsDevice : kDefaultTransferBusyPollUsHost;
}

}  // namespace k3::prefill
