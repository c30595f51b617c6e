#include "router/tool_call_output.h"

#include <algorithm>

namespace k3::router {

std::string function_of_call_id(const std::string& id) {
  const size_t colon = id.rfind(':');
  if (!id.starts_with("functions.") || colon == std::string::npos || colon < 10) return id;
  return id.substr(10, colon - 10);
}

ToolCallOutput::ToolCallOutput(std::shared_ptr<const Tokenizer> tok, std::vector<std::string> stop_strings,
                               std::vector<int32_t> stop_ids)
    : tok_(tok),
      stop_ids_(std::move(stop_ids)),
      section_begin_(tok->special_id(kToolCallsBegin).value_or(-1)),
      section_end_(tok->special_id(kToolCallsEnd).value_or(-1)),
      call_begin_(tok->special_id(kToolCallBegin).value_or(-1)),
      arguments_(tok->special_id(kToolCallArguments).value_or(-1)),
      call_end_(tok->special_id(kToolCallEnd).value_or(-1)),
      content_(tokenizer_text_stream(tok, std::move(stop_strings), stop_ids_)) {}

void ToolCallOutput::add(Piece& p, int call, std::string args) {
  if (args.empty()) return;
  calls_[static_cast<size_t>(call)].arguments += args;
  if (!p.calls.empty() && p.calls.back().index == call) p.calls.back().arguments += args;
  else p.calls.push_back({.index = call, .arguments = std::move(args)});
}

Result<ToolCallOutput::Piece> ToolCallOutput::push(int32_t id) {
  Piece p;
  const int current = static_cast<int>(calls_.size()) - 1;
  switch (phase_) {
    case Phase::Content: {
      if (id == section_begin_) {
        p.content = content_.flush();  // the content is over: nothing it holds can become a stop string
        phase_ = Phase::Section;
        return p;
      }
      K3_ASSIGN_OR_RETURN(p.content, content_.push(id));
      return p;
    }
    case Phase::Section:
      if (id == call_begin_) phase_ = Phase::Name, name_.clear();
      else if (id == section_end_) phase_ = Phase::Over;
      return p;
    case Phase::Name: {
      if (id == arguments_) {
        calls_.push_back({.id = name_, .name = function_of_call_id(name_)});
        p.calls.push_back({.index = current + 1, .id = calls_.back().id, .name = calls_.back().name});
        args_.emplace(tokenizer_text_stream(tok_, {}, {}));
        phase_ = Phase::Arguments;
      } else if (!tok_->is_special(id) && tok_->assigns(id)) {
        K3_ASSIGN_OR_RETURN(std::string bytes, tok_->decode_bytes(std::span<const int32_t>(&id, 1)));
        name_ += bytes;
      }
      return p;
    }
    case Phase::Arguments:
      if (id == call_end_) {
        add(p, current, args_->flush());
        args_.reset();
        ++finished_;
        phase_ = Phase::Section;
        return p;
      }
      {
        K3_ASSIGN_OR_RETURN(std::string args, args_->push(id));
        add(p, current, std::move(args));
      }
      return p;
    case Phase::Over:
      return p;
  }
  return p;
}

ToolCallOutput::Piece ToolCallOutput::finish() {
  Piece p;
  if (phase_ == Phase::Content) p.content = content_.flush();
  if (phase_ == Phase::Arguments && args_) add(p, static_cast<int>(calls_.size()) - 1, args_->flush());
  return p;
}

}  // namespace k3::router
