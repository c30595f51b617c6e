// Control-plane messages shared by router, prefill and decode (one definition, docs/STYLE.md habit 8).
// The byte encoding lives in frame.h; this header is only the typed contents.
//
// Conventions:
//  - request ids are u64, unique per router lifetime;
//  - `timeout_ms` fields are budgets relative to receipt (each receiver sets its own local deadline =
//    now + timeout_ms on its own steady clock), so no clock synchronisation between hosts is needed;
//  - ranks are global decode ranks (DP group g of size N owns ranks g*N .. g*N+N-1, DCP order);
//  - `stage` is a prefill pipeline stage index 0..num_stages-1.
#pragma once
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "common/core/tensor.h"

namespace k3::protocol {

// Wire values are fixed: append new values, never renumber. Decoders reject values past the last.
enum class MsgType : uint8_t {
  Register = 1,
  RegisterAck = 2,
  Heartbeat = 3,
  Claim = 4,
  Prefill = 5,
  ComputeDone = 6,
  Addrs = 7,
  TransferDone = 8,
  Tokens = 9,
  Abort = 10,
  AbortAck = 11,   // "this stage has no write in flight for the request any more" (deferred release)
  Failed = 12,     // a party reports a request failed (to the router), with the cause
  ClaimAck = 13,   // decode -> router: the CLAIM is recorded (ok) or refused (reason); PREFILL may follow
};
inline constexpr uint8_t kMaxMsgType = 13;

enum class Role : uint8_t { Router = 0, Prefill = 1, Decode = 2 };
inline constexpr uint8_t kMaxRole = 2;

// What one ADDRS entry / one transfer region holds.
enum class EntryKind : uint8_t { MlaKv = 0, KdaConv = 1, KdaState = 2, DraftKv = 3 };
inline constexpr uint8_t kMaxEntryKind = 3;

enum class FinishReason : uint8_t { None = 0, Stop = 1, Length = 2, Aborted = 3 };
inline constexpr uint8_t kMaxFinishReason = 3;

// Why a request was aborted / failed. Also the label of the failures-by-cause metric.
enum class AbortReason : uint8_t {
  ClientCancelled = 0,   // client disconnected or cancelled
  Deadline = 1,          // a protocol wait expired
  PeerDead = 2,          // heartbeats of a peer stopped
  AllocFailed = 3,       // decode pool exhausted
  TransferFailed = 4,    // a UCX write or flush failed
  PlanFailed = 5,        // ADDRS did not match the model/layout (missing layer, bounds)
  Rejected = 6,          // a party refused the request (e.g. unknown / duplicate id)
  Shutdown = 7,          // a node is draining
  Internal = 8,
};
inline constexpr uint8_t kMaxAbortReason = 8;

const char* msg_type_name(MsgType t);
const char* role_name(Role r);
const char* entry_kind_name(EntryKind k);
const char* finish_reason_name(FinishReason r);
const char* abort_reason_name(AbortReason r);

// Parallel layout of one instance. Prefill: dp_size = dcp_size = 1 and pp_partition = layers per stage
// (sum = number of main layers). Decode: pp_partition empty, dcp_size = N (1 = plain DP).
struct ParallelLayout {
  uint32_t dp_size = 1;
  uint32_t dcp_size = 1;
  std::vector<uint32_t> pp_partition;
  bool operator==(const ParallelLayout&) const = default;
};

// The components of the compatibility hash, carried individually so a refusal can name the field.
struct CompatInfo {
  uint64_t model_hash = 0;         // hash of the model config (shapes, layer kinds), see compat.h
  DType kv_dtype = DType::BF16;    // MLA cache dtype
  DType state_dtype = DType::F32;  // KDA recurrent state dtype
  uint32_t page_size = 0;          // tokens per MLA page
  ParallelLayout layout;
  bool operator==(const CompatInfo&) const = default;
};

// One registered memory region of the sender (decode pools; prefill staging buffers).
struct MemoryRegion {
  uint32_t region_id = 0;
  uint64_t base = 0;               // remote virtual address of byte 0
  uint64_t length = 0;
  std::vector<uint8_t> packed_rkey;  // ucp_rkey_pack output; empty when the region is not remotely writable
  // The UCX worker that owns the region when it is not the sender's own (a decode rank group: each rank
  // process registers its region; the leader's REGISTER lists them all). Empty: Register.worker_address.
  std::vector<uint8_t> worker_address;
  bool operator==(const MemoryRegion&) const = default;
};

struct Register {
  Role role = Role::Router;
  std::string instance_id;
  uint32_t rank = 0;               // decode: global rank; prefill: 0
  uint32_t stage = 0;              // prefill: PP stage; others 0
  CompatInfo compat;
  uint64_t compat_hash = 0;        // must equal compat_hash(compat); checked by the receiver
  std::vector<uint32_t> layer_ids; // global layer ids this process owns
  std::vector<MemoryRegion> regions;
  std::vector<uint8_t> worker_address;  // ucp_worker_get_address blob
  std::string control_endpoint;    // where to reach this process's control socket, e.g. "tcp://127.0.0.1:5601"
  bool operator==(const Register&) const = default;
};

struct RegisterAck {
  bool ok = false;
  std::string reason;              // empty when ok; otherwise names the differing field
  bool operator==(const RegisterAck&) const = default;
};

// A decode rank's room, in its heartbeats (all zero from other roles). The totals are the rank's
// capacity (fixed for its lifetime: the router learns them from the first heartbeat, sent as soon as the
// rank connects); the free counts are what is unused now. The router admits a request onto a rank only
// when its prompt fits the transfer pool and its prompt plus a generation reserve fits the decode cache.
struct DecodeRoom {
  uint32_t pool_page_size = 0;     // transfer pool: tokens per page
  uint32_t pool_pages = 0;
  uint32_t pool_free_pages = 0;
  uint32_t pool_slots = 0;         // transfer pool KDA slots (one per request transferring or decoding)
  uint32_t pool_free_slots = 0;
  uint32_t cache_page_size = 0;    // decode engine MLA cache: tokens per page
  uint32_t cache_pages = 0;
  uint32_t cache_free_pages = 0;
  uint32_t cache_seqs = 0;         // decode engine sequence slots (the running batch limit)
  uint32_t cache_free_seqs = 0;
  uint32_t paused = 0;             // requests preempted (caches swapped out) waiting to resume
  uint64_t preemptions = 0;        // requests preempted since the rank started (a counter)
  bool operator==(const DecodeRoom&) const = default;
};

// A prefill stage's prefix cache, reported with its heartbeats (all zero when the cache is off). The
// router places a request on the instance whose stage 0 can resume it deepest (KV-aware placement) and
// shows the counters on /metrics.
struct PrefixCacheReport {
  uint32_t block_tokens = 0;             // the hashes' block size (0: no cache)
  std::vector<uint64_t> block_hashes;    // prefix_block_hashes of every cached prefix a hit resumes from
  uint64_t lookup_tokens = 0;            // prompt tokens looked up
  uint64_t hit_tokens = 0;               // of those, restored from the cache
  uint64_t checkpoints_stored = 0;
  uint64_t checkpoints_evicted = 0;
  uint64_t cache_bytes = 0;              // what the cache holds (checkpoints + pages, whole-model bytes)
  uint32_t pool_pages = 0;               // the stage's local MLA pool: pages, and pages free
  uint32_t pool_free_pages = 0;
  uint32_t pool_slots = 0;               // KDA slots (requests + checkpoints), and slots free
  uint32_t pool_free_slots = 0;
  uint64_t prompts_prefilled = 0;        // prompts this stage finished (with or without a cache; a counter)
  // The stage's unified cache region (slots and pages share its bytes): free bytes, runs of free bytes,
  // and slots compaction moved (a counter).
  uint64_t region_free_bytes = 0;
  uint32_t region_free_extents = 0;
  uint64_t region_slot_moves = 0;
  bool operator==(const PrefixCacheReport&) const = default;
};

struct Heartbeat {
  Role role = Role::Router;
  std::string instance_id;
  uint32_t rank = 0;
  uint32_t stage = 0;
  uint64_t seq = 0;
  uint64_t free_bytes = 0;         // decode pool free bytes (load hint for the router)
  uint32_t num_running = 0;
  DecodeRoom room;                 // decode only
  PrefixCacheReport prefix;        // prefill only
  bool operator==(const Heartbeat&) const = default;
};

// Log-probabilities of one generated token (log-softmax of the raw logits, as local mode reports them):
// the sampled token's and the `logprobs` most likely alternatives, most likely first.
struct TopLogprob {
  int32_t id = 0;
  float logprob = 0.f;
  bool operator==(const TopLogprob&) const = default;
};
struct TokenLogprobs {
  float logprob = 0.f;
  std::vector<TopLogprob> top;
  bool operator==(const TokenLogprobs&) const = default;
};

// OpenAI's logit_bias entry: added to one token's logit before each draw (ops::LogitBias).
struct LogitBias {
  int32_t token = 0;
  float bias = 0.f;
  bool operator==(const LogitBias&) const = default;
};

struct SamplingParams {
  float temperature = 0.f;        // 0 = greedy
  float top_p = 1.f;
  int32_t top_k = 0;              // 0 = off
  uint64_t seed = 0;
  uint32_t max_tokens = 0;
  std::vector<int32_t> stop_token_ids;
  int32_t logprobs = -1;          // -1: none; else report each token's logprob plus this many alternatives
  std::string output_format;      // structured output (grammar::OutputFormat::encode); "" = free text
  // Choices: n samples of the prompt share its prefill; choice i samples with ops::choice_seed(seed, i).
  uint32_t n = 1;
  float presence_penalty = 0.f;   // over the generated tokens (ops::SamplingRow)
  float frequency_penalty = 0.f;
  std::vector<LogitBias> logit_bias;
  bool operator==(const SamplingParams&) const = default;
};

// Router -> decode: record the request, take no memory yet.
struct Claim {
  uint64_t request_id = 0;
  uint32_t prompt_len = 0;
  std::vector<uint32_t> decode_ranks;   // the DP group's ranks, DCP order (rank index i holds tokens p%N==i)
  std::string prefill_instance;
  uint32_t num_prefill_stages = 1;
  uint64_t timeout_ms = 0;              // 0 = the decode side's configured default
  SamplingParams sampling;              // how decode samples and stops (the first token is prefill's)
  std::string trace_id;                 // the client's request id (X-Request-Id): every log line names it
  bool operator==(const Claim&) const = default;
};


// Router -> prefill (stage 0; forwarded down the pipeline by the prefill node).
struct Prefill {
  uint64_t request_id = 0;
  std::vector<int32_t> token_ids;
  SamplingParams sampling;
  std::string decode_instance;
  std::vector<uint32_t> decode_ranks;
  uint64_t timeout_ms = 0;
  std::string trace_id;                 // as in Claim (the wire id changes per attempt, this does not)
  bool operator==(const Prefill&) const = default;
};

// Prefill stage -> decode: this stage's layers are final. Only the last stage knows the first token.
struct ComputeDone {
  uint64_t request_id = 0;
  uint32_t stage = 0;
  uint32_t prompt_len = 0;
  bool has_first_token = false;
  int32_t first_token = 0;        // valid iff has_first_token
  // The first token's logprobs when the sampling params ask: one entry per choice (choice 0 first), else none.
  std::vector<TokenLogprobs> first_logprobs;
  std::vector<int32_t> choice_first_tokens;   // n > 1: the first tokens of choices 1..n-1 (last stage only)
  // A streaming stage asks for its addresses at its first chunk: this COMPUTE_DONE only says the stage
  // has begun (decode allocates and answers ADDRS as usual). The stage's writes follow chunk by chunk;
  // the last stage's first token comes in a second, final COMPUTE_DONE (streaming false) before its
  // TRANSFER_DONE.
  bool streaming = false;
  bool operator==(const ComputeDone&) const = default;
};

// One destination of the decode side. For MLA_KV / DRAFT_KV: `remote_addr` is row 0 of page 0 of the
// layer's page array on `dest_rank` (page p, row j at remote_addr + (p*page_size + j)*row_bytes, page
// ids from the rank's PageTable) and `length` bounds that array. For KDA_CONV / KDA_STATE: the
// request's slot for that layer on that rank, exactly `length` bytes.
struct AddrEntry {
  uint32_t layer_id = 0;          // global layer id: the pairing key, never list position
  EntryKind kind = EntryKind::MlaKv;
  uint32_t dest_rank = 0;
  uint64_t remote_addr = 0;
  uint64_t length = 0;
  uint32_t region_id = 0;         // which registered region (rkey) of dest_rank
  bool operator==(const AddrEntry&) const = default;
};

// Pages of one request on one rank, shared by every MLA/draft layer (one page-id space, see pool.h).
struct PageTable {
  uint32_t rank = 0;
  uint32_t page_size = 0;
  std::vector<uint32_t> page_ids;  // local row q lives in page page_ids[q / page_size]
  bool operator==(const PageTable&) const = default;
};

// Decode -> every prefill stage: where to write. Each stage picks the entries of its own layers.
struct Addrs {
  uint64_t request_id = 0;
  std::vector<AddrEntry> entries;
  std::vector<PageTable> page_tables;
  bool operator==(const Addrs&) const = default;
};

// Prefill stage -> decode: all of this stage's writes are flushed (complete) at the destination.
struct TransferDone {
  uint64_t request_id = 0;
  uint32_t stage = 0;
  uint64_t bytes = 0;
  bool operator==(const TransferDone&) const = default;
};

// Decode -> router: generated tokens (streamed; finish != None on the last message).
struct Tokens {
  uint64_t request_id = 0;
  std::vector<int32_t> token_ids;
  FinishReason finish = FinishReason::None;
  std::vector<TokenLogprobs> logprobs;  // one per token id when the sampling params ask, else empty
  uint32_t choice = 0;                  // which of the request's n choices (finish ends that choice only)
  bool operator==(const Tokens&) const = default;
};

// Any party -> any party. A prefill stage sends ABORT only when it has no write in flight.
struct Abort {
  uint64_t request_id = 0;
  AbortReason reason = AbortReason::Internal;
  Role origin_role = Role::Router;
  std::string origin_instance;
  uint32_t origin_stage = 0;      // prefill origin: its stage; otherwise 0
  bool operator==(const Abort&) const = default;
};

// Prefill stage -> decode, answering ABORT: the stage issued no write it has not flushed, and issues none.
struct AbortAck {
  uint64_t request_id = 0;
  uint32_t stage = 0;
  bool operator==(const AbortAck&) const = default;
};

// Any node -> router: the request failed here (a terminal notification; router then aborts others).
struct Failed {
  uint64_t request_id = 0;
  AbortReason cause = AbortReason::Internal;
  std::string detail;
  bool operator==(const Failed&) const = default;
};

// Decode -> router, answering CLAIM. The router sends PREFILL only after ok: decode ignores a
// COMPUTE_DONE for a request it has not recorded, and CLAIM and PREFILL travel on different sockets.
struct ClaimAck {
  uint64_t request_id = 0;
  bool ok = false;
  std::string reason;             // empty when ok; otherwise why the CLAIM was refused
  bool operator==(const ClaimAck&) const = default;
};

using Message = std::variant<Register, RegisterAck, Heartbeat, Claim, Prefill, ComputeDone, Addrs,
                             TransferDone, Tokens, Abort, AbortAck, Failed, ClaimAck>;

MsgType type_of(const Message& m);

}  // namespace k3::protocol
