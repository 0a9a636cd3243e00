#include "api.hpp"

#include "connection.hpp"
#include "job.hpp"

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <cctype>
#include <chrono>
#include <ctime>
#include <memory>
#include <mutex>
#include <map>
#include <optional>
#include <set>
#include <random>
#include <string>
#include <vector>

namespace ep_server {

namespace {

using nlohmann::json;
using namespace std::chrono_literals;

/// A request the API refuses: becomes an OpenAI-style error object.
struct ApiError {
  int status;
  std::string message;
  std::string param;  // empty: null
  std::string code;   // empty: null
};

const char *error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "invalid_request_error";
    case 429: return "rate_limit_error";
    case 499: return "cancelled";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

json error_json(int status, const std::string &message, const std::string &param = {}, const std::string &code = {}) {
  return {{"error",
           {{"message", message},
            {"type", error_type(status)},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

std::string dump(const json &j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_error(httplib::Response &res, int status, const std::string &message, const std::string &param = {},
                const std::string &code = {}) {
  res.status = status;
  res.set_content(dump(error_json(status, message, param, code)), "application/json");
}

void send_json(httplib::Response &res, const json &j) { res.set_content(dump(j), "application/json"); }

/// Random ids for responses ("chatcmpl-…"), unique within and across runs.
std::string new_id(const char *prefix) {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mu);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%s-%016llx%08llx", prefix, static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng() & 0xffffffffu));
  return buf;
}

uint64_t random_seed() {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mu);
  return rng();
}

int64_t unix_now() { return static_cast<int64_t>(std::time(nullptr)); }

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
      {"functions", "function calling is not supported"},
      {"function_call", "function calling is not supported"},
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
  if (const json *bias = f.object("logit_bias"); bias && !bias->empty())
    throw ApiError{400, "'logit_bias' is not supported", "logit_bias", "unsupported"};
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

/// What the chat and completion endpoints share: sampling, limits, stop strings, streaming.
struct Common {
  JobRequest job;
  bool stream = false;
  bool include_usage = false;
};

Common parse_common(const Fields &f, const ApiContext &ctx) {
  Common c;
  if (const auto model = f.string("model"); model && *model != ctx.model_name)
    throw ApiError{404, "The model '" + *model + "' does not exist; this server serves '" + ctx.model_name + "'", "model",
                   "model_not_found"};
  if (const auto n = f.integer("n", 1, INT64_MAX); n && *n != 1) throw ApiError{400, "only n = 1 is supported", "n", "unsupported"};
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
  std::optional<int64_t> max_tokens = f.integer("max_completion_tokens", 1, ctx.limits.max_tokens);
  if (const auto mt = f.integer("max_tokens", 1, ctx.limits.max_tokens); !max_tokens) max_tokens = mt;
  c.job.max_tokens = static_cast<uint32_t>(max_tokens.value_or(ctx.limits.max_tokens));
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
  if (const json *lp = f.get("logprobs"); lp && !(lp->is_boolean() && !lp->get<bool>()))
    throw ApiError{400, "'logprobs' is not supported", "logprobs", "unsupported"};
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

std::vector<int32_t> tokenize(const ApiContext &ctx, const std::string &text, uint32_t flags) {
  size_t n = 0;
  if (ep_tokenize(nullptr, 0, &n, ctx.tokenizer, text.data(), text.size(), flags) != EP_OK)
    throw ApiError{400, std::string("cannot tokenize the prompt: ") + ep_last_error(), "", "invalid_value"};
  std::vector<int32_t> ids(n);
  if (n && ep_tokenize(ids.data(), ids.size(), &n, ctx.tokenizer, text.data(), text.size(), flags) != EP_OK)
    throw ApiError{400, std::string("cannot tokenize the prompt: ") + ep_last_error(), "", "invalid_value"};
  return ids;
}

void check_prompt_length(const ApiContext &ctx, size_t n, const char *param) {
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
};

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
      if (!value.is_null() && key != "role" && key != "content" && key != "reasoning_content" && key != "tool_calls")
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
    if (const json *tc = mf.get("tool_calls"); tc && !(tc->is_array() && tc->empty()))
      throw ApiError{400, "'" + at + ".tool_calls': tool calls are not supported", at + ".tool_calls", "unsupported"};
    out.push_back(std::move(msg));
  }
  return out;
}

/// The conversation rendered by the model's chat template.
std::string render(const ApiContext &ctx, const std::vector<Message> &messages, int thinking, bool generation_prompt) {
  std::vector<ep_chat_message> cm;
  for (const Message &m : messages) cm.push_back({m.role.c_str(), m.content.c_str(), m.reasoning.empty() ? nullptr : m.reasoning.c_str()});
  ep_chat_options co;
  ep_chat_options_init(&co);
  co.chat_template = ctx.chat_template;
  co.thinking = thinking;
  co.add_generation_prompt = generation_prompt ? 1 : 0;
  size_t n = 0;
  if (ep_chat_render(nullptr, 0, &n, ctx.tokenizer, cm.data(), cm.size(), &co) != EP_OK)
    throw ApiError{400, std::string("cannot render the conversation: ") + ep_last_error(), "messages", "invalid_value"};
  std::string text(n + 1, '\0');
  if (ep_chat_render(text.data(), text.size(), &n, ctx.tokenizer, cm.data(), cm.size(), &co) != EP_OK)
    throw ApiError{400, std::string("cannot render the conversation: ") + ep_last_error(), "messages", "invalid_value"};
  text.resize(n);
  return text;
}

int parse_thinking(const Fields &f, const ApiContext &ctx) {
  if (const auto t = f.boolean("thinking")) return *t ? 1 : 0;
  if (const json *kw = f.object("chat_template_kwargs")) {
    const Fields kf(*kw);
    for (const char *k : {"thinking", "enable_thinking"})
      if (const auto t = kf.boolean(k)) return *t ? 1 : 0;
  }
  if (ctx.thinking >= 0) return ctx.thinking;
  return ctx.chat_template == EP_CHAT_TEMPLATE_KIMI_K3 ? 1 : 0;  // the templates' defaults
}

Common parse_chat(const json &body, const ApiContext &ctx) {
  check_parameters(body, true);
  const Fields f(body);
  if (ctx.chat_template == EP_CHAT_TEMPLATE_NONE)
    throw ApiError{400, "this model's tokenizer has no chat template: use /v1/completions", "messages", "unsupported"};
  Common c = parse_common(f, ctx);
  if (const json *tools = f.get("tools"); tools && !(tools->is_array() && tools->empty()))
    throw ApiError{400, "tools are not supported", "tools", "unsupported"};
  if (const json *rf = f.object("response_format")) {
    const auto type = rf->find("type");
    if (type == rf->end() || *type != "text") throw ApiError{400, "only response_format {\"type\": \"text\"} is supported", "response_format", "unsupported"};
  }
  if (const json *lp = f.get("top_logprobs"); lp && !(lp->is_number_integer() && lp->get<int64_t>() == 0))
    throw ApiError{400, "'top_logprobs' is not supported", "top_logprobs", "unsupported"};
  std::vector<Message> messages = parse_messages(f);
  const int thinking = parse_thinking(f, ctx);
  c.job.prompt = tokenize(ctx, render(ctx, messages, thinking, true), 0);
  check_prompt_length(ctx, c.job.prompt.size(), "messages");
  // The state a next turn can continue from: where this prompt and the rendering of the
  // conversation with an answer and one more user message part (DeepSeek-V4 renders an earlier
  // answer without its thinking, so the two part just after the assistant's marker).
  messages.push_back({"assistant", "", ""});
  messages.push_back({"user", "", ""});
  const std::vector<int32_t> next = tokenize(ctx, render(ctx, messages, thinking, false), 0);
  size_t common = 0;
  while (common < next.size() && common < c.job.prompt.size() && next[common] == c.job.prompt[common]) ++common;
  c.job.snapshot_at = common;
  c.job.split_reasoning = true;
  c.job.start_in_reasoning = thinking == 1;
  return c;
}

// ---- completions ----------------------------------------------------------------------------

Common parse_completion(const json &body, const ApiContext &ctx) {
  check_parameters(body, false);
  const Fields f(body);
  Common c = parse_common(f, ctx);
  for (const char *k : {"echo"})
    if (f.boolean(k).value_or(false)) throw ApiError{400, std::string("'") + k + "' is not supported", k, "unsupported"};
  if (f.string("suffix")) throw ApiError{400, "'suffix' is not supported", "suffix", "unsupported"};
  if (const auto b = f.integer("best_of", 1, INT64_MAX); b && *b != 1) throw ApiError{400, "only best_of = 1 is supported", "best_of", "unsupported"};
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

// ---- answers --------------------------------------------------------------------------------

json usage_json(const Usage &u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}},
          {"completion_tokens_details", {{"reasoning_tokens", u.reasoning_tokens}}}};
}

/// What the OpenAI objects do not have: where the time and the expert reads went.
json timings_json(const Usage &u) {
  return {{"queue_ms", u.queue_ms},
          {"prefill_ms", u.prefill_ms},
          {"decode_ms", u.decode_ms},
          {"prompt_tokens_run", u.prompt_tokens - u.cached_tokens},
          {"prefill_expert_bytes", u.prefill_expert_bytes},
          {"decode_expert_bytes", u.decode_expert_bytes}};
}

struct Answer {
  bool chat;
  std::string id, model;
  int64_t created;
  std::string object() const { return chat ? "chat.completion" : "text_completion"; }
  std::string chunk_object() const { return chat ? "chat.completion.chunk" : "text_completion"; }
};

json full_answer(const Answer &a, const Job::Delta &text, const JobResult &r) {
  json choice = {{"index", 0}, {"finish_reason", finish_reason_name(r.finish)}, {"logprobs", nullptr}};
  if (a.chat) {
    json msg = {{"role", "assistant"}, {"content", text.content}};
    if (!text.reasoning.empty()) msg["reasoning_content"] = text.reasoning;
    choice["message"] = std::move(msg);
  } else {
    choice["text"] = text.content;
  }
  return {{"id", a.id},
          {"object", a.object()},
          {"created", a.created},
          {"model", a.model},
          {"choices", json::array({choice})},
          {"usage", usage_json(r.usage)},
          {"timings", timings_json(r.usage)}};
}

/// One streamed chunk: @p delta holds the chat delta fields (chat) or the text (completions).
json chunk(const Answer &a, const json &delta, const json &finish_reason, bool include_usage) {
  json choice = {{"index", 0}, {"finish_reason", finish_reason}, {"logprobs", nullptr}};
  if (a.chat) choice["delta"] = delta;
  else choice["text"] = delta;
  json j = {{"id", a.id}, {"object", a.chunk_object()}, {"created", a.created}, {"model", a.model}, {"choices", json::array({choice})}};
  if (include_usage) j["usage"] = nullptr;
  return j;
}

std::string sse(const json &j) { return "data: " + dump(j) + "\n\n"; }

/// The streamed answer's state, shared by httplib's content provider calls.
struct Streamer {
  std::shared_ptr<Job> job;
  Answer answer;
  bool include_usage = false;
  ConnectionProbe probe;
  bool started = false;

  /// One call of the content provider: waits a little for output and writes it.
  bool pump(httplib::DataSink &sink) {
    std::string out;
    if (!started) {
      started = true;
      if (answer.chat) out += sse(chunk(answer, {{"role", "assistant"}, {"content", ""}}, nullptr, include_usage));
    }
    Job::Delta d;
    const bool done = job->wait_take(100ms, d);
    if (answer.chat) {
      if (!d.reasoning.empty()) out += sse(chunk(answer, {{"reasoning_content", d.reasoning}}, nullptr, include_usage));
      if (!d.content.empty()) out += sse(chunk(answer, {{"content", d.content}}, nullptr, include_usage));
    } else if (!d.content.empty()) {
      out += sse(chunk(answer, d.content, nullptr, include_usage));
    }
    if (done) {
      const JobResult r = job->result();
      if (r.finish == FinishReason::error) {
        out += sse(error_json(r.error_status, r.error_message));
      } else {
        out += sse(chunk(answer, answer.chat ? json::object() : json(""), finish_reason_name(r.finish), include_usage));
        if (include_usage) {
          json u = {{"id", answer.id},         {"object", answer.chunk_object()}, {"created", answer.created}, {"model", answer.model},
                    {"choices", json::array()}, {"usage", usage_json(r.usage)},    {"timings", timings_json(r.usage)}};
          out += sse(u);
        }
      }
      out += "data: [DONE]\n\n";
    }
    if (!out.empty() && !sink.write(out.data(), out.size())) {
      job->cancel();
      return false;
    }
    if (done) {
      sink.done();
      return true;
    }
    if (probe.client_gone()) {
      job->cancel();
      return false;
    }
    return true;
  }
};

/// Runs a parsed request: queues it and answers, streamed or whole.
void run_job(const ApiContext &ctx, const httplib::Request &req, httplib::Response &res, Common c, bool chat) {
  auto job = std::make_shared<Job>(std::move(c.job));
  if (!ctx.scheduler->submit(job)) throw ApiError{503, "the server is shutting down", "", "shutting_down"};
  Answer a{chat, new_id(chat ? "chatcmpl" : "cmpl"), ctx.model_name, unix_now()};
  if (c.stream) {
    auto s = std::make_shared<Streamer>(Streamer{job, a, c.include_usage, ConnectionProbe(req.local_addr, req.local_port, req.remote_addr, req.remote_port)});
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream", [s](size_t, httplib::DataSink &sink) { return s->pump(sink); },
        [s](bool success) {
          if (!success) s->job->cancel();
        });
    return;
  }
  const ConnectionProbe probe(req.local_addr, req.local_port, req.remote_addr, req.remote_port);
  Job::Delta text;
  while (!job->wait_take(100ms, text)) {
    if (probe.client_gone()) {
      job->cancel();
      res.status = 499;  // nobody reads it: the client closed the connection
      return;
    }
  }
  const JobResult r = job->result();
  if (r.finish == FinishReason::error) throw ApiError{r.error_status, r.error_message, "", ""};
  res.set_header("X-Prefill-Expert-Bytes", std::to_string(r.usage.prefill_expert_bytes));
  res.set_header("X-Cached-Tokens", std::to_string(r.usage.cached_tokens));
  send_json(res, full_answer(a, text, r));
}

/// A request's body, read as it arrives and refused (413) as soon as it passes the limit: a
/// chunked body has no length to check before it is read, and is never read whole when too large.
std::string read_body(const httplib::Request &req, const httplib::Response &res, const httplib::ContentReader &reader,
                      const Limits &limits) {
  if (req.is_multipart_form_data())
    throw ApiError{415, "the request body must be JSON (Content-Type: application/json), not multipart form data", "",
                   "unsupported_media_type"};
  std::string body;
  bool too_large = false;
  const bool whole = reader([&](const char *data, size_t n) {
    if (n > limits.max_body_bytes - body.size()) {
      too_large = true;
      return false;
    }
    body.append(data, n);
    return true;
  });
  // httplib answers a Content-Length over the limit itself (413) before reading any of it.
  if (too_large || res.status == 413)
    throw ApiError{413, "the request body is larger than " + std::to_string(limits.max_body_bytes) + " bytes", "", "request_too_large"};
  if (!whole)
    throw ApiError{400, "the request body was not received whole (malformed chunked encoding, cut off, or not sent in time)", "",
                   "invalid_body"};
  return body;
}

/// Wraps a handler: ApiErrors and exceptions become error objects.
template <class F>
httplib::Server::Handler guarded(F f) {
  return [f](const httplib::Request &req, httplib::Response &res) {
    try {
      f(req, res);
    } catch (const ApiError &e) {
      send_error(res, e.status, e.message, e.param, e.code);
    } catch (const std::exception &e) {
      send_error(res, 500, std::string("internal error: ") + e.what());
    }
  };
}

/// guarded() for a handler that reads the body itself (read_body()).
template <class F>
httplib::Server::HandlerWithContentReader guarded_body(F f) {
  return [f](const httplib::Request &req, httplib::Response &res, const httplib::ContentReader &reader) {
    try {
      f(req, res, reader);
    } catch (const ApiError &e) {
      send_error(res, e.status, e.message, e.param, e.code);
    } catch (const std::exception &e) {
      send_error(res, 500, std::string("internal error: ") + e.what());
    }
  };
}

std::string endpoint_of(const std::string &path) {
  if (path == "/v1/chat/completions") return "chat_completions";
  if (path == "/v1/completions") return "completions";
  if (path == "/v1/models" || path.rfind("/v1/models/", 0) == 0) return "models";
  if (path == "/health") return "health";
  if (path == "/metrics") return "metrics";
  return "other";
}

/// The credentials of an `Authorization: Bearer TOKEN` header; the scheme's name is
/// case-insensitive (RFC 9110 11.1), so `bearer` and `BEARER` count too. Empty for another scheme.
std::string bearer_token(const std::string &auth) {
  const std::string scheme = "bearer";
  if (auth.size() <= scheme.size() || auth[scheme.size()] != ' ') return {};
  for (size_t i = 0; i < scheme.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(auth[i])) != scheme[i]) return {};
  const size_t at = auth.find_first_not_of(' ', scheme.size());
  return at == std::string::npos ? std::string() : auth.substr(at);
}

bool equal_constant_time(const std::string &a, const std::string &b) {
  if (a.size() != b.size() || b.empty()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
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

void install_routes(httplib::Server &server, const ApiContext &ctx) {
  const ApiContext *c = &ctx;
  server.set_pre_routing_handler([c](const httplib::Request &req, httplib::Response &res) {
    if (c->api_key.empty() || req.path.rfind("/v1/", 0) != 0) return httplib::Server::HandlerResponse::Unhandled;
    if (equal_constant_time(bearer_token(req.get_header_value("Authorization")), c->api_key))
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, 401, "a valid API key is required (Authorization: Bearer KEY)", "", "invalid_api_key");
    return httplib::Server::HandlerResponse::Handled;
  });
  server.set_error_handler(httplib::Server::HandlerWithResponse([c](const httplib::Request &req, httplib::Response &res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;  // an answer of ours
    if (res.status == 404)
      send_error(res, 404, "no endpoint " + req.method + " " + req.path, "", "not_found");
    else if (res.status == 413)
      send_error(res, 413, "the request body is larger than " + std::to_string(c->limits.max_body_bytes) + " bytes", "", "request_too_large");
    else
      send_error(res, res.status, "the request was refused (HTTP " + std::to_string(res.status) + ")");
    return httplib::Server::HandlerResponse::Handled;
  }));
  server.set_exception_handler([](const httplib::Request &, httplib::Response &res, std::exception_ptr) {
    send_error(res, 500, "internal error");
  });
  server.set_logger([c](const httplib::Request &req, const httplib::Response &res) { c->metrics->http_request(endpoint_of(req.path), res.status); });

  server.Get("/health", guarded([c](const httplib::Request &, httplib::Response &res) {
               // Degraded: the expert store has failed reads (an expert failed its check or could not be
               // read). The server goes on answering the requests that do not route to it.
               const Metrics::Health h = c->metrics->health();
               if (h.store_io_errors == 0 && h.model_errors == 0) return send_json(res, {{"status", "ok"}});
               send_json(res, {{"status", "degraded"},
                               {"store_io_errors", h.store_io_errors},
                               {"requests_failed_by_model", h.model_errors},
                               {"message", "the expert store has failed reads: requests that route to the experts concerned fail "
                                           "(500); the server's log names them"}});
             }));
  server.Get("/metrics", guarded([c](const httplib::Request &, httplib::Response &res) {
               res.set_content(c->metrics->render(), "text/plain; version=0.0.4; charset=utf-8");
             }));
  const auto model_json = [c] { return json{{"id", c->model_name}, {"object", "model"}, {"created", c->created}, {"owned_by", "expertpack"}}; };
  server.Get("/v1/models", guarded([model_json](const httplib::Request &, httplib::Response &res) {
               send_json(res, {{"object", "list"}, {"data", json::array({model_json()})}});
             }));
  server.Get(R"(/v1/models/(.+))", guarded([c, model_json](const httplib::Request &req, httplib::Response &res) {
               const std::string id = req.matches[1];
               if (id != c->model_name) throw ApiError{404, "The model '" + id + "' does not exist", "model", "model_not_found"};
               send_json(res, model_json());
             }));
  server.Post("/v1/chat/completions",
              guarded_body([c](const httplib::Request &req, httplib::Response &res, const httplib::ContentReader &reader) {
                run_job(*c, req, res, parse_chat(parse_body(read_body(req, res, reader, c->limits), c->limits), *c), true);
              }));
  server.Post("/v1/completions",
              guarded_body([c](const httplib::Request &req, httplib::Response &res, const httplib::ContentReader &reader) {
                run_job(*c, req, res, parse_completion(parse_body(read_body(req, res, reader, c->limits), c->limits), *c), false);
              }));
}

}  // namespace ep_server
