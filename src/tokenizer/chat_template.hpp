// Chat templates rendered in C++ (no template engine): DeepSeek-V4 and Kimi-K3, producing
// exactly what transformers' apply_chat_template renders from llama.cpp's template texts
// (models/templates/deepseek-ai-DeepSeek-V4.jinja, models/templates/Kimi-K3.jinja) for
// conversations of system / user / assistant (+ DeepSeek developer) text messages, tool
// declarations (OpenAI `tools`), assistant tool calls and tool results, in each vendor's own
// tool-call format (DeepSeek-V4: `<｜DSML｜tool_calls>` blocks; Kimi-K3: `<|open|>tools<|sep|>`
// calls with typed arguments). Images are not supported. Checked against
// tests/data/tokenizer/chat_goldens.jsonl and chat_tool_goldens.jsonl
// (tests/oracle/chat_template_goldens.py).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ep::tokenizer {

class Tokenizer;

enum class ChatTemplate { deepseek_v4, kimi_k3 };

/// "deepseek-v4" / "kimi-k3".
const char *chat_template_name(ChatTemplate t) noexcept;
/// Parses "deepseek-v4" / "deepseek4" / "kimi-k3" (case-insensitive); nullopt otherwise.
std::optional<ChatTemplate> chat_template_by_name(std::string_view name);

/// One tool call of an assistant message (OpenAI's `tool_calls[i]`, type "function").
struct ToolCall {
  std::string id;         ///< the call's id; a tool message answers it by its tool_call_id
  std::string name;       ///< the function's name
  std::string arguments;  ///< the arguments as OpenAI sends them: a JSON object's text
};

struct ChatMessage {
  std::string role;       ///< system, user, assistant, tool; DeepSeek-V4 also developer
  std::string content;    ///< empty = none (the templates render None and "" alike)
  std::string reasoning;  ///< assistant reasoning_content (shown when thinking is on)
  std::vector<ToolCall> tool_calls = {};  ///< assistant: the calls it made
  std::string tool_call_id = {};          ///< tool: the call it answers
  std::string name = {};                  ///< OpenAI's `name` (Kimi-K3 renders it; for a tool message, the function's name)
};

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  /// nullopt = the template's default (DeepSeek-V4: off; Kimi-K3: on).
  std::optional<bool> thinking;
  /// Kimi-K3 thinking_effort: low, medium, high or max.
  std::string thinking_effort = "max";
  /// The tools offered: OpenAI's `tools` array as JSON text (each {"type": "function",
  /// "function": {"name", "description", "parameters"}}); empty = none.
  std::string tools_json;
  /// OpenAI's tool_choice when it is a string ("auto", "none", "required"), passed to the
  /// template as its `tool_choice` (Kimi-K3 renders a note for "none" and "required"); empty = not passed.
  std::string tool_choice;
  /// DeepSeek-V4's bos_token text.
  std::string bos_token = "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>";
};

/// Renders @p messages. Throws Status::invalid_argument for a role the template does not take,
/// tools or tool-call arguments that are not the JSON the template needs, or a Kimi-K3 tool
/// message whose function name cannot be resolved (as the template raises).
std::string render_chat(ChatTemplate t, std::span<const ChatMessage> messages, const ChatRenderOptions &options = {});

/// The template a jinja template text is (by its markers), or nullopt.
std::optional<ChatTemplate> detect_chat_template_text(std::string_view jinja);
/// The template a tokenizer's special tokens imply (<｜User｜> → DeepSeek-V4, <|open|> → Kimi-K3), or nullopt.
std::optional<ChatTemplate> detect_chat_template_tokens(const Tokenizer &tokenizer);
/// The chat template text stored with a tokenizer file: GGUF `tokenizer.chat_template`, or
/// `chat_template` of a tokenizer_config.json beside a tokenizer.json; nullopt when none.
std::optional<std::string> read_chat_template_text(const std::string &tokenizer_path);

/// The special-token text a template ends an assistant turn with (DeepSeek-V4: EOS; Kimi-K3: <|end_of_msg|>).
std::string end_of_turn_token(ChatTemplate t);

/// Text that, appended to a generation prompt rendered with @p options, begins an assistant
/// turn with a tool call in the template's format: the call-section opener and, when @p name is
/// not empty, the call's opening with that function name (the continuation vLLM and SGLang
/// force for a named tool_choice without a grammar). With thinking on, the thinking block is
/// closed first (empty).
std::string tool_call_prefix(ChatTemplate t, const ChatRenderOptions &options, std::string_view name);

/// @p json (any JSON text) as Python's json.dumps(ensure_ascii=False) writes it, keys in their
/// order: what transformers' `tojson` filter renders. Throws Status::invalid_argument when @p json is not JSON.
std::string python_json(std::string_view json);

/// True when every character of @p s is whitespace as Python's str.isspace() (jinja `trim`) sees it.
bool is_python_blank(std::string_view s);

}  // namespace ep::tokenizer
