#include "api.hpp"

#include "connection.hpp"
#include "job.hpp"
#include "tool_calls.hpp"

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <cctype>
#include <chrono>
#include <ctime>
#include <memory>
#include <mutex>
#include <random>
#include <string>

namespace ep_server {

namespace {

using nlohmann::json;
using namespace std::chrono_literals;

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

int64_t unix_now() { return static_cast<int64_t>(std::time(nullptr)); }

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

/// The tool calls of one answer as they are parsed out of its content (ParsedRequest::tools).
struct ToolCalls {
  ToolCallParser parser;

  explicit ToolCalls(const ParsedRequest &c) : parser(c.tool_format, c.parallel_tool_calls) {
    if (!c.tool_prime.empty()) parser.prime(c.tool_prime);
  }
  /// OpenAI's delta objects of @p d's calls (a call's first piece: its id, type and name).
  json deltas(const ToolDelta &d) {
    json out = json::array();
    for (const ToolCallDelta &c : d.calls) {
      json fn = {{"arguments", c.arguments}};
      json item = {{"index", c.index}};
      if (!c.name.empty()) {
        item["id"] = "call_" + new_id("call").substr(5);  // OpenAI's spelling: call_<random>
        item["type"] = "function";
        fn["name"] = c.name;
      }
      item["function"] = std::move(fn);
      out.push_back(std::move(item));
    }
    return out;
  }
};

/// finish_reason: "tool_calls" when the model stopped after making calls.
std::string finish_reason_of(FinishReason reason, const ToolCalls *tools) {
  if (tools && tools->parser.calls() > 0 && reason == FinishReason::stop) return "tool_calls";
  return finish_reason_name(reason);
}

json bytes_of(const std::string &text) {
  json b = json::array();
  for (const char ch : text) b.push_back(static_cast<unsigned char>(ch));
  return b;
}

/// A chat choice's "logprobs": {"content": [{token, logprob, bytes, top_logprobs}], "refusal": null}.
json chat_logprobs(const std::vector<TokenLogprob> &entries) {
  json content = json::array();
  for (const TokenLogprob &e : entries) {
    json top = json::array();
    for (const TokenLogprob::Alternative &a : e.top) top.push_back({{"token", a.token}, {"logprob", a.logprob}, {"bytes", bytes_of(a.token)}});
    content.push_back({{"token", e.token}, {"logprob", e.logprob}, {"bytes", bytes_of(e.token)}, {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

/// A legacy completion choice's "logprobs": {tokens, token_logprobs, top_logprobs, text_offset};
/// @p offset is where the first entry's text starts in the answer (advanced past the last).
json completion_logprobs(const std::vector<TokenLogprob> &entries, size_t &offset) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (const TokenLogprob &e : entries) {
    tokens.push_back(e.token);
    lps.push_back(e.logprob);
    json top = json::object();
    for (const TokenLogprob::Alternative &a : e.top)
      if (!top.contains(a.token)) top[a.token] = a.logprob;  // the likelier of two tokens with one text
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += e.token.size();
  }
  return {{"tokens", std::move(tokens)}, {"token_logprobs", std::move(lps)}, {"top_logprobs", std::move(tops)}, {"text_offset", std::move(offsets)}};
}

/// The whole answer: one choice per answer (JobRequest::n); @p tools: one parser per answer, or
/// empty without tools.
json full_answer(const Answer &a, const std::vector<Job::Delta> &texts, const JobResult &r, bool logprobs,
                 const std::vector<std::shared_ptr<ToolCalls>> &tools) {
  json choices = json::array();
  for (size_t i = 0; i < texts.size(); ++i) {
    const Job::Delta &text = texts[i];
    const FinishReason reason = i < r.choices.size() ? r.choices[i] : r.finish;
    ToolCalls *calls_of = i < tools.size() ? tools[i].get() : nullptr;
    json choice = {{"index", i}, {"logprobs", nullptr}};
    if (a.chat) {
      json msg = {{"role", "assistant"}, {"content", text.content}};
      if (calls_of) {
        ToolDelta d;
        calls_of->parser.push(text.content, d);
        calls_of->parser.finish(d);
        json calls = json::array();
        for (const json &piece : calls_of->deltas(d)) {
          if (piece.contains("id"))
            calls.push_back({{"id", piece["id"]}, {"type", "function"}, {"function", {{"name", piece["function"]["name"]}, {"arguments", ""}}}});
          calls[piece["index"].get<size_t>()]["function"]["arguments"] =
              calls[piece["index"].get<size_t>()]["function"]["arguments"].get<std::string>() + piece["function"]["arguments"].get<std::string>();
        }
        msg["content"] = d.content.empty() && !calls.empty() ? json(nullptr) : json(d.content);
        if (!calls.empty()) msg["tool_calls"] = std::move(calls);
      }
      if (!text.reasoning.empty()) msg["reasoning_content"] = text.reasoning;
      choice["message"] = std::move(msg);
      choice["finish_reason"] = finish_reason_of(reason, calls_of);  // after the parsing: its calls decide
      if (logprobs) choice["logprobs"] = chat_logprobs(text.logprobs);
    } else {
      choice["text"] = text.content;
      choice["finish_reason"] = finish_reason_name(reason);
      size_t offset = 0;
      if (logprobs) choice["logprobs"] = completion_logprobs(text.logprobs, offset);
    }
    choices.push_back(std::move(choice));
  }
  return {{"id", a.id},
          {"object", a.object()},
          {"created", a.created},
          {"model", a.model},
          {"choices", std::move(choices)},
          {"usage", usage_json(r.usage)},
          {"timings", timings_json(r.usage)}};
}

/// One streamed chunk of answer @p index: @p delta holds the chat delta fields (chat) or the text
/// (completions); @p logprobs the choice's "logprobs" (null without).
json chunk(const Answer &a, size_t index, const json &delta, const json &finish_reason, bool include_usage,
           const json &logprobs = nullptr) {
  json choice = {{"index", index}, {"finish_reason", finish_reason}, {"logprobs", logprobs}};
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
  std::vector<std::shared_ptr<ToolCalls>> tools;  // one parser per answer; empty: no tools
  bool started = false;
  std::vector<size_t> text_offsets;  // per answer: completions' text_offset of its next token

  /// The chunks of answer @p i's content (through its tool-call parser with tools), with
  /// @p logprobs (null: none) on the content chunk, which goes out even empty when it has them.
  std::string content_chunks(size_t i, const std::string &content, bool end, const json &logprobs) {
    std::string out;
    if (tools.empty()) {
      if (!content.empty() || !logprobs.is_null())
        out += sse(chunk(answer, i, {{"content", content}}, nullptr, include_usage, logprobs));
      return out;
    }
    ToolDelta d;
    tools[i]->parser.push(content, d);
    if (end) tools[i]->parser.finish(d);
    if (!d.content.empty() || !logprobs.is_null())
      out += sse(chunk(answer, i, {{"content", d.content}}, nullptr, include_usage, logprobs));
    if (!d.calls.empty()) out += sse(chunk(answer, i, {{"tool_calls", tools[i]->deltas(d)}}, nullptr, include_usage));
    return out;
  }

  /// One call of the content provider: waits a little for output and writes it.
  bool pump(httplib::DataSink &sink) {
    const size_t n = job->request().n;
    const bool logprobs = job->request().logprobs >= 0;
    std::string out;
    if (!started) {
      started = true;
      text_offsets.assign(n, 0);
      if (answer.chat)
        for (size_t i = 0; i < n; ++i) out += sse(chunk(answer, i, {{"role", "assistant"}, {"content", ""}}, nullptr, include_usage));
    }
    std::vector<Job::Delta> deltas;
    const bool done = job->wait_take(100ms, deltas);
    const bool ended = done && job->result().finish != FinishReason::error;
    for (size_t i = 0; i < deltas.size(); ++i) {
      const Job::Delta &d = deltas[i];
      // The tokens' log-probabilities go with the content that came with them (or the reasoning,
      // or an empty content delta when their text is still held back).
      const bool lp = logprobs && !d.logprobs.empty();
      if (answer.chat) {
        const bool lp_on_reasoning = lp && d.content.empty() && !d.reasoning.empty();
        if (!d.reasoning.empty())
          out += sse(chunk(answer, i, {{"reasoning_content", d.reasoning}}, nullptr, include_usage,
                           lp_on_reasoning ? chat_logprobs(d.logprobs) : json(nullptr)));
        out += content_chunks(i, d.content, ended, lp && !lp_on_reasoning ? chat_logprobs(d.logprobs) : json(nullptr));
      } else if (!d.content.empty() || lp) {
        out += sse(chunk(answer, i, d.content, nullptr, include_usage, lp ? completion_logprobs(d.logprobs, text_offsets[i]) : json(nullptr)));
      }
    }
    if (done) {
      const JobResult r = job->result();
      if (r.finish == FinishReason::error) {
        out += sse(error_json(r.error_status, r.error_message));
      } else {
        for (size_t i = 0; i < n; ++i)
          out += sse(chunk(answer, i, answer.chat ? json::object() : json(""),
                           finish_reason_of(i < r.choices.size() ? r.choices[i] : r.finish, i < tools.size() ? tools[i].get() : nullptr),
                           include_usage));
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
void run_job(const ApiContext &ctx, const httplib::Request &req, httplib::Response &res, ParsedRequest c, bool chat) {
  // max_tokens by default, and a request that never fits: 400 before it is queued.
  ctx.scheduler->kv().admit(c.job, chat ? "messages" : "prompt", ctx.limits.max_tokens);
  std::vector<std::shared_ptr<ToolCalls>> tools;  // one parser per answer
  if (c.tools)
    for (uint32_t i = 0; i < c.job.n; ++i) tools.push_back(std::make_shared<ToolCalls>(c));
  auto job = std::make_shared<Job>(std::move(c.job));
  if (!ctx.scheduler->submit(job)) throw ApiError{503, "the server is shutting down", "", "shutting_down"};
  Answer a{chat, new_id(chat ? "chatcmpl" : "cmpl"), ctx.model_name, unix_now()};
  if (c.stream) {
    auto s = std::make_shared<Streamer>(
        Streamer{job, a, c.include_usage, ConnectionProbe(req.local_addr, req.local_port, req.remote_addr, req.remote_port), tools, false, {}});
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream", [s](size_t, httplib::DataSink &sink) { return s->pump(sink); },
        [s](bool success) {
          if (!success) s->job->cancel();
        });
    return;
  }
  const ConnectionProbe probe(req.local_addr, req.local_port, req.remote_addr, req.remote_port);
  std::vector<Job::Delta> text;
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
  send_json(res, full_answer(a, text, r, job->request().logprobs >= 0, tools));
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
  if (path == "/tokenize") return "tokenize";
  if (path == "/detokenize") return "detokenize";
  if (path == "/props") return "props";
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


void install_routes(httplib::Server &server, const ApiContext &ctx) {
  const ApiContext *c = &ctx;
  server.set_pre_routing_handler([c](const httplib::Request &req, httplib::Response &res) {
    const bool keyed = req.path.rfind("/v1/", 0) == 0 || req.path == "/tokenize" || req.path == "/detokenize" || req.path == "/props";
    if (c->api_key.empty() || !keyed) return httplib::Server::HandlerResponse::Unhandled;
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
  server.Post("/tokenize", guarded_body([c](const httplib::Request &req, httplib::Response &res, const httplib::ContentReader &reader) {
                send_json(res, tokenize_request(read_body(req, res, reader, c->limits), *c));
              }));
  server.Post("/detokenize", guarded_body([c](const httplib::Request &req, httplib::Response &res, const httplib::ContentReader &reader) {
                send_json(res, detokenize_request(read_body(req, res, reader, c->limits), *c));
              }));
  server.Get("/props", guarded([c](const httplib::Request &, httplib::Response &res) {
               const char *tmpl = c->chat_template == EP_CHAT_TEMPLATE_DEEPSEEK_V4 ? "deepseek-v4"
                                  : c->chat_template == EP_CHAT_TEMPLATE_KIMI_K3  ? "kimi-k3"
                                                                                  : nullptr;
               const int thinking = c->thinking >= 0 ? c->thinking : c->chat_template == EP_CHAT_TEMPLATE_KIMI_K3 ? 1 : 0;
               send_json(res, {{"model", c->model_name},
                               {"architecture", c->architecture},
                               {"vocab_size", c->vocab_size},
                               {"chat_template", tmpl ? json(tmpl) : json(nullptr)},
                               {"parallel", c->parallel},
                               {"default_generation_settings",
                                {{"temperature", c->temperature}, {"top_p", c->top_p}, {"max_tokens", nullptr}, {"thinking", thinking == 1}}},
                               {"limits",
                                {{"max_body_bytes", c->limits.max_body_bytes},
                                 {"max_prompt_tokens", c->limits.max_prompt_tokens},
                                 {"max_tokens", c->limits.max_tokens ? json(c->limits.max_tokens) : json(nullptr)},
                                 {"max_stop", c->limits.max_stop}}},
                               {"version", ep_version_string()}});
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
                run_job(*c, req, res, parse_chat_request(read_body(req, res, reader, c->limits), *c), true);
              }));
  server.Post("/v1/completions",
              guarded_body([c](const httplib::Request &req, httplib::Response &res, const httplib::ContentReader &reader) {
                run_job(*c, req, res, parse_completion_request(read_body(req, res, reader, c->limits), *c), false);
              }));
}

}  // namespace ep_server
