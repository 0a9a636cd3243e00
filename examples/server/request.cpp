#include "request.hpp"

#include <nlohmann/json.hpp>

#include <cctype>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace ep_server {

namespace {

using nlohmann::json;

uint64_t random_seed() {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mu);
  return rng();
}


// ---- request fields -------------------------------------------------------------------------

/// Typed access to a request object's fields; a JSON null counts as absent (clients send null
/// for parameters they leave unset). Wrong types and out-of-range values are ApiErrors naming
/// the field.
class Fields {
 public:
  explicit Fields(const json &body) : body_(body) {}

  const json *get(const char *key) const {
    const auto it = body_.find(key);
    return it == body_.end() || it->is_null() ? nullptr : &*it;
  }

  std::optional<double> number(const char *key, double lo, double hi) const {
    const json *v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) throw ApiError{400, std::string("'") + key + "' must be a number", key, "invalid_type"};
    const double d = v->get<double>();
    if (!(d >= lo && d <= hi))
      throw ApiError{400, std::string("'") + key + "' must be in [" + fmt(lo) + ", " + fmt(hi) + "], got " + fmt(d), key, "invalid_value"};
    return d;
  }

  std::optional<int64_t> integer(const char *key, int64_t lo, int64_t hi) const {
    const json *v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number_integer()) throw ApiError{400, std::string("'") + key + "' must be an integer", key, "invalid_type"};
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      throw ApiError{400, std::string("'") + key + "' is out of range", key, "invalid_value"};
    const int64_t i = v->get<int64_t>();
    if (i < lo || i > hi)
      throw ApiError{400, std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                              std::to_string(i),
                     key, "invalid_value"};
    return i;
  }

  std::optional<bool> boolean(const char *key) const {
    const json *v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) throw ApiError{400, std::string("'") + key + "' must be a boolean", key, "invalid_type"};
    return v->get<bool>();
  }

  std::optional<std::string> string(const char *key) const {
    const json *v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) throw ApiError{400, std::string("'") + key + "' must be a string", key, "invalid_type"};
    return v->get<std::string>();
  }

  const json *object(const char *key) const {
    const json *v = get(key);
    if (v && !v->is_object()) throw ApiError{400, std::string("'") + key + "' must be an object", key, "invalid_type"};
    return v;
  }

 private:
  static std::string fmt(double d) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", d);
    return b;
  }
  const json &body_;
};

/// Every request field is one the server acts on, or the request is refused with a 400 that
/// names it: a parameter dropped in silence changes the answer without the client knowing. A
/// null value counts as absent.
void check_parameters(const json &body, bool chat) {
  static const std::set<std::string> common = {
      "model", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed", "frequency_penalty", "presence_penalty",
      "max_tokens", "max_completion_tokens", "stop", "stream", "stream_options", "ignore_eos", "n", "logprobs",
      // Identify the end user, or group requests, for OpenAI's monitoring and routing: no answer depends on them here
      // (a prompt's reuse of kept state is automatic).
      "user", "safety_identifier", "prompt_cache_key",
      // Accepted with the values that ask for nothing this server does not do (checked below).
      "logit_bias", "store", "metadata", "service_tier", "modalities"};
  static const std::set<std::string> chat_only = {"messages", "tools", "tool_choice", "parallel_tool_calls", "response_format",
                                                  "top_logprobs", "thinking", "chat_template_kwargs"};
  static const std::set<std::string> completion_only = {"prompt", "echo", "suffix", "best_of"};
  static const std::map<std::string, std::string> refused = {
      {"functions", "the legacy 'functions' are not supported: declare them in 'tools' ({\"type\": \"function\", \"function\": ...})"},
      {"function_call", "the legacy 'function_call' is not supported: use 'tool_choice'"},
      {"reasoning_effort", "'reasoning_effort' is not supported: use 'thinking' (true or false)"},
      {"audio", "audio output is not supported"},
      {"prediction", "predicted outputs are not supported"},
      {"web_search_options", "web search is not supported"},
      {"verbosity", "'verbosity' is not supported"},
  };
  for (const auto &[key, value] : body.items()) {
    if (value.is_null() || common.count(key) || (chat ? chat_only : completion_only).count(key)) continue;
    if (const auto it = refused.find(key); it != refused.end()) throw ApiError{400, it->second, key, "unsupported"};
    throw ApiError{400, "unknown parameter '" + key + "'", key, "unknown_parameter"};
  }
  const Fields f(body);
  if (f.boolean("store").value_or(false)) throw ApiError{400, "this server does not store completions ('store': true)", "store", "unsupported"};
  if (const json *m = f.object("metadata"); m && !m->empty())
    throw ApiError{400, "'metadata' is kept only with stored completions, which this server does not keep", "metadata", "unsupported"};
  if (const auto tier = f.string("service_tier"); tier && *tier != "auto" && *tier != "default")
    throw ApiError{400, "'service_tier' '" + *tier + "' is not offered: this server has one tier ('auto' / 'default')", "service_tier",
                   "unsupported"};
  if (const json *m = f.get("modalities"); m && *m != json::array({"text"}))
    throw ApiError{400, "only 'modalities' [\"text\"] is supported", "modalities", "unsupported"};
  if (chat) {
    const json *tools = f.get("tools");
    const bool no_tools = !tools || (tools->is_array() && tools->empty());
    for (const char *k : {"tool_choice", "parallel_tool_calls"})
      if (no_tools && f.get(k)) throw ApiError{400, std::string("'") + k + "' is only allowed with 'tools'", k, "invalid_value"};
  }
}

/// OpenAI's logit_bias: an object of token ids as strings ("1234") to biases in -100..100.
std::vector<ep_logit_bias> parse_logit_bias(const Fields &f, const RequestContext &ctx) {
  std::vector<ep_logit_bias> out;
  const json *bias = f.object("logit_bias");
  if (!bias) return out;
  std::set<int32_t> seen;
  for (const auto &[key, value] : bias->items()) {
    size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(key, &used, 10);
    } catch (const std::exception &) {
      used = 0;
    }
    if (key.empty() || used != key.size() || id < 0 || id >= static_cast<long long>(ctx.vocab_size))
      throw ApiError{400, "'logit_bias' key '" + key + "' is not a token id in [0, " + std::to_string(ctx.vocab_size) + ")", "logit_bias",
                     "invalid_value"};
    if (!value.is_number())
      throw ApiError{400, "'logit_bias' of token " + key + " must be a number", "logit_bias", "invalid_type"};
    const double b = value.get<double>();
    if (!(b >= -100 && b <= 100))
      throw ApiError{400, "'logit_bias' of token " + key + " must be in [-100, 100], got " + value.dump(), "logit_bias", "invalid_value"};
    if (!seen.insert(static_cast<int32_t>(id)).second)
      throw ApiError{400, "'logit_bias' names token " + std::to_string(id) + " twice", "logit_bias", "invalid_value"};
    out.push_back({static_cast<int32_t>(id), static_cast<float>(b)});
  }
  return out;
}

/// What the chat and completion endpoints share: sampling, limits, stop strings, streaming.
ParsedRequest parse_common(const Fields &f, const RequestContext &ctx) {
  ParsedRequest c;
  if (const auto model = f.string("model"); model && *model != ctx.model_name)
    throw ApiError{404, "The model '" + *model + "' does not exist; this server serves '" + ctx.model_name + "'", "model",
                   "model_not_found"};
  c.job.n = static_cast<uint32_t>(f.integer("n", 1, ctx.limits.max_n).value_or(1));
  c.job.logit_bias = parse_logit_bias(f, ctx);
  ep_generate_options &o = c.job.sampling;
  ep_generate_options_init(&o);
  o.temperature = static_cast<float>(f.number("temperature", 0, 2).value_or(ctx.temperature));
  o.top_p = static_cast<float>(f.number("top_p", 0, 1).value_or(ctx.top_p));
  if (!(o.top_p > 0)) throw ApiError{400, "'top_p' must be greater than 0", "top_p", "invalid_value"};
  o.top_k = static_cast<int32_t>(f.integer("top_k", 0, INT32_MAX).value_or(0));
  o.min_p = static_cast<float>(f.number("min_p", 0, 1).value_or(0));
  o.repetition_penalty = static_cast<float>(f.number("repetition_penalty", 1e-3, 100).value_or(1));
  o.seed = f.get("seed") ? static_cast<uint64_t>(*f.integer("seed", INT64_MIN, INT64_MAX)) : random_seed();
  for (const char *k : {"frequency_penalty", "presence_penalty"})
    if (const auto v = f.number(k, -2, 2); v && *v != 0)
      throw ApiError{400, std::string("'") + k + "' is not supported (use repetition_penalty)", k, "unsupported"};
  // max_completion_tokens is OpenAI's newer name; it wins where both are given.
  const int64_t most_tokens = ctx.limits.max_tokens ? ctx.limits.max_tokens : UINT32_MAX;
  std::optional<int64_t> max_tokens = f.integer("max_completion_tokens", 1, most_tokens);
  if (const auto mt = f.integer("max_tokens", 1, most_tokens); !max_tokens) max_tokens = mt;
  c.job.max_tokens = static_cast<uint32_t>(max_tokens.value_or(0));  // 0: the scheduler's admission fills in the default
  c.job.ignore_eos = f.boolean("ignore_eos").value_or(false);
  if (const json *stop = f.get("stop")) {
    std::vector<std::string> stops;
    if (stop->is_string()) {
      stops.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const json &s : *stop) {
        if (!s.is_string()) throw ApiError{400, "'stop' must be a string or an array of strings", "stop", "invalid_type"};
        stops.push_back(s.get<std::string>());
      }
    } else {
      throw ApiError{400, "'stop' must be a string or an array of strings", "stop", "invalid_type"};
    }
    if (stops.size() > ctx.limits.max_stop)
      throw ApiError{400, "at most " + std::to_string(ctx.limits.max_stop) + " stop strings", "stop", "invalid_value"};
    for (const std::string &s : stops)
      if (s.empty()) throw ApiError{400, "a stop string is empty", "stop", "invalid_value"};
    c.job.stop = std::move(stops);
  }
  c.stream = f.boolean("stream").value_or(false);
  if (const json *so = f.object("stream_options")) {
    const Fields sf(*so);
    c.include_usage = sf.boolean("include_usage").value_or(false);
  }
  return c;
}

json parse_body(const std::string &body, const Limits &limits) {
  if (json_too_deep(body, limits.max_json_depth))
    throw ApiError{400, "the request's JSON nests deeper than " + std::to_string(limits.max_json_depth) + " levels", "", "invalid_json"};
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded()) throw ApiError{400, "the request body is not valid JSON", "", "invalid_json"};
  if (!j.is_object()) throw ApiError{400, "the request body must be a JSON object", "", "invalid_json"};
  return j;
}

std::vector<int32_t> tokenize(const RequestContext &ctx, const std::string &text, uint32_t flags) {
  size_t n = 0;
  if (ep_tokenize(nullptr, 0, &n, ctx.tokenizer, text.data(), text.size(), flags) != EP_OK)
    throw ApiError{400, std::string("cannot tokenize the prompt: ") + ep_last_error(), "", "invalid_value"};
  std::vector<int32_t> ids(n);
  if (n && ep_tokenize(ids.data(), ids.size(), &n, ctx.tokenizer, text.data(), text.size(), flags) != EP_OK)
    throw ApiError{400, std::string("cannot tokenize the prompt: ") + ep_last_error(), "", "invalid_value"};
  return ids;
}

void check_prompt_length(const RequestContext &ctx, size_t n, const char *param) {
  if (n == 0) throw ApiError{400, "the prompt is empty", param, "invalid_value"};
  if (n > ctx.limits.max_prompt_tokens)
    throw ApiError{400,
                   "the prompt has " + std::to_string(n) + " tokens; this server takes at most " +
                       std::to_string(ctx.limits.max_prompt_tokens),
                   param, "context_length_exceeded"};
}

// ---- chat -----------------------------------------------------------------------------------

struct Message {
  std::string role, content, reasoning;
  std::string tools_json;  ///< the message's tool fields for ep_chat_options::message_tools_json (empty: none)
};

/// An assistant message's tool_calls, checked: [{"id", "type": "function", "function": {"name", "arguments"}}].
json parse_tool_calls(const json &calls, const std::string &at) {
  const std::string param = at + ".tool_calls";
  if (!calls.is_array()) throw ApiError{400, "'" + param + "' must be an array", param, "invalid_type"};
  json out = json::array();
  for (size_t c = 0; c < calls.size(); ++c) {
    const json &call = calls[c];
    const std::string cat = param + "[" + std::to_string(c) + "]";
    if (!call.is_object()) throw ApiError{400, "'" + cat + "' must be an object", cat, "invalid_type"};
    const Fields cf(call);
    for (const auto &[key, value] : call.items())
      if (!value.is_null() && key != "id" && key != "type" && key != "function")
        throw ApiError{400, "'" + cat + "." + key + "' is not supported", cat + "." + key, "unsupported"};
    if (const auto type = cf.string("type"); type && *type != "function")
      throw ApiError{400, "'" + cat + ".type' must be \"function\"", cat + ".type", "invalid_value"};
    const json *f = cf.object("function");
    if (!f) throw ApiError{400, "'" + cat + ".function' is required", cat + ".function", "missing"};
    const Fields ff(*f);
    const auto name = ff.string("name");
    if (!name || name->empty()) throw ApiError{400, "'" + cat + ".function.name' is required", cat + ".function.name", "missing"};
    const auto arguments = ff.string("arguments");
    out.push_back({{"id", cf.string("id").value_or("")},
                   {"type", "function"},
                   {"function", {{"name", *name}, {"arguments", arguments.value_or("{}")}}}});
  }
  return out;
}

std::string content_text(const json &content, size_t index) {
  const std::string param = "messages[" + std::to_string(index) + "].content";
  if (content.is_null()) return {};
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw ApiError{400, "'" + param + "' must be a string or an array of text parts", param, "invalid_type"};
  std::string text;
  for (const json &part : content) {
    if (!part.is_object()) throw ApiError{400, "'" + param + "' parts must be objects", param, "invalid_type"};
    const auto type = part.find("type");
    const auto t = part.find("text");
    if (type == part.end() || !type->is_string() || *type != "text" || t == part.end() || !t->is_string())
      throw ApiError{400, "'" + param + "': only {\"type\": \"text\", \"text\": ...} parts are supported", param, "unsupported"};
    text += t->get<std::string>();
  }
  return text;
}

std::vector<Message> parse_messages(const Fields &f) {
  const json *ms = f.get("messages");
  if (!ms) throw ApiError{400, "'messages' is required", "messages", "missing"};
  if (!ms->is_array() || ms->empty()) throw ApiError{400, "'messages' must be a non-empty array", "messages", "invalid_type"};
  std::vector<Message> out;
  for (size_t i = 0; i < ms->size(); ++i) {
    const json &m = (*ms)[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) throw ApiError{400, "'" + at + "' must be an object", at, "invalid_type"};
    const Fields mf(m);
    for (const auto &[key, value] : m.items())
      if (!value.is_null() && key != "role" && key != "content" && key != "reasoning_content" && key != "tool_calls" && key != "tool_call_id" &&
          key != "name")
        throw ApiError{400, "'" + at + "." + key + "' is not supported", at + "." + key, "unsupported"};
    const auto role = mf.string("role");
    if (!role) throw ApiError{400, "'" + at + ".role' is required", at + ".role", "missing"};
    Message msg;
    msg.role = *role;
    const auto c = m.find("content");
    // Only an assistant's turn may come without content (OpenAI's rule: its content may be
    // replaced by tool calls); another role's null content is a client's mistake, not an empty text.
    if ((c == m.end() || c->is_null()) && msg.role != "assistant")
      throw ApiError{400, "'" + at + ".content' is required for a '" + msg.role + "' message", at + ".content", "missing"};
    msg.content = c == m.end() ? std::string() : content_text(*c, i);
    msg.reasoning = mf.string("reasoning_content").value_or("");
    json tools = json::object();
    if (const json *tc = mf.get("tool_calls")) {
      if (msg.role != "assistant")
        throw ApiError{400, "'" + at + ".tool_calls': only an assistant message has tool calls", at + ".tool_calls", "invalid_value"};
      if (!(tc->is_array() && tc->empty())) tools["tool_calls"] = parse_tool_calls(*tc, at);
    }
    if (const auto id = mf.string("tool_call_id")) {
      if (msg.role != "tool")
        throw ApiError{400, "'" + at + ".tool_call_id': only a tool message answers a tool call", at + ".tool_call_id", "invalid_value"};
      tools["tool_call_id"] = *id;
    } else if (msg.role == "tool") {
      throw ApiError{400, "'" + at + ".tool_call_id' is required for a 'tool' message", at + ".tool_call_id", "missing"};
    }
    if (const auto name = mf.string("name")) tools["name"] = *name;
    if (!tools.empty()) msg.tools_json = tools.dump();
    out.push_back(std::move(msg));
  }
  return out;
}

/// What a request asks of tools (parse_tools()).
struct ToolRequest {
  std::string tools_json;     ///< the tools rendered (empty: none offered)
  std::string choice = "auto";  ///< auto, none, required, or "function" (a named one)
  std::string function;       ///< the named function
  bool parallel = true;
};

ep_chat_options chat_options(const RequestContext &ctx, const ToolRequest &tools, int thinking, bool generation_prompt) {
  ep_chat_options co;
  ep_chat_options_init(&co);
  co.chat_template = ctx.chat_template;
  co.thinking = thinking;
  co.add_generation_prompt = generation_prompt ? 1 : 0;
  if (!tools.tools_json.empty()) {
    co.tools_json = tools.tools_json.c_str();
    // Kimi-K3's template has a note for "required" (a named function is forced by the prompt instead).
    if (tools.choice == "required" || tools.choice == "auto") co.tool_choice = tools.choice.c_str();
  }
  return co;
}

/// The conversation rendered by the model's chat template.
std::string render(const RequestContext &ctx, const std::vector<Message> &messages, const ToolRequest &tools, int thinking,
                   bool generation_prompt) {
  std::vector<ep_chat_message> cm;
  std::vector<const char *> tool_fields;
  for (const Message &m : messages) {
    cm.push_back({m.role.c_str(), m.content.c_str(), m.reasoning.empty() ? nullptr : m.reasoning.c_str()});
    tool_fields.push_back(m.tools_json.empty() ? nullptr : m.tools_json.c_str());
  }
  ep_chat_options co = chat_options(ctx, tools, thinking, generation_prompt);
  co.message_tools_json = tool_fields.data();
  size_t n = 0;
  if (ep_chat_render(nullptr, 0, &n, ctx.tokenizer, cm.data(), cm.size(), &co) != EP_OK)
    throw ApiError{400, std::string("cannot render the conversation: ") + ep_last_error(), "messages", "invalid_value"};
  std::string text(n + 1, '\0');
  if (ep_chat_render(text.data(), text.size(), &n, ctx.tokenizer, cm.data(), cm.size(), &co) != EP_OK)
    throw ApiError{400, std::string("cannot render the conversation: ") + ep_last_error(), "messages", "invalid_value"};
  text.resize(n);
  return text;
}

int parse_thinking(const Fields &f, const RequestContext &ctx) {
  if (const auto t = f.boolean("thinking")) return *t ? 1 : 0;
  if (const json *kw = f.object("chat_template_kwargs")) {
    const Fields kf(*kw);
    for (const char *k : {"thinking", "enable_thinking"})
      if (const auto t = kf.boolean(k)) return *t ? 1 : 0;
  }
  if (ctx.thinking >= 0) return ctx.thinking;
  return ctx.chat_template == EP_CHAT_TEMPLATE_KIMI_K3 ? 1 : 0;  // the templates' defaults
}

/// response_format: null for {"type": "text"}, else the grammar of {"type": "json_object"} or
/// {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}. The grammar
/// constrains every generated token, so the combinations where the answer holds more than the
/// JSON value are refused by name: thinking on (the reasoning would be constrained too), tools
/// offered (a call could not be written) and ignore_eos (nothing may follow the value).
GrammarPtr parse_response_format(const Fields &f, const RequestContext &ctx, const ToolRequest &tools, int thinking, bool ignore_eos) {
  const json *rf = f.object("response_format");
  if (!rf) return nullptr;
  const Fields rff(*rf);
  const json *type = rff.get("type");
  if (!type || !type->is_string())
    throw ApiError{400, "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"", "response_format.type", "invalid_value"};
  const std::string t = type->get<std::string>();
  const std::set<std::string> allowed = t == "json_schema" ? std::set<std::string>{"type", "json_schema"} : std::set<std::string>{"type"};
  for (const auto &[key, value] : rf->items())
    if (!value.is_null() && !allowed.count(key))
      throw ApiError{400, "unknown parameter 'response_format." + key + "' for type '" + t + "'", "response_format." + key, "unknown_parameter"};
  if (t == "text") return nullptr;
  if (t != "json_object" && t != "json_schema")
    throw ApiError{400, "'response_format.type' '" + t + "' is not supported (\"text\", \"json_object\" or \"json_schema\")",
                   "response_format.type", "invalid_value"};
  if (thinking == 1)
    throw ApiError{400, "'response_format' " + t + " with thinking on is not supported (the grammar would constrain the reasoning too): send 'thinking': false",
                   "response_format", "unsupported"};
  if (!tools.tools_json.empty())
    throw ApiError{400, "'response_format' " + t + " with 'tools' is not supported (the grammar leaves no room for a tool call): send one or the other, or 'tool_choice': \"none\"",
                   "response_format", "unsupported"};
  if (ignore_eos)
    throw ApiError{400, "'response_format' " + t + " with 'ignore_eos' is not supported (nothing may follow the JSON value)", "ignore_eos", "unsupported"};
  ep_grammar *g = nullptr;
  if (t == "json_object") {
    if (ep_grammar_json_object(&g, ctx.tokenizer) != EP_OK)
      throw ApiError{400, std::string("response_format json_object: ") + ep_last_error(), "response_format", "unsupported"};
    return GrammarPtr(g, GrammarCloser{});
  }
  const json *js = rff.object("json_schema");
  if (!js) throw ApiError{400, "'response_format.json_schema' is required for type 'json_schema'", "response_format.json_schema", "missing_required_parameter"};
  static const std::set<std::string> js_fields = {"name", "schema", "strict", "description"};
  for (const auto &[key, value] : js->items())
    if (!value.is_null() && !js_fields.count(key))
      throw ApiError{400, "unknown parameter 'response_format.json_schema." + key + "'", "response_format.json_schema." + key, "unknown_parameter"};
  const Fields jf(*js);
  const json *name = jf.get("name");
  if (!name || !name->is_string() || name->get<std::string>().empty() || name->get<std::string>().size() > 64 ||
      name->get<std::string>().find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != std::string::npos)
    throw ApiError{400, "'response_format.json_schema.name' must be a string of 1 to 64 letters, digits, '_' or '-'", "response_format.json_schema.name",
                   "invalid_value"};
  if (const json *d = jf.get("description"); d && !d->is_string())
    throw ApiError{400, "'response_format.json_schema.description' must be a string", "response_format.json_schema.description", "invalid_type"};
  // strict: true or false, the grammar is followed either way (strict is how OpenAI asks for it).
  if (const json *st = jf.get("strict"); st && !st->is_boolean())
    throw ApiError{400, "'response_format.json_schema.strict' must be a boolean", "response_format.json_schema.strict", "invalid_type"};
  const json *schema = jf.get("schema");
  if (!schema) throw ApiError{400, "'response_format.json_schema.schema' is required", "response_format.json_schema.schema", "missing_required_parameter"};
  if (!schema->is_object() && !schema->is_boolean())
    throw ApiError{400, "'response_format.json_schema.schema' must be a JSON Schema object", "response_format.json_schema.schema", "invalid_type"};
  const std::string text = schema->dump();
  if (ep_grammar_json_schema(&g, ctx.tokenizer, text.data(), text.size()) != EP_OK) {
    std::string e = ep_last_error();
    // "ep_grammar_json_schema: JSON schema /x: ..." -> "response_format.json_schema.schema /x: ..."
    if (const size_t at = e.find("JSON schema"); at != std::string::npos) e = e.substr(at + 12);
    throw ApiError{400, "'response_format.json_schema.schema' " + e, "response_format.json_schema.schema", "invalid_value"};
  }
  return GrammarPtr(g, GrammarCloser{});
}

/// tools, tool_choice and parallel_tool_calls, checked.
ToolRequest parse_tools(const Fields &f) {
  ToolRequest t;
  const json *tools = f.get("tools");
  if (!tools || (tools->is_array() && tools->empty())) return t;
  if (!tools->is_array()) throw ApiError{400, "'tools' must be an array", "tools", "invalid_type"};
  std::set<std::string> names;
  for (size_t i = 0; i < tools->size(); ++i) {
    const json &tool = (*tools)[i];
    const std::string at = "tools[" + std::to_string(i) + "]";
    if (!tool.is_object()) throw ApiError{400, "'" + at + "' must be an object", at, "invalid_type"};
    const Fields tf(tool);
    const auto type = tf.string("type");
    if (type != "function") throw ApiError{400, "'" + at + ".type': only \"function\" tools are supported", at + ".type", "unsupported"};
    for (const auto &[key, value] : tool.items())
      if (!value.is_null() && key != "type" && key != "function")
        throw ApiError{400, "'" + at + "." + key + "' is not supported", at + "." + key, "unsupported"};
    const json *fn = tf.object("function");
    if (!fn) throw ApiError{400, "'" + at + ".function' is required", at + ".function", "missing"};
    for (const auto &[key, value] : fn->items())
      if (!value.is_null() && key != "name" && key != "description" && key != "parameters" && key != "strict")
        throw ApiError{400, "'" + at + ".function." + key + "' is not supported", at + ".function." + key, "unsupported"};
    const Fields ff(*fn);
    const auto name = ff.string("name");
    if (!name || name->empty()) throw ApiError{400, "'" + at + ".function.name' is required", at + ".function.name", "missing"};
    for (const char ch : *name)
      if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-' || ch == '.'))
        throw ApiError{400, "'" + at + ".function.name' may hold only letters, digits, '_', '-' and '.'", at + ".function.name", "invalid_value"};
    if (!names.insert(*name).second) throw ApiError{400, "two tools are named '" + *name + "'", at + ".function.name", "invalid_value"};
    ff.string("description");
    ff.object("parameters");
    if (ff.boolean("strict").value_or(false))
      throw ApiError{400, "'strict' function calling is not supported: arguments are not constrained by the schema", at + ".function.strict",
                     "unsupported"};
  }
  if (const json *choice = f.get("tool_choice")) {
    if (choice->is_string()) {
      t.choice = choice->get<std::string>();
      if (t.choice != "auto" && t.choice != "none" && t.choice != "required")
        throw ApiError{400, "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}",
                       "tool_choice", "invalid_value"};
    } else if (choice->is_object()) {
      const Fields cf(*choice);
      const json *fn = cf.object("function");
      const auto name = fn ? Fields(*fn).string("name") : std::nullopt;
      if (cf.string("type") != "function" || !name)
        throw ApiError{400, "'tool_choice' as an object must be {\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice",
                       "invalid_value"};
      if (!names.count(*name)) throw ApiError{400, "'tool_choice' names '" + *name + "', which is not in 'tools'", "tool_choice", "invalid_value"};
      t.choice = "function";
      t.function = *name;
    } else {
      throw ApiError{400, "'tool_choice' must be a string or an object", "tool_choice", "invalid_type"};
    }
  }
  t.parallel = f.boolean("parallel_tool_calls").value_or(true);
  if (t.choice != "none") t.tools_json = tools->dump();
  return t;
}

ParsedRequest parse_chat(const json &body, const RequestContext &ctx) {
  check_parameters(body, true);
  const Fields f(body);
  if (ctx.chat_template == EP_CHAT_TEMPLATE_NONE)
    throw ApiError{400, "this model's tokenizer has no chat template: use /v1/completions", "messages", "unsupported"};
  ParsedRequest c = parse_common(f, ctx);
  const ToolRequest tools = parse_tools(f);
  // logprobs: true gives each token's log-probability; top_logprobs (0..20) its alternatives too.
  const bool logprobs = f.boolean("logprobs").value_or(false);
  const auto top = f.integer("top_logprobs", 0, EP_MAX_TOP_LOGPROBS);
  if (top.value_or(0) > 0 && !logprobs) throw ApiError{400, "'top_logprobs' needs 'logprobs': true", "top_logprobs", "invalid_value"};
  c.job.logprobs = logprobs ? static_cast<int32_t>(top.value_or(0)) : -1;
  std::vector<Message> messages = parse_messages(f);
  const int thinking = parse_thinking(f, ctx);
  c.job.grammar = parse_response_format(f, ctx, tools, thinking, c.job.ignore_eos);
  std::string prompt = render(ctx, messages, tools, thinking, true);
  // A call the request demands is begun by the prompt: the format's call-section opener (and
  // the function's name), as vLLM and SGLang do for these formats without a grammar.
  std::string forced;
  if (!tools.tools_json.empty() && (tools.choice == "required" || tools.choice == "function")) {
    const ep_chat_options co = chat_options(ctx, tools, thinking, true);
    const char *name = tools.choice == "function" ? tools.function.c_str() : nullptr;
    size_t n = 0;
    if (ep_chat_tool_call_prefix(nullptr, 0, &n, ctx.tokenizer, name, &co) != EP_OK)
      throw ApiError{400, std::string("cannot begin the tool call: ") + ep_last_error(), "tool_choice", "invalid_value"};
    forced.resize(n + 1);
    if (ep_chat_tool_call_prefix(forced.data(), forced.size(), &n, ctx.tokenizer, name, &co) != EP_OK)
      throw ApiError{400, std::string("cannot begin the tool call: ") + ep_last_error(), "tool_choice", "invalid_value"};
    forced.resize(n);
  }
  c.job.prompt = tokenize(ctx, prompt + forced, 0);
  check_prompt_length(ctx, c.job.prompt.size(), "messages");
  if (!tools.tools_json.empty()) {
    c.tools = true;
    c.tool_format = ctx.chat_template == EP_CHAT_TEMPLATE_KIMI_K3 ? ToolFormat::kimi_k3 : ToolFormat::deepseek_v4;
    c.parallel_tool_calls = tools.parallel;
    const std::string opener = c.tool_format == ToolFormat::kimi_k3 ? "<|open|>tools<|sep|>" : "<｜DSML｜tool_calls>";
    if (!forced.empty()) c.tool_prime = forced.substr(forced.find(opener));
    c.job.tool_markup = true;
    c.job.start_in_tool_calls = !forced.empty();
  }
  // The state a next turn can continue from: where this prompt and the rendering of the
  // conversation with an answer and one more user message part (DeepSeek-V4 renders an earlier
  // answer without its thinking, so the two part just after the assistant's marker).
  messages.push_back({"assistant", "", "", ""});
  messages.push_back({"user", "", "", ""});
  const std::vector<int32_t> next = tokenize(ctx, render(ctx, messages, tools, thinking, false), 0);
  size_t common = 0;
  while (common < next.size() && common < c.job.prompt.size() && next[common] == c.job.prompt[common]) ++common;
  c.job.snapshot_at = common;
  c.job.split_reasoning = true;
  c.job.start_in_reasoning = thinking == 1 && forced.empty();  // a forced call closes the thinking first
  return c;
}

// ---- completions ----------------------------------------------------------------------------

ParsedRequest parse_completion(const json &body, const RequestContext &ctx) {
  check_parameters(body, false);
  const Fields f(body);
  ParsedRequest c = parse_common(f, ctx);
  for (const char *k : {"echo"})
    if (f.boolean(k).value_or(false)) throw ApiError{400, std::string("'") + k + "' is not supported", k, "unsupported"};
  if (f.string("suffix")) throw ApiError{400, "'suffix' is not supported", "suffix", "unsupported"};
  if (const auto b = f.integer("best_of", 1, INT64_MAX); b && *b != c.job.n)
    throw ApiError{400, "only best_of = n is supported (every answer is returned)", "best_of", "unsupported"};
  // logprobs: K gives each token's log-probability and its K most likely alternatives (0..20).
  if (const auto k = f.integer("logprobs", 0, EP_MAX_TOP_LOGPROBS)) c.job.logprobs = static_cast<int32_t>(*k);
  const json *p = f.get("prompt");
  if (!p) throw ApiError{400, "'prompt' is required", "prompt", "missing"};
  const json *one = p;
  if (p->is_array() && !p->empty() && (p->front().is_string() || p->front().is_array())) {
    if (p->size() != 1) throw ApiError{400, "one prompt per request is supported", "prompt", "unsupported"};
    one = &p->front();
  }
  if (one->is_string()) {
    // As ep_generate_text() does on an empty session: BOS first when the tokenizer adds one.
    c.job.prompt = tokenize(ctx, "", EP_TOKENIZE_ADD_SPECIAL);
    const std::vector<int32_t> text = tokenize(ctx, one->get<std::string>(), 0);
    c.job.prompt.insert(c.job.prompt.end(), text.begin(), text.end());
  } else if (one->is_array()) {
    for (const json &t : *one) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= ctx.vocab_size)
        throw ApiError{400, "a token id prompt must hold integers in [0, " + std::to_string(ctx.vocab_size) + ")", "prompt", "invalid_value"};
      c.job.prompt.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
  } else {
    throw ApiError{400, "'prompt' must be a string, an array of token ids, or an array of one of them", "prompt", "invalid_type"};
  }
  check_prompt_length(ctx, c.job.prompt.size(), "prompt");
  c.job.snapshot_at = c.job.prompt.size();
  return c;
}


}  // namespace

bool json_too_deep(const std::string &text, size_t max_depth) {
  size_t depth = 0;
  bool in_string = false, escaped = false;
  for (const char ch : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (ch == '\\') escaped = true;
      else if (ch == '"') in_string = false;
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      if (++depth > max_depth) return true;
    } else if ((ch == ']' || ch == '}') && depth > 0) {
      --depth;
    }
  }
  return false;
}

nlohmann::json tokenize_request(const std::string &text, const RequestContext &ctx) {
  const json body = parse_body(text, ctx.limits);
  for (const auto &[key, value] : body.items())
    if (!value.is_null() && key != "content" && key != "add_special" && key != "parse_special" && key != "model")
      throw ApiError{400, "unknown parameter '" + key + "'", key, "unknown_parameter"};
  const Fields f(body);
  if (const auto model = f.string("model"); model && *model != ctx.model_name)
    throw ApiError{404, "The model '" + *model + "' does not exist; this server serves '" + ctx.model_name + "'", "model",
                   "model_not_found"};
  const auto content = f.string("content");
  if (!content) throw ApiError{400, "'content' is required", "content", "missing"};
  uint32_t flags = 0;
  if (f.boolean("add_special").value_or(false)) flags |= EP_TOKENIZE_ADD_SPECIAL;
  if (!f.boolean("parse_special").value_or(true)) flags |= EP_TOKENIZE_SPECIAL_AS_TEXT;
  return {{"tokens", tokenize(ctx, *content, flags)}};
}

nlohmann::json detokenize_request(const std::string &text, const RequestContext &ctx) {
  const json body = parse_body(text, ctx.limits);
  for (const auto &[key, value] : body.items())
    if (!value.is_null() && key != "tokens" && key != "skip_special" && key != "model")
      throw ApiError{400, "unknown parameter '" + key + "'", key, "unknown_parameter"};
  const Fields f(body);
  if (const auto model = f.string("model"); model && *model != ctx.model_name)
    throw ApiError{404, "The model '" + *model + "' does not exist; this server serves '" + ctx.model_name + "'", "model",
                   "model_not_found"};
  const json *tokens = f.get("tokens");
  if (!tokens) throw ApiError{400, "'tokens' is required", "tokens", "missing"};
  if (!tokens->is_array()) throw ApiError{400, "'tokens' must be an array of token ids", "tokens", "invalid_type"};
  std::vector<int32_t> ids;
  for (const json &t : *tokens) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= ctx.vocab_size)
      throw ApiError{400, "'tokens' must hold integers in [0, " + std::to_string(ctx.vocab_size) + ")", "tokens", "invalid_value"};
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  const uint32_t flags = f.boolean("skip_special").value_or(false) ? EP_DETOKENIZE_SKIP_SPECIAL : 0;
  size_t n = 0;
  if (ep_detokenize(nullptr, 0, &n, ctx.tokenizer, ids.data(), ids.size(), flags) != EP_OK)
    throw ApiError{400, std::string("cannot detokenize: ") + ep_last_error(), "tokens", "invalid_value"};
  std::string out(n + 1, '\0');
  if (ep_detokenize(out.data(), out.size(), &n, ctx.tokenizer, ids.data(), ids.size(), flags) != EP_OK)
    throw ApiError{400, std::string("cannot detokenize: ") + ep_last_error(), "tokens", "invalid_value"};
  out.resize(n);
  return {{"content", out}};
}

ParsedRequest parse_chat_request(const std::string &body, const RequestContext &ctx) { return parse_chat(parse_body(body, ctx.limits), ctx); }

ParsedRequest parse_completion_request(const std::string &body, const RequestContext &ctx) {
  return parse_completion(parse_body(body, ctx.limits), ctx);
}

}  // namespace ep_server
