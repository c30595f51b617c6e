// What LocalEngineService keeps of a request it runs (one per choice), shared by the service's step and
// its admission (local_engine_admission.cpp).
#pragma once
#include <memory>
#include <vector>

#include "common/grammar/token_constraint.h"
#include "engine/prefix_cache.h"
#include "router/local_engine_service.h"
#include "router/text_stream.h"

namespace k3::router {

// The choices of one request (n samples of its prompt): they end the request together.
struct ChoiceFamily {
  int open = 1;          // choices not ended yet
  bool failed = false;   // a Failed event went out: the other choices end silently
};

struct LocalEngineService::Running {
  RequestHandle id = 0;
  int choice = 0;                    // 0..n-1; choice 0 is the request that prefilled
  std::shared_ptr<ChoiceFamily> family = std::make_shared<ChoiceFamily>();
  GenerationParams params;
  EventSink sink;
  SeqCache seq;
  PrefixLease lease;                 // prefix cache hold (inactive when the cache is off)
  size_t prefilled = 0;              // prompt tokens already fed (or restored from the prefix cache)
  std::vector<int32_t> generated;
  std::unique_ptr<TextStream> text;
  std::unique_ptr<grammar::TokenConstraint> constraint;  // structured output; null for free text
  int forks_pending = 0;             // choices 1..n-1 not forked yet (they will take a slot each)
  bool done = false;
};

}  // namespace k3::router
