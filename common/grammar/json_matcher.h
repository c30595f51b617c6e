// A pushdown automaton over bytes that accepts exactly the compact JSON texts of a JsonGrammar (and
// their prefixes while in progress). advance() either consumes a byte or rejects it and leaves the
// state unchanged, so a caller can try a token's bytes on a copy and keep the real state for the
// token the sampler picks. Every state it can reach has a completion (that is what keeps a constrained
// generation finishable): no dead ends, given the limits in json_grammar.h.
#pragma once
#include <cstdint>
#include <string_view>
#include <vector>

#include "common/grammar/json_grammar.h"

namespace k3::grammar {

class JsonMatcher {
 public:
  explicit JsonMatcher(const JsonGrammar& g);

  // All bytes or none (on rejection the state is as before).
  bool advance(std::string_view bytes);
  // The fast form for trying tokens on a scratch copy: on false the state is unusable (copy again).
  bool try_feed(std::string_view bytes);
  // The text so far is one whole JSON document (a trailing number may still grow).
  bool complete() const;
  // The document is closed: no byte can follow.
  bool closed() const { return done_; }

  struct Frame;
  const std::vector<Frame>& frames() const { return stack_; }

  struct Frame {
    int32_t node = 0;
    uint8_t kind = 0;      // the ValueKind chosen by the first byte (0: not started)
    uint8_t phase = 0;
    uint8_t lo = 0x80, hi = 0xBF;  // string: the range of the next UTF-8 continuation byte
    int32_t count = 0;     // object: last property index; array: items; string: code points; number: digits
    int32_t pos = 0;       // literal/key: bytes matched; string: continuation bytes pending
    uint64_t cand = 0;     // literal/key candidates
  };

 private:
  enum Step { kReject, kConsumed, kRefeed };  // kRefeed: the stack changed, feed the byte to the new top
  Step start_value(Frame& f, uint8_t b);
  Step feed_object(Frame& f, uint8_t b);
  Step feed_array(Frame& f, uint8_t b);
  Step feed_string(Frame& f, uint8_t b);
  Step feed_number(Frame& f, uint8_t b);
  Step feed_literal(Frame& f, uint8_t b);
  const std::vector<std::string>& literals(const Frame& f) const;
  void push(int node);
  bool advance_once(uint8_t b);
  void finish_top();
  bool can_end(const Frame& f) const;

  const JsonGrammar* g_;
  std::vector<Frame> stack_;
  bool done_ = false;
};

}  // namespace k3::grammar
