#include "common/grammar/json_matcher.h"

namespace k3::grammar {

namespace {

constexpr uint8_t kEnum = 0x80;  // Frame::kind of an enum/const node (beside the ValueKind bits)

// Object phases: after '{', inside a declared key, before ':', after a value, after ',', a free key
// (child string) in progress, a value (child) in progress.
enum : uint8_t { O_START, O_KEY, O_COLON, O_AFTER, O_NEXT, O_FREEKEY, O_VALUE };
enum : uint8_t { A_START, A_VALUE, A_AFTER, A_NEXT };
enum : uint8_t { S_BODY, S_ESC, S_HEX, S_UTF8 };
enum : uint8_t { N_SIGN, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

const std::vector<std::string> kBooleans = {"true", "false"};
const std::vector<std::string> kNulls = {"null"};

bool is_digit(uint8_t b) { return b >= '0' && b <= '9'; }
bool is_hex(uint8_t b) { return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'); }
uint64_t all_of(size_t n) { return n >= 64 ? ~0ull : (1ull << n) - 1; }

// Declared properties a key may name next: after index `last`, without skipping a required one.
uint64_t next_keys(const SchemaNode& n, int32_t last) {
  uint64_t c = 0;
  for (size_t j = static_cast<size_t>(last + 1); j < n.props.size(); ++j) {
    c |= 1ull << j;
    if (n.props[j].required) break;
  }
  return c;
}

bool required_after(const SchemaNode& n, int32_t last) {
  for (size_t j = static_cast<size_t>(last + 1); j < n.props.size(); ++j)
    if (n.props[j].required) return true;
  return false;
}

}  // namespace

JsonMatcher::JsonMatcher(const JsonGrammar& g) : g_(&g) { push(g.root()); }

void JsonMatcher::push(int node) { stack_.push_back(Frame{.node = node}); }

bool JsonMatcher::advance(std::string_view bytes) {
  JsonMatcher copy = *this;
  if (copy.try_feed(bytes)) {
    *this = std::move(copy);
    return true;
  }
  return false;
}

bool JsonMatcher::try_feed(std::string_view bytes) {
  for (char c : bytes)
    if (!advance_once(static_cast<uint8_t>(c))) return false;
  return true;
}

bool JsonMatcher::can_end(const Frame& f) const {
  if (f.kind == kNumber || f.kind == kInteger)
    return f.phase == N_ZERO || f.phase == N_INT || f.phase == N_FRAC || f.phase == N_EXP;
  if (f.kind == kEnum || f.kind == kBoolean || f.kind == kNull) {
    const auto& lits = literals(f);
    for (size_t j = 0; j < lits.size(); ++j)
      if ((f.cand >> j & 1) && lits[j].size() == static_cast<size_t>(f.pos)) return true;
  }
  return false;
}

bool JsonMatcher::complete() const { return done_ || (stack_.size() == 1 && can_end(stack_.back())); }

const std::vector<std::string>& JsonMatcher::literals(const Frame& f) const {
  if (f.kind == kEnum) return g_->node(f.node).literals;
  return f.kind == kBoolean ? kBooleans : kNulls;
}

void JsonMatcher::finish_top() {
  stack_.pop_back();
  if (stack_.empty()) {
    done_ = true;
    return;
  }
  Frame& p = stack_.back();
  if (p.kind == kObject) p.phase = p.phase == O_FREEKEY ? O_COLON : O_AFTER;
  else if (p.kind == kArray) {
    ++p.count;
    p.phase = A_AFTER;
  }
}

bool JsonMatcher::advance_once(uint8_t b) {
  for (int guard = 0; guard < 2 * kMaxDepth + 4; ++guard) {
    if (done_ || stack_.empty()) return false;
    Frame& f = stack_.back();
    Step s;
    if (f.kind == 0) s = start_value(f, b);
    else if (f.kind == kObject) s = feed_object(f, b);
    else if (f.kind == kArray) s = feed_array(f, b);
    else if (f.kind == kString) s = feed_string(f, b);
    else if (f.kind == kNumber || f.kind == kInteger) s = feed_number(f, b);
    else s = feed_literal(f, b);
    if (s != kRefeed) return s == kConsumed;
  }
  return false;
}

JsonMatcher::Step JsonMatcher::start_value(Frame& f, uint8_t b) {
  const SchemaNode& n = g_->node(f.node);
  if (!n.literals.empty()) {
    f.kind = kEnum;
    f.cand = all_of(n.literals.size());
    return kRefeed;
  }
  const size_t depth = stack_.size();
  const bool room = depth <= static_cast<size_t>(kMaxDepth) + 1 &&
                    (f.node != JsonGrammar::kAnyNode || depth <= static_cast<size_t>(kMaxAnyDepth));
  if (b == '{' && (n.kinds & kObject) && room) {
    f.kind = kObject, f.phase = O_START, f.count = -1;
    return kConsumed;
  }
  if (b == '[' && (n.kinds & kArray) && room) {
    f.kind = kArray, f.phase = A_START, f.count = 0;
    return kConsumed;
  }
  if (b == '"' && (n.kinds & kString)) {
    f.kind = kString, f.phase = S_BODY, f.count = 0;
    return kConsumed;
  }
  if ((b == '-' || is_digit(b)) && (n.kinds & (kNumber | kInteger))) {
    f.kind = (n.kinds & kNumber) ? kNumber : kInteger;
    f.phase = b == '-' ? N_SIGN : b == '0' ? N_ZERO : N_INT;
    f.count = is_digit(b) ? 1 : 0;
    return kConsumed;
  }
  if ((b == 't' || b == 'f') && (n.kinds & kBoolean)) {
    f.kind = kBoolean, f.cand = 3, f.pos = 0;
    return kRefeed;
  }
  if (b == 'n' && (n.kinds & kNull)) {
    f.kind = kNull, f.cand = 1, f.pos = 0;
    return kRefeed;
  }
  return kReject;
}

JsonMatcher::Step JsonMatcher::feed_object(Frame& f, uint8_t b) {
  const SchemaNode& n = g_->node(f.node);
  switch (f.phase) {
    case O_START:
    case O_NEXT:
      if (b == '}' && f.phase == O_START && (n.free_keys || !required_after(n, f.count))) {
        finish_top();
        return kConsumed;
      }
      if (b != '"') return kReject;
      if (n.free_keys) {
        f.phase = O_FREEKEY;
        push(JsonGrammar::kAnyString);
        return kRefeed;
      }
      f.cand = next_keys(n, f.count);
      if (!f.cand) return kReject;
      f.phase = O_KEY, f.pos = 1;
      return kConsumed;
    case O_KEY: {
      uint64_t next = 0;
      for (size_t j = 0; j < n.props.size(); ++j) {
        const std::string& k = n.props[j].key;
        if ((f.cand >> j & 1) && k.size() > static_cast<size_t>(f.pos) && static_cast<uint8_t>(k[f.pos]) == b)
          next |= 1ull << j;
      }
      if (!next) return kReject;
      f.cand = next, ++f.pos;
      for (size_t j = 0; j < n.props.size(); ++j)
        if ((next >> j & 1) && n.props[j].key.size() == static_cast<size_t>(f.pos)) {
          f.count = static_cast<int32_t>(j);  // a whole key (quotes included) names one property
          f.phase = O_COLON;
        }
      return kConsumed;
    }
    case O_COLON:
      if (b != ':') return kReject;
      f.phase = O_VALUE;
      push(n.free_keys ? JsonGrammar::kAnyNode : n.props[static_cast<size_t>(f.count)].node);
      return kConsumed;
    case O_AFTER:
      if (b == ',' && (n.free_keys || static_cast<size_t>(f.count + 1) < n.props.size())) {
        f.phase = O_NEXT;
        return kConsumed;
      }
      if (b == '}' && (n.free_keys || !required_after(n, f.count))) {
        finish_top();
        return kConsumed;
      }
      return kReject;
    default:
      return kReject;  // a child frame is on top while in O_FREEKEY / O_VALUE
  }
}

JsonMatcher::Step JsonMatcher::feed_array(Frame& f, uint8_t b) {
  const SchemaNode& n = g_->node(f.node);
  switch (f.phase) {
    case A_START:
      if (b == ']' && n.min_items == 0) {
        finish_top();
        return kConsumed;
      }
      if (n.max_items == 0) return kReject;
      [[fallthrough]];
    case A_NEXT:
      f.phase = A_VALUE;
      push(n.items);
      return kRefeed;
    case A_AFTER:
      if (b == ',' && (n.max_items < 0 || f.count < n.max_items)) {
        f.phase = A_NEXT;
        return kConsumed;
      }
      if (b == ']' && f.count >= n.min_items) {
        finish_top();
        return kConsumed;
      }
      return kReject;
    default:
      return kReject;
  }
}

JsonMatcher::Step JsonMatcher::feed_string(Frame& f, uint8_t b) {
  const SchemaNode& n = g_->node(f.node);
  switch (f.phase) {
    case S_BODY:
      if (b == '"') {
        if (f.count < n.min_length) return kReject;
        finish_top();
        return kConsumed;
      }
      if (b < 0x20 || (n.max_length >= 0 && f.count >= n.max_length)) return kReject;
      if (b == '\\') f.phase = S_ESC;
      else if (b >= 0x80) {
        // UTF-8 lead byte: how many continuation bytes follow, and the first one's range (no
        // overlong forms, no surrogates, nothing above U+10FFFF).
        f.lo = 0x80, f.hi = 0xBF;
        if (b >= 0xC2 && b <= 0xDF) f.pos = 1;
        else if (b >= 0xE0 && b <= 0xEF) f.pos = 2, f.lo = b == 0xE0 ? 0xA0 : 0x80, f.hi = b == 0xED ? 0x9F : 0xBF;
        else if (b >= 0xF0 && b <= 0xF4) f.pos = 3, f.lo = b == 0xF0 ? 0x90 : 0x80, f.hi = b == 0xF4 ? 0x8F : 0xBF;
        else return kReject;
        f.phase = S_UTF8;
      }
      ++f.count;
      return kConsumed;
    case S_ESC:
      if (b == 'u') {
        f.phase = S_HEX, f.pos = 4;
        return kConsumed;
      }
      if (b != '"' && b != '\\' && b != '/' && b != 'b' && b != 'f' && b != 'n' && b != 'r' && b != 't') return kReject;
      f.phase = S_BODY;
      return kConsumed;
    case S_HEX:
      if (!is_hex(b)) return kReject;
      if (--f.pos == 0) f.phase = S_BODY;
      return kConsumed;
    case S_UTF8:
      if (b < f.lo || b > f.hi) return kReject;
      f.lo = 0x80, f.hi = 0xBF;
      if (--f.pos == 0) f.phase = S_BODY;
      return kConsumed;
    default:
      return kReject;
  }
}

JsonMatcher::Step JsonMatcher::feed_number(Frame& f, uint8_t b) {
  const bool real = f.kind == kNumber;
  auto end = [&] {  // the byte belongs to whatever follows the number
    if (!can_end(f)) return kReject;
    finish_top();
    return kRefeed;
  };
  auto digit = [&](int cap, uint8_t next_phase) {
    if (f.phase != next_phase) f.count = 0;
    if (f.count >= cap) return end();
    f.phase = next_phase, ++f.count;
    return kConsumed;
  };
  switch (f.phase) {
    case N_SIGN:
      if (!is_digit(b)) return kReject;
      f.phase = b == '0' ? N_ZERO : N_INT, f.count = 1;
      return kConsumed;
    case N_ZERO:
    case N_INT:
      if (is_digit(b) && f.phase == N_INT) return digit(kMaxIntDigits, N_INT);
      if (b == '.' && real) return f.phase = N_DOT, kConsumed;
      if ((b == 'e' || b == 'E') && real) return f.phase = N_E, kConsumed;
      return end();
    case N_DOT:
      return is_digit(b) ? digit(kMaxFracDigits, N_FRAC) : kReject;
    case N_FRAC:
      if (is_digit(b)) return digit(kMaxFracDigits, N_FRAC);
      if (b == 'e' || b == 'E') return f.phase = N_E, kConsumed;
      return end();
    case N_E:
      if (b == '+' || b == '-') return f.phase = N_ESIGN, kConsumed;
      return is_digit(b) ? digit(kMaxExpDigits, N_EXP) : kReject;
    case N_ESIGN:
      return is_digit(b) ? digit(kMaxExpDigits, N_EXP) : kReject;
    case N_EXP:
      return is_digit(b) ? digit(kMaxExpDigits, N_EXP) : end();
    default:
      return kReject;
  }
}

JsonMatcher::Step JsonMatcher::feed_literal(Frame& f, uint8_t b) {
  const auto& lits = literals(f);
  uint64_t next = 0;
  bool longer = false;
  for (size_t j = 0; j < lits.size(); ++j)
    if ((f.cand >> j & 1) && lits[j].size() > static_cast<size_t>(f.pos) && static_cast<uint8_t>(lits[j][f.pos]) == b)
      next |= 1ull << j;
  if (!next) {
    if (!can_end(f)) return kReject;
    finish_top();
    return kRefeed;
  }
  f.cand = next, ++f.pos;
  for (size_t j = 0; j < lits.size(); ++j)
    if ((next >> j & 1) && lits[j].size() > static_cast<size_t>(f.pos)) longer = true;
  if (!longer) finish_top();  // every candidate is whole: nothing can extend it
  return kConsumed;
}

}  // namespace k3::grammar
