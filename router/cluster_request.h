// ClusterService's private state: one request as the worker tracks it, and the worker's own state
// (socket, requests, admission queue, capacity ledger, deadlines). Included by the service's .cpp files only.
#pragma once
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "common/protocol/messages.h"
#include "router/cluster_service.h"
#include "router/text_stream.h"
#include "router/wire_ids.h"
#include "transfer/zmq_channel.h"

namespace k3::router {

struct ClusterService::Request {
  RequestHandle id = 0;
  GenerationParams params;
  EventSink sink;
  RequestPhase phase = RequestPhase::Queued;
  int pair = -1;
  uint64_t wire_id = 0;             // this attempt's protocol request id
  int attempts = 0;
  // Prefill instances an earlier attempt failed on: a retry goes elsewhere when it can (the node that
  // failed it may not be declared down yet, e.g. when decode noticed a frozen stage first).
  std::set<std::string> failed_prefill;
  std::chrono::steady_clock::time_point queued_since;  // its place in the queue (kept when sent back)
  bool streamed = false;            // a token reached the sink: no retry any more
  // One per choice (n of them): its text, its count, and whether it ended (for the client; `decoded`:
  // the decode rank said its last TOKENS, so nothing of it runs there any more).
  struct Choice {
    std::unique_ptr<TextStream> text;
    int64_t generated = 0;
    bool ended = false, decoded = false;
  };
  std::vector<Choice> choices;
  int open_choices = 1;
};

struct ClusterService::Worker {
  explicit Worker(const ClusterOptions& o) : queue(static_cast<size_t>(o.max_queue)), deadlines(o.deadlines) {}
  zmq::context_t ctx;
  std::unique_ptr<transfer::ControlServer> server;
  std::map<RequestHandle, std::unique_ptr<Request>> requests;
  std::map<uint64_t, RequestHandle> by_wire;
  WireIds wire_ids;  // unguessable protocol request ids
  std::set<std::string> live;
  std::map<std::string, protocol::Heartbeat> heartbeats;  // by control name
  std::unique_ptr<PlacementPolicy> policy;
  size_t decode_cursor = 0;         // where least_loaded_decode starts among equals (advances per placement)
  AdmissionQueue queue;
  CapacityLedger ledger;            // by decode control name
  RequestDeadlines deadlines;
};

}  // namespace k3::router
