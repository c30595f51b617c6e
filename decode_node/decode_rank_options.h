// How a decode rank (decode_rank.h) or a rank group's leader (group_leader.h) is set up: its transfer pool,
// control plane, decode caches, and the sampling a request gets when its CLAIM carries none.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/grammar/token_constraint.h"
#include "engine/engine.h"
#include "transfer/ucx_decode_driver.h"

namespace k3::decode {

struct DecodeRankOptions {
  std::string instance_id = "d";
  uint32_t rank = 0;                   // global rank (the region id the prefill stages write to)
  uint32_t dp_size = 1;                // decode ranks of the deployment (DP); rank < dp_size
  uint32_t page_size = 16;             // transfer pool: tokens per page (compat with prefill)
  uint32_t num_pages = 256;            // transfer pool pages
  uint32_t num_slots = 8;              // transfer pool KDA slots (requests transferring or decoding)
  CacheOptions cache;                  // the Engine's caches (decode working set); unused with cache_in_pool
  // The Engine's caches ARE the transfer pool (decode_node/cache_in_pool.h): the transfer writes where
  // the engine reads, a transferred request is held once, and its pages and slot are the pool's
  // (num_pages / num_slots / page_size size both). On the cuda backend the region is device memory of
  // cuda_device, registered with UCX once, so prefill's puts land in the GPU cache the engine decodes from.
  bool cache_in_pool = false;
  int cuda_device = 0;                 // the cuda backend's device (where a cache_in_pool region lives)
  std::string bind_endpoint = "tcp://127.0.0.1:*";
  std::string advertise_host;  // host peers dial (REGISTER's control_endpoint); empty: the bound host
  std::string router_endpoint;         // empty: tokens are only reported through finished()
  transfer::ProtocolTimeouts timeouts;
  transfer::HeartbeatConfig heartbeat;
  std::optional<transfer::ControlKeys> control_keys;  // CURVE control plane (nullopt: --insecure-control-plane)
  std::string ucx_net_devices;         // the data plane's network device (from --interface)
  // Decode-step sampling when a CLAIM carries none (max_tokens 0).
  int max_tokens = 16;                 // generated tokens including the first
  std::vector<int32_t> stop_ids;
  ops::SamplingRow sampling;           // step is set per request
  std::shared_ptr<const grammar::TokenVocab> vocab;  // for structured output (requests asking for it fail without)
  std::function<void(uint64_t, protocol::RequestState)> on_state;  // every state the driver observed
};

}  // namespace k3::decode
