// Internal to the codec: the field list of every message, in wire order, written once and used by both
// the encoder and the decoder (so they cannot disagree). `v(name, field)` is called per field.
#pragma once
#include "common/protocol/messages.h"

namespace k3::protocol::fields {


#define K3_FIELDS(Type, ...)                         \
  template <class V> void visit(V& v, Type& m) { __VA_ARGS__; } \
  template <class V> void visit(V& v, const Type& m) { __VA_ARGS__; }

K3_FIELDS(ParallelLayout, v("dp_size", m.dp_size); v("dcp_size", m.dcp_size);
          v("pp_partition", m.pp_partition))
K3_FIELDS(CompatInfo, v("model_hash", m.model_hash); v("kv_dtype", m.kv_dtype);
          v("state_dtype", m.state_dtype); v("page_size", m.page_size); v("layout", m.layout))
K3_FIELDS(MemoryRegion, v("region_id", m.region_id); v("base", m.base); v("length", m.length);
          v("packed_rkey", m.packed_rkey); v("worker_address", m.worker_address))
K3_FIELDS(Register, v("role", m.role); v("instance_id", m.instance_id); v("rank", m.rank);
          v("stage", m.stage); v("compat", m.compat); v("compat_hash", m.compat_hash);
          v("layer_ids", m.layer_ids); v("regions", m.regions); v("worker_address", m.worker_address);
          v("control_endpoint", m.control_endpoint))
K3_FIELDS(RegisterAck, v("ok", m.ok); v("reason", m.reason))
K3_FIELDS(DecodeRoom, v("pool_page_size", m.pool_page_size); v("pool_pages", m.pool_pages);
          v("pool_free_pages", m.pool_free_pages); v("pool_slots", m.pool_slots);
          v("pool_free_slots", m.pool_free_slots); v("cache_page_size", m.cache_page_size);
          v("cache_pages", m.cache_pages); v("cache_free_pages", m.cache_free_pages);
          v("cache_seqs", m.cache_seqs); v("cache_free_seqs", m.cache_free_seqs); v("paused", m.paused);
          v("preemptions", m.preemptions))
K3_FIELDS(PrefixCacheReport, v("block_tokens", m.block_tokens); v("block_hashes", m.block_hashes);
          v("lookup_tokens", m.lookup_tokens); v("hit_tokens", m.hit_tokens);
          v("checkpoints_stored", m.checkpoints_stored); v("checkpoints_evicted", m.checkpoints_evicted);
          v("cache_bytes", m.cache_bytes); v("pool_pages", m.pool_pages); v("pool_free_pages", m.pool_free_pages);
          v("pool_slots", m.pool_slots); v("pool_free_slots", m.pool_free_slots);
          v("prompts_prefilled", m.prompts_prefilled); v("region_free_bytes", m.region_free_bytes);
          v("region_free_extents", m.region_free_extents); v("region_slot_moves", m.region_slot_moves))
K3_FIELDS(Heartbeat, v("role", m.role); v("instance_id", m.instance_id); v("rank", m.rank);
          v("stage", m.stage); v("seq", m.seq); v("free_bytes", m.free_bytes);
          v("num_running", m.num_running); v("room", m.room); v("prefix", m.prefix))
K3_FIELDS(TopLogprob, v("id", m.id); v("logprob", m.logprob))
K3_FIELDS(TokenLogprobs, v("logprob", m.logprob); v("top", m.top))
K3_FIELDS(LogitBias, v("token", m.token); v("bias", m.bias))
K3_FIELDS(SamplingParams, v("temperature", m.temperature); v("top_p", m.top_p); v("top_k", m.top_k);
          v("seed", m.seed); v("max_tokens", m.max_tokens); v("stop_token_ids", m.stop_token_ids);
          v("logprobs", m.logprobs); v("output_format", m.output_format); v("n", m.n);
          v("presence_penalty", m.presence_penalty); v("frequency_penalty", m.frequency_penalty);
          v("logit_bias", m.logit_bias))
K3_FIELDS(Claim, v("request_id", m.request_id); v("prompt_len", m.prompt_len);
          v("decode_ranks", m.decode_ranks); v("prefill_instance", m.prefill_instance);
          v("num_prefill_stages", m.num_prefill_stages); v("timeout_ms", m.timeout_ms);
          v("sampling", m.sampling); v("trace_id", m.trace_id))
K3_FIELDS(Prefill, v("request_id", m.request_id); v("token_ids", m.token_ids);
          v("sampling", m.sampling); v("decode_instance", m.decode_instance);
          v("decode_ranks", m.decode_ranks); v("timeout_ms", m.timeout_ms); v("trace_id", m.trace_id))
K3_FIELDS(ComputeDone, v("request_id", m.request_id); v("stage", m.stage);
          v("prompt_len", m.prompt_len); v("has_first_token", m.has_first_token);
          v("first_token", m.first_token); v("first_logprobs", m.first_logprobs);
          v("choice_first_tokens", m.choice_first_tokens); v("streaming", m.streaming))
K3_FIELDS(AddrEntry, v("layer_id", m.layer_id); v("kind", m.kind); v("dest_rank", m.dest_rank);
          v("remote_addr", m.remote_addr); v("length", m.length); v("region_id", m.region_id))
K3_FIELDS(PageTable, v("rank", m.rank); v("page_size", m.page_size); v("page_ids", m.page_ids))
K3_FIELDS(Addrs, v("request_id", m.request_id); v("entries", m.entries);
          v("page_tables", m.page_tables))
K3_FIELDS(TransferDone, v("request_id", m.request_id); v("stage", m.stage); v("bytes", m.bytes))
K3_FIELDS(Tokens, v("request_id", m.request_id); v("token_ids", m.token_ids); v("finish", m.finish);
          v("logprobs", m.logprobs); v("choice", m.choice))
K3_FIELDS(Abort, v("request_id", m.request_id); v("reason", m.reason);
          v("origin_role", m.origin_role); v("origin_instance", m.origin_instance);
          v("origin_stage", m.origin_stage))
K3_FIELDS(AbortAck, v("request_id", m.request_id); v("stage", m.stage))
K3_FIELDS(Failed, v("request_id", m.request_id); v("cause", m.cause); v("detail", m.detail))
K3_FIELDS(ClaimAck, v("request_id", m.request_id); v("ok", m.ok); v("reason", m.reason))

#undef K3_FIELDS

// Largest valid wire value of each enum (decoders reject anything above).
template <class E> constexpr uint8_t enum_max();
template <> constexpr uint8_t enum_max<Role>() { return kMaxRole; }
template <> constexpr uint8_t enum_max<EntryKind>() { return kMaxEntryKind; }
template <> constexpr uint8_t enum_max<FinishReason>() { return kMaxFinishReason; }
template <> constexpr uint8_t enum_max<AbortReason>() { return kMaxAbortReason; }
template <> constexpr uint8_t enum_max<DType>() { return static_cast<uint8_t>(DType::U8); }

}  // namespace k3::protocol::fields
