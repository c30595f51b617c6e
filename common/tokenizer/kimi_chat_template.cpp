#include "common/tokenizer/kimi_chat_template.h"

namespace k3 {

// Written for this project in the family's turn format (see chat_template.h for the layout).
// Whitespace: every tag strips around itself ({%- -%}), so only the literal text between tags
// reaches the output.
std::string_view kimi_chat_template_jinja() {
  return R"jinja({#- One turn per message: <|im_ROLE|>HEADER<|im_middle|>BODY<|im_end|>. -#}
{%- macro turn_start(role, header) -%}
  {%- if role == 'user' -%}
    <|im_user|>
  {%- elif role == 'assistant' -%}
    <|im_assistant|>
  {%- elif role == 'system' or role == 'tool' -%}
    <|im_system|>
  {%- else -%}
    {{- raise_exception('unknown role "' ~ role ~ '" (expected system, user, assistant or tool)') -}}
  {%- endif -%}
  {{- header -}}<|im_middle|>
{%- endmacro -%}

{%- if tools -%}
  <|im_system|>tool_declare<|im_middle|>{{ tools | tojson(separators=(',', ':')) }}<|im_end|>
{%- endif -%}
{%- if messages | length == 0 -%}
  {{- raise_exception('messages: the list is empty') -}}
{%- endif -%}
{%- if messages[0].role != 'system' -%}
  <|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>
{%- endif -%}

{%- for message in messages -%}
  {{- turn_start(message.role, message.get('name') or message.role) -}}
  {%- if message.role == 'tool' and message.get('tool_call_id') -%}
    ## Return of {{ message.tool_call_id }}{{ '\n' }}
  {%- endif -%}
  {%- if message.content is string -%}
    {{- message.content -}}
  {%- elif message.content is not none and message.content is defined -%}
    {%- for part in message.content if part.type == 'text' -%}
      {{- part.text -}}
    {%- endfor -%}
  {%- endif -%}
  {%- if message.role == 'assistant' and message.get('tool_calls') -%}
    <|tool_calls_section_begin|>
    {%- for call in message.tool_calls -%}
      {%- set arguments = call.function.arguments -%}
      <|tool_call_begin|>{{ call.id }}<|tool_call_argument_begin|>
      {{- arguments if arguments is string else arguments | tojson -}}
      <|tool_call_end|>
    {%- endfor -%}
    <|tool_calls_section_end|>
  {%- endif -%}
  <|im_end|>
{%- endfor -%}

{%- if add_generation_prompt -%}
  <|im_assistant|>assistant<|im_middle|>
{%- endif -%}
)jinja";
}

}  // namespace k3
