#include "common/grammar/token_constraint.h"

#include <algorithm>
#include <cstring>

#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"

namespace k3::grammar {

namespace {
const std::string kNoBytes;

void allow(uint32_t* words, int64_t vocab, int32_t id, bool yes) {
  if (id < 0 || id >= vocab) return;
  if (yes) words[id / 32] |= 1u << (id % 32);
  else words[id / 32] &= ~(1u << (id % 32));
}
}  // namespace

std::shared_ptr<const TokenVocab> TokenVocab::from_tokenizer(const Tokenizer& tok) {
  auto v = std::make_shared<TokenVocab>();
  const int n = tok.vocab_size();
  v->bytes.resize(static_cast<size_t>(n));
  v->special.resize(static_cast<size_t>(n), 0);
  for (int32_t id = 0; id < n; ++id) {
    v->special[static_cast<size_t>(id)] = tok.is_special(id) ? 1 : 0;
    if (tok.is_special(id)) continue;
    auto b = tok.decode_bytes(std::span<const int32_t>(&id, 1));
    if (b.is_ok()) v->bytes[static_cast<size_t>(id)] = std::move(b).value();
  }
  auto id_of = [&tok](std::string_view text) { return tok.special_id(text).value_or(-1); };
  v->tools = {.section_begin = id_of(kToolCallsBegin), .section_end = id_of(kToolCallsEnd),
              .call_begin = id_of(kToolCallBegin), .arguments = id_of(kToolCallArguments),
              .call_end = id_of(kToolCallEnd)};
  return v;
}

TokenConstraint::TokenConstraint(std::shared_ptr<const JsonGrammar> grammar, std::shared_ptr<const TokenVocab> vocab,
                                 std::vector<int32_t> stop_ids)
    : document_(std::move(grammar)), vocab_(std::move(vocab)), stop_ids_(std::move(stop_ids)) {
  matcher_.emplace(*document_);
}

TokenConstraint::TokenConstraint(std::shared_ptr<const ToolCallGrammar> grammar, std::shared_ptr<const TokenVocab> vocab,
                                 std::vector<int32_t> stop_ids)
    : tools_(std::move(grammar)), vocab_(std::move(vocab)), stop_ids_(std::move(stop_ids)) {
  phase_ = tools_->mode == ToolCallMode::Required ? Phase::SectionBegin : Phase::Free;
}

Result<std::unique_ptr<TokenConstraint>> TokenConstraint::create(const CompiledFormat& format,
                                                                 std::shared_ptr<const TokenVocab> vocab,
                                                                 std::vector<int32_t> stop_ids) {
  if (!format.constrained()) return std::unique_ptr<TokenConstraint>();
  if (!vocab) return invalid_argument("structured output needs the tokenizer's vocabulary, which this node did not load");
  if (format.document) return std::make_unique<TokenConstraint>(format.document, std::move(vocab), std::move(stop_ids));
  if (!vocab->tools.present()) return invalid_argument("tool calls need the tokenizer's tool-call tokens, which it lacks");
  return std::make_unique<TokenConstraint>(format.tool_calls, std::move(vocab), std::move(stop_ids));
}

Result<std::unique_ptr<TokenConstraint>> TokenConstraint::for_format(const std::string& wire,
                                                                     std::shared_ptr<const TokenVocab> vocab,
                                                                     std::vector<int32_t> stop_ids) {
  K3_ASSIGN_OR_RETURN(OutputFormat format, OutputFormat::parse(wire));
  if (!format.constrained()) return std::unique_ptr<TokenConstraint>();
  K3_ASSIGN_OR_RETURN(CompiledFormat compiled, format.compile());
  return create(compiled, std::move(vocab), std::move(stop_ids));
}

bool TokenConstraint::is_stop(int32_t id) const {
  return std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end();
}

bool TokenConstraint::closed() const { return tools_ ? phase_ == Phase::End : matcher_->closed(); }

bool TokenConstraint::complete() const {
  return tools_ ? phase_ == Phase::Free || phase_ == Phase::End : matcher_->complete();
}

const std::string& TokenConstraint::token_bytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= vocab_->bytes.size() || vocab_->special[static_cast<size_t>(id)]) return kNoBytes;
  return vocab_->bytes[static_cast<size_t>(id)];
}

bool TokenConstraint::name_prefix(const std::string& name) const {
  for (const std::string& fn : tools_->names) {
    const std::string whole = tool_call_id(fn, tools_->first_index + calls_);
    if (whole.size() >= name.size() && whole.compare(0, name.size(), name) == 0) return true;
  }
  return false;
}

int TokenConstraint::full_name() const {
  for (size_t i = 0; i < tools_->names.size(); ++i)
    if (name_ == tool_call_id(tools_->names[i], tools_->first_index + calls_)) return static_cast<int>(i);
  return -1;
}

// The whole state as bytes: two states with equal keys allow the same tokens.
std::string TokenConstraint::state_key() const {
  std::string key(1, static_cast<char>(phase_));
  auto put = [&key](auto v) { key.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(function_), put(calls_);
  if (phase_ == Phase::Name) key += name_;
  if (matcher_ && (phase_ == Phase::Document || phase_ == Phase::Arguments)) {
    key += matcher_->closed() ? '\1' : '\0';
    for (const JsonMatcher::Frame& f : matcher_->frames())
      put(f.node), put(f.kind), put(f.phase), put(f.lo), put(f.hi), put(f.count), put(f.pos), put(f.cand);
  }
  return key;
}

void TokenConstraint::fill_text(uint32_t* words, int64_t vocab) const {
  const int64_t n = std::min<int64_t>(vocab, static_cast<int64_t>(vocab_->bytes.size()));
  switch (phase_) {
    case Phase::Document:
    case Phase::Arguments: {
      JsonMatcher scratch = *matcher_;
      for (int32_t id = 0; id < n; ++id) {
        const std::string& bytes = token_bytes(id);
        if (bytes.empty()) continue;
        scratch = *matcher_;
        if (scratch.try_feed(bytes)) allow(words, vocab, id, true);
      }
      return;
    }
    case Phase::Name:
      for (int32_t id = 0; id < n; ++id) {
        const std::string& bytes = token_bytes(id);
        if (!bytes.empty() && name_prefix(name_ + bytes)) allow(words, vocab, id, true);
      }
      return;
    case Phase::Free:  // any token at all; the tool-call tokens are decided after
      for (int64_t w = 0; w < (vocab + 31) / 32; ++w) words[w] = ~0u;
      if (vocab % 32) words[vocab / 32] &= (1u << (vocab % 32)) - 1;
      return;
    default:
      return;  // only special tokens fit here
  }
}

void TokenConstraint::fill_tool_tokens(uint32_t* words, int64_t vocab) const {
  const ToolTokens& t = vocab_->tools;
  for (int32_t id : {t.section_begin, t.section_end, t.call_begin, t.arguments, t.call_end}) allow(words, vocab, id, false);
  switch (phase_) {
    case Phase::Free: allow(words, vocab, t.section_begin, tools_->mode == ToolCallMode::Auto); break;
    case Phase::SectionBegin: allow(words, vocab, t.section_begin, true); break;
    case Phase::CallBegin: allow(words, vocab, t.call_begin, true); break;
    case Phase::Name: allow(words, vocab, t.arguments, full_name() >= 0); break;
    case Phase::Arguments: allow(words, vocab, t.call_end, matcher_->complete()); break;
    case Phase::AfterCall:
      allow(words, vocab, t.section_end, true);
      allow(words, vocab, t.call_begin, tools_->parallel);
      break;
    default: break;
  }
}

int64_t TokenConstraint::fill_mask(uint32_t* words, int64_t vocab) {
  const int64_t n_words = (vocab + 31) / 32;
  const std::string key = state_key();
  if (auto it = cache_.find(key); it != cache_.end() && static_cast<int64_t>(it->second.size()) == n_words) {
    std::memcpy(words, it->second.data(), it->second.size() * sizeof(uint32_t));
  } else {
    fill_text(words, vocab);
    if (cache_.size() >= kMaskCacheStates) cache_.clear();
    cache_[key].assign(words, words + n_words);
  }
  // Special tokens and stop ids are set outside the cache, so a cached mask never carries another
  // request's stop ids.
  if (tools_) fill_tool_tokens(words, vocab);
  for (int32_t id : stop_ids_) allow(words, vocab, id, complete());
  int64_t allowed = 0;
  for (int64_t w = 0; w < n_words; ++w) allowed += __builtin_popcount(words[w]);
  return allowed;
}

Status TokenConstraint::accept(int32_t id) {
  if (tools_) return accept_tool(id);
  if (is_stop(id)) {
    if (!complete()) return internal_error("constrained decoding: stop id " + std::to_string(id) + " before the JSON document is complete");
    return Status::ok();
  }
  const std::string& bytes = token_bytes(id);
  if (bytes.empty() || !matcher_->advance(bytes))
    return internal_error("constrained decoding: token " + std::to_string(id) + " does not fit the JSON grammar here");
  return Status::ok();
}

Status TokenConstraint::accept_tool(int32_t id) {
  const ToolTokens& t = vocab_->tools;
  auto refuse = [id](const char* where) {
    return internal_error("constrained decoding: token " + std::to_string(id) + " does not fit the tool-call section " + where);
  };
  if (is_stop(id)) return complete() ? Status::ok() : refuse("(a stop before the section ended)");
  switch (phase_) {
    case Phase::Free:
      if (!t.contains(id)) return Status::ok();
      if (id != t.section_begin || tools_->mode != ToolCallMode::Auto) return refuse("(a tool-call token in free text)");
      phase_ = Phase::CallBegin;
      return Status::ok();
    case Phase::SectionBegin:
      if (id != t.section_begin) return refuse("at its start");
      phase_ = Phase::CallBegin;
      return Status::ok();
    case Phase::CallBegin:
      if (id != t.call_begin) return refuse("before a call");
      phase_ = Phase::Name, name_.clear();
      return Status::ok();
    case Phase::Name: {
      if (id == t.arguments) {
        function_ = full_name();
        if (function_ < 0) return refuse("(the call's name is not whole)");
        matcher_.emplace(tools_->arguments[static_cast<size_t>(function_)]);
        phase_ = Phase::Arguments;
        return Status::ok();
      }
      const std::string& bytes = token_bytes(id);
      if (bytes.empty() || !name_prefix(name_ + bytes)) return refuse("in the call's name");
      name_ += bytes;
      return Status::ok();
    }
    case Phase::Arguments: {
      if (id == t.call_end) {
        if (!matcher_->complete()) return refuse("(the arguments are not a whole JSON object)");
        ++calls_, phase_ = Phase::AfterCall;
        return Status::ok();
      }
      const std::string& bytes = token_bytes(id);
      if (bytes.empty() || !matcher_->advance(bytes)) return refuse("in the call's arguments");
      return Status::ok();
    }
    case Phase::AfterCall:
      if (id == t.section_end) phase_ = Phase::End;
      else if (id == t.call_begin && tools_->parallel) phase_ = Phase::Name, name_.clear();
      else return refuse("after a call");
      return Status::ok();
    default:
      return refuse("after its end");
  }
}

}  // namespace k3::grammar
