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
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace ep::tokenizer {

namespace {

std::string lower(std::string_view s);

// DeepSeek-V4 markers (fullwidth vertical bar U+FF5C, lower one-eighth block U+2581).
const std::string kDsUser = "<｜User｜>";
const std::string kDsAssistant = "<｜Assistant｜>";
const std::string kDsEos = "<｜end▁of▁sentence｜>";
const std::string kThinkOpen = "<think>";
const std::string kThinkClose = "</think>";
const std::string kDsml = "｜DSML｜";

using ojson = nlohmann::ordered_json;

ojson parse_json(std::string_view text, const char *what) {
  ojson j = ojson::parse(text, nullptr, false);
  if (j.is_discarded()) fail(Status::invalid_argument, "chat template: {} is not valid JSON", what);
  return j;
}

void append_py_string(std::string &out, const std::string &s) {
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

/// A double as Python's repr() writes it: the shortest digits that read back, in positional
/// notation for exponents -4..15 (with ".0" when integral), otherwise d.ddde+XX.
std::string py_float(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v < 0 ? "-Infinity" : "Infinity";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  const int exp = std::stoi(sci.substr(e + 1));
  std::string sign;
  if (mant[0] == '-') {
    sign = "-";
    mant.erase(0, 1);
  }
  std::string digits;
  for (const char c : mant)
    if (c != '.') digits += c;
  if (exp < -4 || exp >= 16) {
    std::string m = digits.substr(0, 1);
    if (digits.size() > 1) m += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    return sign + m + eb;
  }
  if (exp < 0) return sign + "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  const size_t point = static_cast<size_t>(exp) + 1;
  if (digits.size() <= point) return sign + digits + std::string(point - digits.size(), '0') + ".0";
  return sign + digits.substr(0, point) + "." + digits.substr(point);
}

/// Python's json.dumps(v, ensure_ascii=False) with @p item_sep / @p key_sep between items and
/// after keys; @p sorted: keys ordered as jinja's dictsort orders them (case-insensitively).
void append_py_json(std::string &out, const ojson &v, const char *item_sep, const char *key_sep, bool sorted) {
  switch (v.type()) {
    case ojson::value_t::null: out += "null"; break;
    case ojson::value_t::boolean: out += v.get<bool>() ? "true" : "false"; break;
    case ojson::value_t::number_integer: out += std::to_string(v.get<int64_t>()); break;
    case ojson::value_t::number_unsigned: out += std::to_string(v.get<uint64_t>()); break;
    case ojson::value_t::number_float: out += py_float(v.get<double>()); break;
    case ojson::value_t::string: append_py_string(out, v.get<std::string>()); break;
    case ojson::value_t::array: {
      out += '[';
      bool first = true;
      for (const ojson &x : v) {
        if (!first) out += item_sep;
        first = false;
        append_py_json(out, x, item_sep, key_sep, sorted);
      }
      out += ']';
      break;
    }
    case ojson::value_t::object: {
      std::vector<std::pair<std::string, const ojson *>> items;
      for (const auto &[k, x] : v.items()) items.emplace_back(k, &x);
      if (sorted)
        std::stable_sort(items.begin(), items.end(), [](const auto &a, const auto &b) { return lower(a.first) < lower(b.first); });
      out += '{';
      bool first = true;
      for (const auto &[k, x] : items) {
        if (!first) out += item_sep;
        first = false;
        append_py_string(out, k);
        out += key_sep;
        append_py_json(out, *x, item_sep, key_sep, sorted);
      }
      out += '}';
      break;
    }
    default: fail(Status::invalid_argument, "chat template: a JSON value of type {} cannot be rendered", v.type_name());
  }
}

/// transformers' `tojson` filter: json.dumps(v, ensure_ascii=False), keys in their order.
std::string tojson(const ojson &v) {
  std::string out;
  append_py_json(out, v, ", ", ": ", false);
  return out;
}

/// The tools array of ChatRenderOptions::tools_json, checked; null when none.
ojson parse_tools(const ChatRenderOptions &o) {
  if (o.tools_json.empty()) return ojson();
  ojson tools = parse_json(o.tools_json, "tools");
  if (!tools.is_array()) fail(Status::invalid_argument, "chat template: tools must be a JSON array, got {}", tools.type_name());
  for (size_t i = 0; i < tools.size(); ++i)
    if (!tools[i].is_object()) fail(Status::invalid_argument, "chat template: tools[{}] must be an object, got {}", i, tools[i].type_name());
  return tools;
}

/// A tool call's arguments as the templates read them: an object (DeepSeek-V4 parses a string with from_json).
ojson call_arguments(const ToolCall &c, size_t message, size_t call) {
  ojson a = ojson::parse(c.arguments.empty() ? std::string_view("{}") : std::string_view(c.arguments), nullptr, false);
  if (a.is_discarded() || !a.is_object())
    fail(Status::invalid_argument, "chat message {}: tool_calls[{}] ('{}') arguments are not a JSON object: '{}'", message, call, c.name,
         c.arguments);
  return a;
}

std::string deepseek_tools_header() {
  const std::string d = kDsml;
  return "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by writing a \"<" + d +
         "tool_calls>\" block like the following:\n\n<" + d + "tool_calls>\n<" + d + "invoke name=\"$TOOL_NAME\">\n<" + d +
         "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" + d + "parameter>\n...\n</" + d + "invoke>\n<" + d +
         "invoke name=\"$TOOL_NAME2\">\n...\n</" + d + "invoke>\n</" + d +
         "tool_calls>\n\nString parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, booleans, "
         "arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\nIf thinking_mode is enabled (triggered by " +
         kThinkOpen + "), you MUST output your complete reasoning inside " + kThinkOpen + "..." + kThinkClose +
         " BEFORE any tool calls or final response.\n\nOtherwise, output directly after " + kThinkClose +
         " with tool calls or final response.\n\n### Available Tool Schemas\n\n";
}

/// An assistant's tool calls as DeepSeek-V4 writes them (after its content).
std::string deepseek_tool_calls(const ChatMessage &m, size_t index) {
  const std::string d = kDsml;
  std::string out = "\n\n<" + d + "tool_calls>\n";
  for (size_t c = 0; c < m.tool_calls.size(); ++c) {
    const ToolCall &call = m.tool_calls[c];
    out += "<" + d + "invoke name=\"" + call.name + "\">\n";
    const ojson args = call_arguments(call, index, c);
    for (const auto &[key, val] : args.items()) {
      if (val.is_string())
        out += "<" + d + "parameter name=\"" + key + "\" string=\"true\">" + val.get<std::string>() + "</" + d + "parameter>\n";
      else
        out += "<" + d + "parameter name=\"" + key + "\" string=\"false\">" + tojson(val) + "</" + d + "parameter>\n";
    }
    out += "</" + d + "invoke>\n";
  }
  return out + "</" + d + "tool_calls>";
}

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
  if (const ojson tools = parse_tools(o); !tools.is_null() && !tools.empty()) {
    std::string schemas;
    for (const ojson &t : tools) {
      const auto type = t.find("type");
      if (type == t.end() || *type != "function") continue;
      const auto fn = t.find("function");
      if (fn == t.end()) fail(Status::invalid_argument, "chat template: a tool of type function has no 'function'");
      schemas += tojson(*fn) + "\n";
    }
    const std::string block =
        deepseek_tools_header() + schemas + "\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";
    system_prompt = system_prompt.empty() ? block : system_prompt + "\n\n" + block;
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
      if (!m.tool_calls.empty()) out += deepseek_tool_calls(m, i);
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

std::string kimi_internal_message(const std::string &type, std::string_view body);

/// The Kimi-K3 XTML type name of an argument value.
const char *xtml_type(const ojson &v) {
  if (v.is_boolean()) return "boolean";
  if (v.is_null()) return "null";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_object()) return "object";
  return "array";
}

/// An assistant's tool calls as Kimi-K3 writes them (after its response).
std::string kimi_tool_calls(const ChatMessage &m) {
  std::string out = open_tag("tools");
  for (size_t c = 0; c < m.tool_calls.size(); ++c) {
    const ToolCall &call = m.tool_calls[c];
    out += open_tag("call", {{"tool", call.name}, {"index", std::to_string(c + 1)}});
    const ojson args = ojson::parse(call.arguments, nullptr, false);
    if (!args.is_discarded() && args.is_object()) {
      for (const auto &[key, val] : args.items()) {
        out += open_tag("argument", {{"key", key}, {"type", xtml_type(val)}});
        out += val.is_string() ? val.get<std::string>() : tojson(val);
        out += close_tag("argument");
      }
    } else if (!is_python_blank(call.arguments)) {
      // Not an object: the template's JSON-string form, the text as it is.
      out += open_tag("json", {{"type", "object"}}) + call.arguments + close_tag("json");
    }
    out += close_tag("call");
  }
  return out + close_tag("tools");
}

/// The tool messages messages[begin, end) as Kimi-K3 renders a run of them after @p calls: in
/// the calls' order when every message answers one of them by id, else in their own order.
/// @p tool_index counts the tool messages since the last assistant message (the `index` attribute).
std::string kimi_tool_run(std::span<const ChatMessage> messages, size_t begin, size_t end, const std::vector<ToolCall> *calls,
                          size_t &tool_index) {
  auto render_one = [&](size_t i, const std::string *resolved) {
    const ChatMessage &m = messages[i];
    ++tool_index;
    std::string name;
    bool have = false;
    if (resolved) {
      name = *resolved;
      have = true;
    } else if (!m.name.empty()) {
      name = m.name;
      have = true;
    } else if (calls && tool_index <= calls->size()) {
      name = (*calls)[tool_index - 1].name;
      have = true;
    }
    if (!have)
      fail(Status::invalid_argument,
           "Kimi-K3 chat template: tool message {} needs a resolvable tool name: a name, or a tool_call_id of the preceding "
           "assistant's tool_calls, or a call at its position",
           i);
    return open_tag("message", {{"role", "tool"}, {"tool", name}, {"index", std::to_string(tool_index)}}) + m.content +
           close_tag("message") + kEndOfMsg;
  };
  size_t resolved = 0;
  for (size_t i = begin; i < end; ++i) {
    const ChatMessage &m = messages[i];
    if (m.tool_call_id.empty() || !calls) continue;
    for (const ToolCall &c : *calls)
      if (!c.id.empty() && c.id == m.tool_call_id) {
        ++resolved;
        break;
      }
  }
  std::string out;
  if (end > begin && resolved == end - begin) {
    std::vector<std::string> emitted;
    for (const ToolCall &c : *calls) {
      if (c.id.empty() || std::find(emitted.begin(), emitted.end(), c.id) != emitted.end()) continue;
      emitted.push_back(c.id);
      for (size_t i = begin; i < end; ++i)
        if (messages[i].tool_call_id == c.id) out += render_one(i, &c.name);
    }
  } else {
    for (size_t i = begin; i < end; ++i) out += render_one(i, nullptr);
  }
  return out;
}

std::string render_kimi_k3(std::span<const ChatMessage> messages, const ChatRenderOptions &o) {
  const bool thinking = o.thinking.value_or(true);
  const std::string &effort = o.thinking_effort;
  const bool known_effort = effort == "low" || effort == "medium" || effort == "high" || effort == "max";
  if (thinking && !known_effort)
    fail(Status::invalid_argument, "Kimi-K3 chat template: unsupported thinking_effort={}; supported values are low, medium, high, and max.", effort);
  std::string out;
  if (const ojson tools = parse_tools(o); !tools.is_null() && !tools.empty()) {
    std::string list;
    append_py_json(list, tools, ",", ":", true);
    out += open_tag("message", {{"role", "system"}, {"type", "tool-declare"}}) + "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n" +
           list + "\n```" + close_tag("message") + kEndOfMsg;
  }
  if (thinking) {
    const std::string body =
        "`thinking_effort` guides on how much to think in your thinking channel (not including the response channel), "
        "supported values include `low`, `medium`, `high`, and `max`.\nNow the system is invoked with `thinking_effort=" +
        effort + "`.";
    out += kimi_internal_message("thinking-effort", body);
  }
  const std::vector<ToolCall> *calls = nullptr;  // the last assistant message's (none before one)
  size_t tool_index = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage &m = messages[i];
    if (m.role == "user" || m.role == "system") {
      if (m.name.empty())
        out += open_tag("message", {{"role", m.role}});
      else
        out += open_tag("message", {{"role", m.role}, {"name", m.name}});
      out += m.content + close_tag("message") + kEndOfMsg;
    } else if (m.role == "assistant") {
      calls = &m.tool_calls;
      tool_index = 0;
      if (m.name.empty())
        out += open_tag("message", {{"role", "assistant"}});
      else
        out += open_tag("message", {{"role", "assistant"}, {"name", m.name}});
      if (thinking) {
        out += open_tag("think");
        if (!is_python_blank(m.reasoning)) out += m.reasoning;
        out += close_tag("think");
      }
      out += open_tag("response") + m.content + close_tag("response");
      if (!m.tool_calls.empty()) out += kimi_tool_calls(m);
      out += close_tag("message") + kEndOfMsg;
    } else if (m.role == "tool") {
      size_t end = i;
      while (end < messages.size() && messages[end].role == "tool") ++end;
      out += kimi_tool_run(messages, i, end, calls, tool_index);
      i = end - 1;
    } else {
      fail(Status::invalid_argument, "Kimi-K3 chat template: message {} has role '{}' (expected system, user, assistant or tool)", i,
           m.role);
    }
  }
  if (o.tool_choice == "required")
    out += kimi_internal_message("tool-choice", "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.");
  else if (o.tool_choice == "none")
    out += kimi_internal_message("tool-choice", "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next message.");
  if (o.add_generation_prompt) out += open_tag("message", {{"role", "assistant"}}) + open_tag(thinking ? "think" : "response");
  return out;
}

std::string kimi_internal_message(const std::string &type, std::string_view body) {
  return open_tag("message", {{"role", "system"}, {"type", type}}) + python_strip(body) + close_tag("message") + kEndOfMsg;
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
    std::vector<const std::string *> texts = {&m.role, &m.content, &m.reasoning, &m.tool_call_id, &m.name};
    for (const ToolCall &c : m.tool_calls) texts.insert(texts.end(), {&c.id, &c.name, &c.arguments});
    for (const std::string *s : texts)
      if (const size_t bad = utf8_first_invalid(*s); bad != s->size())
        fail(Status::invalid_argument, "chat message {}: invalid UTF-8 at byte {}", i, bad);
    if (!m.tool_calls.empty() && m.role != "assistant")
      fail(Status::invalid_argument, "chat message {}: a '{}' message has tool_calls (only an assistant's may)", i, m.role);
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

std::string tool_call_prefix(ChatTemplate t, const ChatRenderOptions &o, std::string_view name) {
  if (t == ChatTemplate::deepseek_v4) {
    std::string out = o.thinking.value_or(false) ? kThinkClose : std::string();
    out += "\n\n<" + kDsml + "tool_calls>\n<" + kDsml + "invoke name=\"";
    if (!name.empty()) out += std::string(name) + "\">\n";
    return out;
  }
  std::string out;
  if (o.thinking.value_or(true)) out += close_tag("think") + open_tag("response");
  out += close_tag("response") + open_tag("tools");
  if (name.empty()) return out + "<|open|>call tool=\"";
  return out + open_tag("call", {{"tool", std::string(name)}, {"index", "1"}});
}

std::string python_json(std::string_view json) { return tojson(parse_json(json, "the value")); }

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
