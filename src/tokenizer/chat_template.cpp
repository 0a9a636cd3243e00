// Chat templates in C++; see chat_template.hpp and docs/tokenizer.md ("Chat templates").
#include "tokenizer/chat_template.hpp"

#include "core/error.hpp"
#include "format/file_format.hpp"
#include "format/gguf.hpp"
#include "tokenizer/tokenizer.hpp"
#include "tokenizer/utf8.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace ep::tokenizer {

namespace {

// DeepSeek-V4 markers (fullwidth vertical bar U+FF5C, lower one-eighth block U+2581).
const std::string kDsUser = "<｜User｜>";
const std::string kDsAssistant = "<｜Assistant｜>";
const std::string kDsEos = "<｜end▁of▁sentence｜>";
const std::string kThinkOpen = "<think>";
const std::string kThinkClose = "</think>";

std::string render_deepseek_v4(std::span<const ChatMessage> messages, const ChatRenderOptions &o) {
  const bool thinking = o.thinking.value_or(false);
  std::string system_prompt;
  bool first_sp = true;
  for (const ChatMessage &m : messages) {
    if (m.role != "system") continue;
    if (!first_sp) system_prompt += "\n\n";
    system_prompt += m.content;
    first_sp = false;
  }
  std::string out = o.bos_token + system_prompt;
  std::ptrdiff_t last_user = -1;
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string &r = messages[i].role;
    if (r == "user" || r == "developer" || r == "tool") last_user = static_cast<std::ptrdiff_t>(i);
  }
  bool in_user = false;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage &m = messages[i];
    if (m.role == "user" || m.role == "developer" || m.role == "tool") {
      out += in_user ? "\n\n" : kDsUser;
      in_user = true;
      if (m.role == "tool")
        out += "<tool_result>" + m.content + "</tool_result>";
      else
        out += m.content;
    } else if (m.role == "assistant") {
      in_user = false;
      out += kDsAssistant;
      if (static_cast<std::ptrdiff_t>(i) > last_user && thinking)
        out += kThinkOpen + m.reasoning + kThinkClose;
      else
        out += kThinkClose;
      out += m.content;
      out += kDsEos;
    } else if (m.role != "system") {
      fail(Status::invalid_argument, "DeepSeek-V4 chat template: message {} has role '{}' (expected system, user, developer, assistant or tool)",
           i, m.role);
    }
  }
  if (o.add_generation_prompt) out += kDsAssistant + (thinking ? kThinkOpen : kThinkOpen + kThinkClose);
  return out;
}

std::string escape_attr(const std::string &v) {
  std::string r;
  for (char c : v) {
    if (c == '&') r += "&amp;";
    else if (c == '"') r += "&quot;";
    else r += c;
  }
  return r;
}

std::string open_tag(const std::string &tag, std::initializer_list<std::pair<const char *, std::string>> attrs = {}) {
  std::string r = "<|open|>" + tag;
  for (const auto &[k, v] : attrs) r += std::string(" ") + k + "=\"" + escape_attr(v) + "\"";
  return r + "<|sep|>";
}
std::string close_tag(const std::string &tag) { return "<|close|>" + tag + "<|sep|>"; }
const std::string kEndOfMsg = "<|end_of_msg|>";

/// Python str.strip() of the whitespace Python's isspace() knows.
std::string python_strip(std::string_view s);

std::string render_kimi_k3(std::span<const ChatMessage> messages, const ChatRenderOptions &o) {
  const bool thinking = o.thinking.value_or(true);
  const std::string &effort = o.thinking_effort;
  const bool known_effort = effort == "low" || effort == "medium" || effort == "high" || effort == "max";
  if (thinking && !known_effort)
    fail(Status::invalid_argument, "Kimi-K3 chat template: unsupported thinking_effort={}; supported values are low, medium, high, and max.", effort);
  std::string out;
  if (thinking) {
    const std::string body =
        "`thinking_effort` guides on how much to think in your thinking channel (not including the response channel), "
        "supported values include `low`, `medium`, `high`, and `max`.\nNow the system is invoked with `thinking_effort=" +
        effort + "`.";
    out += open_tag("message", {{"role", "system"}, {"type", "thinking-effort"}}) + python_strip(body) + close_tag("message") + kEndOfMsg;
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage &m = messages[i];
    if (m.role == "user" || m.role == "system") {
      out += open_tag("message", {{"role", m.role}}) + m.content + close_tag("message") + kEndOfMsg;
    } else if (m.role == "assistant") {
      out += open_tag("message", {{"role", "assistant"}});
      if (thinking) {
        out += open_tag("think");
        if (!is_python_blank(m.reasoning)) out += m.reasoning;
        out += close_tag("think");
      }
      out += open_tag("response") + m.content + close_tag("response");
      out += close_tag("message") + kEndOfMsg;
    } else if (m.role == "tool") {
      fail(Status::unsupported, "Kimi-K3 chat template: message {} is a tool message (tool calls are not supported)", i);
    } else {
      fail(Status::invalid_argument, "Kimi-K3 chat template: message {} has role '{}' (expected system, user or assistant)", i, m.role);
    }
  }
  if (o.add_generation_prompt) out += open_tag("message", {{"role", "assistant"}}) + open_tag(thinking ? "think" : "response");
  return out;
}

/// Decodes one UTF-8 code point at s[i] (input already validated); advances i.
uint32_t next_cp(std::string_view s, size_t &i) {
  const auto b = static_cast<unsigned char>(s[i]);
  int n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
  uint32_t cp = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
  for (int k = 1; k < n && i + static_cast<size_t>(k) < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + static_cast<size_t>(k)]) & 0x3F);
  i += static_cast<size_t>(n);
  return cp;
}

bool python_isspace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

std::string python_strip(std::string_view s) {
  size_t begin = s.size(), end = 0;
  for (size_t i = 0; i < s.size();) {
    const size_t at = i;
    if (!python_isspace(next_cp(s, i))) {
      if (begin == s.size()) begin = at;
      end = i;
    }
  }
  return begin >= end ? std::string() : std::string(s.substr(begin, end - begin));
}

std::string lower(std::string_view s) {
  std::string r(s);
  for (char &c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

}  // namespace

bool is_python_blank(std::string_view s) {
  for (size_t i = 0; i < s.size();)
    if (!python_isspace(next_cp(s, i))) return false;
  return true;
}

const char *chat_template_name(ChatTemplate t) noexcept {
  switch (t) {
    case ChatTemplate::deepseek_v4: return "deepseek-v4";
    case ChatTemplate::kimi_k3: return "kimi-k3";
  }
  return "?";
}

std::optional<ChatTemplate> chat_template_by_name(std::string_view name) {
  const std::string n = lower(name);
  if (n == "deepseek-v4" || n == "deepseek4" || n == "deepseek_v4") return ChatTemplate::deepseek_v4;
  if (n == "kimi-k3" || n == "kimi_k3" || n == "kimi") return ChatTemplate::kimi_k3;
  return std::nullopt;
}

std::string render_chat(ChatTemplate t, std::span<const ChatMessage> messages, const ChatRenderOptions &options) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage &m = messages[i];
    for (const std::string *s : {&m.role, &m.content, &m.reasoning})
      if (const size_t bad = utf8_first_invalid(*s); bad != s->size())
        fail(Status::invalid_argument, "chat message {}: invalid UTF-8 at byte {}", i, bad);
  }
  switch (t) {
    case ChatTemplate::deepseek_v4: return render_deepseek_v4(messages, options);
    case ChatTemplate::kimi_k3: return render_kimi_k3(messages, options);
  }
  fail(Status::invalid_argument, "render_chat: unknown template {}", static_cast<int>(t));
}

std::optional<ChatTemplate> detect_chat_template_text(std::string_view jinja) {
  if (jinja.find("｜User｜") != std::string_view::npos) return ChatTemplate::deepseek_v4;
  if (jinja.find("<|open|>") != std::string_view::npos || jinja.find("<|end_of_msg|>") != std::string_view::npos)
    return ChatTemplate::kimi_k3;
  return std::nullopt;
}

std::optional<ChatTemplate> detect_chat_template_tokens(const Tokenizer &tokenizer) {
  if (tokenizer.token_to_id(kDsUser) && tokenizer.token_to_id(kDsAssistant)) return ChatTemplate::deepseek_v4;
  if (tokenizer.token_to_id("<|open|>") && tokenizer.token_to_id("<|sep|>")) return ChatTemplate::kimi_k3;
  return std::nullopt;
}

std::string end_of_turn_token(ChatTemplate t) { return t == ChatTemplate::deepseek_v4 ? kDsEos : kEndOfMsg; }

std::optional<std::string> read_chat_template_text(const std::string &tokenizer_path) {
  if (format::is_gguf_file(tokenizer_path)) {
    const format::GgufFile file = format::GgufFile::open(tokenizer_path);
    const format::GgufValue *v = file.find("tokenizer.chat_template");
    if (v == nullptr || v->type != format::GgufType::string) return std::nullopt;
    return v->s;
  }
  const std::filesystem::path cfg = std::filesystem::path(tokenizer_path).parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (!std::filesystem::exists(cfg, ec)) return std::nullopt;
  std::ifstream f(cfg, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  const auto it = j.find("chat_template");
  if (it == j.end() || !it->is_string()) return std::nullopt;
  return it->get<std::string>();
}

}  // namespace ep::tokenizer
