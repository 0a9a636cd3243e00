// Chat templates rendered in C++ (no template engine): DeepSeek-V4 and Kimi-K3, producing
// exactly what transformers' apply_chat_template renders from llama.cpp's template texts
// (models/templates/deepseek-ai-DeepSeek-V4.jinja, models/templates/Kimi-K3.jinja) for
// conversations of system / user / assistant (+ DeepSeek developer / tool) text messages.
// Tool declarations, tool calls and images are not supported. Checked against
// tests/data/tokenizer/chat_goldens.jsonl (tests/oracle/chat_template_goldens.py).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace ep::tokenizer {

class Tokenizer;

enum class ChatTemplate { deepseek_v4, kimi_k3 };

/// "deepseek-v4" / "kimi-k3".
const char *chat_template_name(ChatTemplate t) noexcept;
/// Parses "deepseek-v4" / "deepseek4" / "kimi-k3" (case-insensitive); nullopt otherwise.
std::optional<ChatTemplate> chat_template_by_name(std::string_view name);

struct ChatMessage {
  std::string role;       ///< system, user, assistant; DeepSeek-V4 also developer, tool
  std::string content;    ///< empty = none (the templates render None and "" alike)
  std::string reasoning;  ///< assistant reasoning_content (shown when thinking is on)
};

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  /// nullopt = the template's default (DeepSeek-V4: off; Kimi-K3: on).
  std::optional<bool> thinking;
  /// Kimi-K3 thinking_effort: low, medium, high or max.
  std::string thinking_effort = "max";
  /// DeepSeek-V4's bos_token text.
  std::string bos_token = "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>";
};

/// Renders @p messages. Throws Status::invalid_argument for a role the template does not take
/// and Status::unsupported for what is not implemented (Kimi-K3 tool messages).
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

/// True when every character of @p s is whitespace as Python's str.isspace() (jinja `trim`) sees it.
bool is_python_blank(std::string_view s);

}  // namespace ep::tokenizer
