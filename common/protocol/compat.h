// Compatibility of two parties: the hash carried at registration and the check that names the field
// that differs. Prefill and decode layouts differ by design (PP stages vs DCP groups), so the layout
// component is compared only between members of one instance (all stages of one prefill instance, all
// ranks of one decode instance); model, dtypes and page size are compared between every pair.
#pragma once
#include <cstdint>
#include <string_view>

#include "common/core/status.h"
#include "common/config/config.h"
#include "common/protocol/messages.h"

namespace k3::protocol {

// FNV-1a 64 over bytes; stable across platforms and runs (never std::hash).
uint64_t fnv1a64(std::string_view bytes, uint64_t seed = 0xcbf29ce484222325ull);

// Hash of every model config field that changes tensor shapes, layer kinds or cache layout.
uint64_t model_config_hash(const ModelConfig& cfg);

uint64_t layout_hash(const ParallelLayout& layout);

// Hash of all components (model, dtypes, page size, layout).
uint64_t compat_hash(const CompatInfo& c);

enum class CompatScope { Cluster, SameInstance };

// Ok when compatible. Otherwise InvalidArgument whose message starts with the differing field:
// "model", "kv_dtype", "state_dtype", "page_size" or "layout" (only for SameInstance), then both values.
Status check_compat(const CompatInfo& ours, const CompatInfo& theirs, CompatScope scope);

// Validates one registration as received: compat_hash must equal compat_hash(compat), role-specific
// fields must be consistent (e.g. prefill stage < number of PP stages). Then check_compat against `ours`.
Status check_registration(const CompatInfo& ours, const Register& theirs, CompatScope scope);

}  // namespace k3::protocol
