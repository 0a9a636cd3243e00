// C API: tokenizers, chat templates and text generation (include/expertpack/text.h): handles
// over the engine's ChatTokenizer, struct-size copies and the exception barrier.
#include <expertpack/expertpack.h>

#include "capi/guard.hpp"
#include "capi/model_internal.hpp"
#include "engine/text.hpp"
#include "tokenizer/utf8.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

struct ep_tokenizer {
  std::unique_ptr<ep::engine::ChatTokenizer> t;
};

struct ep_text_stream {
  std::unique_ptr<ep::engine::TextStream> stream;
};

namespace ep::capi {
const ep::engine::ChatTokenizer &chat_tokenizer_of(const ep_tokenizer &tokenizer) { return *tokenizer.t; }
}  // namespace ep::capi

namespace {

using ep::tokenizer::ChatTemplate;

constexpr size_t kTokenizerPropertiesV1 = sizeof(ep_tokenizer_properties);
constexpr size_t kChatOptionsV1 = offsetof(ep_chat_options, tools_json);  // before the tool fields

void fill_text(char *out, size_t capacity, size_t *out_length, const std::string &s, const char *fn) {
  ep::capi::require_arg(out_length, fn, "out_length");
  if (capacity) ep::capi::require_arg(out, fn, "out_text");
  *out_length = s.size();
  if (capacity > s.size()) {
    std::memcpy(out, s.data(), s.size());
    out[s.size()] = '\0';
  } else if (capacity) {
    out[0] = '\0';
  }
}

/// The caller's options over the defaults (fields past its struct_size keep theirs).
ep_chat_options copy_chat_options(const ep_chat_options *options) {
  ep_chat_options o;
  ep_chat_options_init(&o);
  if (options) {
    ep::capi::check_struct_size(options->struct_size, kChatOptionsV1, sizeof(ep_chat_options), "ep_chat_options");
    std::memcpy(&o, options, std::min(options->struct_size, sizeof(ep_chat_options)));
    o.struct_size = sizeof(ep_chat_options);
  }
  return o;
}

ep::engine::ChatOptions read_chat_options(const ep_chat_options *options, const char *fn) {
  const ep_chat_options o = copy_chat_options(options);
  ep::engine::ChatOptions co;
  switch (o.chat_template) {
    case EP_CHAT_TEMPLATE_AUTO: break;
    case EP_CHAT_TEMPLATE_DEEPSEEK_V4: co.chat_template = ChatTemplate::deepseek_v4; break;
    case EP_CHAT_TEMPLATE_KIMI_K3: co.chat_template = ChatTemplate::kimi_k3; break;
    default:
      ep::fail(ep::Status::invalid_argument, "{}: chat_template {} is not a template to render with", fn,
               static_cast<int>(o.chat_template));
  }
  if (o.thinking < -1 || o.thinking > 1) ep::fail(ep::Status::invalid_argument, "{}: thinking {} (expected -1, 0 or 1)", fn, o.thinking);
  if (o.add_generation_prompt < 0 || o.add_generation_prompt > 1)
    ep::fail(ep::Status::invalid_argument, "{}: add_generation_prompt {} (expected 0 or 1)", fn, o.add_generation_prompt);
  if (o.thinking >= 0) co.thinking = o.thinking != 0;
  co.add_generation_prompt = o.add_generation_prompt != 0;
  if (o.tools_json) co.tools_json = o.tools_json;
  if (o.tool_choice) {
    co.tool_choice = o.tool_choice;
    if (co.tool_choice != "auto" && co.tool_choice != "none" && co.tool_choice != "required")
      ep::fail(ep::Status::invalid_argument, "{}: tool_choice '{}' (expected NULL, auto, none or required)", fn, co.tool_choice);
  }
  return co;
}

/// One message's tool fields (ep_chat_options::message_tools_json) into @p m.
void read_message_tools(ep::engine::ChatMessage &m, const char *text, size_t i, const char *fn) {
  using ojson = nlohmann::ordered_json;
  const ojson j = ojson::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    ep::fail(ep::Status::invalid_argument, "{}: message_tools_json[{}] is not a JSON object", fn, i);
  const auto str = [&](const ojson &v, const std::string &field) {
    if (!v.is_string()) ep::fail(ep::Status::invalid_argument, "{}: message_tools_json[{}].{} must be a string, got {}", fn, i, field, v.type_name());
    return v.get<std::string>();
  };
  for (const auto &[key, v] : j.items()) {
    if (v.is_null()) continue;
    if (key == "tool_call_id") {
      m.tool_call_id = str(v, key);
    } else if (key == "name") {
      m.name = str(v, key);
    } else if (key == "tool_calls") {
      if (!v.is_array()) ep::fail(ep::Status::invalid_argument, "{}: message_tools_json[{}].tool_calls must be an array", fn, i);
      for (size_t c = 0; c < v.size(); ++c) {
        const std::string at = "tool_calls[" + std::to_string(c) + "]";
        const ojson &call = v[c];
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object())
          ep::fail(ep::Status::invalid_argument, "{}: message_tools_json[{}].{} must be an object with a 'function' object", fn, i, at);
        const ojson &f = call["function"];
        ep::tokenizer::ToolCall tc;
        if (call.contains("id") && !call["id"].is_null()) tc.id = str(call["id"], at + ".id");
        if (!f.contains("name")) ep::fail(ep::Status::invalid_argument, "{}: message_tools_json[{}].{}.function has no name", fn, i, at);
        tc.name = str(f["name"], at + ".function.name");
        if (f.contains("arguments") && !f["arguments"].is_null())
          tc.arguments = f["arguments"].is_string() ? f["arguments"].get<std::string>() : f["arguments"].dump();
        m.tool_calls.push_back(std::move(tc));
      }
    } else {
      ep::fail(ep::Status::invalid_argument, "{}: message_tools_json[{}] has the field '{}' (expected tool_calls, tool_call_id, name)", fn, i,
               key);
    }
  }
}

std::vector<ep::engine::ChatMessage> read_messages(const ep_chat_message *messages, size_t n, const ep_chat_options *options,
                                                   const char *fn) {
  if (n) ep::capi::require_arg(messages, fn, "messages");
  const ep_chat_options o = copy_chat_options(options);
  std::vector<ep::engine::ChatMessage> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (!messages[i].role) ep::fail(ep::Status::invalid_argument, "{}: messages[{}].role is NULL", fn, i);
    out[i].role = messages[i].role;
    if (messages[i].content) out[i].content = messages[i].content;
    if (messages[i].reasoning_content) out[i].reasoning = messages[i].reasoning_content;
    if (o.message_tools_json && o.message_tools_json[i]) read_message_tools(out[i], o.message_tools_json[i], i, fn);
  }
  return out;
}

ep::engine::TextSink text_sink(ep_text_fn callback, void *payload) {
  if (!callback) return {};
  return [callback, payload](std::string_view text) { return callback(text.data(), text.size(), payload); };
}

/// Runs @p body with the engine's stats and writes them to @p out_stats, also when it throws.
template <class Body>
void with_stats(ep_generate_stats *out_stats, Body &&body) {
  ep::engine::GenerateStats st;
  try {
    body(st);
  } catch (...) {
    ep::capi::write_generate_stats(out_stats, st);
    throw;
  }
  ep::capi::write_generate_stats(out_stats, st);
}

}  // namespace

extern "C" {

EP_API ep_status ep_tokenizer_open(ep_tokenizer **out_tokenizer, const char *path) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_tokenizer, fn, "out_tokenizer");
    *out_tokenizer = nullptr;
    ep::capi::require_arg(path, fn, "path");
    auto t = std::make_unique<ep_tokenizer>();
    t->t = ep::engine::open_tokenizer(path);
    *out_tokenizer = t.release();
  });
}

EP_API ep_status ep_tokenizer_open_model(ep_tokenizer **out_tokenizer, const ep_model *model) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_tokenizer, fn, "out_tokenizer");
    *out_tokenizer = nullptr;
    ep::capi::require_arg(model, fn, "model");
    auto t = std::make_unique<ep_tokenizer>();
    t->t = ep::engine::open_model_tokenizer(ep::capi::model_engine(*model));
    *out_tokenizer = t.release();
  });
}

EP_API void ep_tokenizer_close(ep_tokenizer *tokenizer) { delete tokenizer; }

EP_API void ep_tokenizer_properties_init(ep_tokenizer_properties *properties) {
  if (!properties) return;
  *properties = ep_tokenizer_properties{};
  properties->struct_size = sizeof(ep_tokenizer_properties);
}

EP_API ep_status ep_tokenizer_info(ep_tokenizer_properties *out_properties, const ep_tokenizer *tokenizer) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_properties, fn, "out_properties");
    ep::capi::require_arg(tokenizer, fn, "tokenizer");
    ep::capi::check_struct_size(out_properties->struct_size, kTokenizerPropertiesV1, sizeof(ep_tokenizer_properties),
                                "ep_tokenizer_properties");
    ep_tokenizer_properties p{};
    p.struct_size = out_properties->struct_size;
    p.vocab_size = static_cast<uint32_t>(tokenizer->t->tok.vocab_size());
    p.bos_id = tokenizer->t->bos;
    p.eos_id = tokenizer->t->eos;
    p.end_of_turn_id = tokenizer->t->end_of_turn;
    p.chat_template = !tokenizer->t->chat ? EP_CHAT_TEMPLATE_NONE
                      : *tokenizer->t->chat == ChatTemplate::deepseek_v4 ? EP_CHAT_TEMPLATE_DEEPSEEK_V4
                                                                       : EP_CHAT_TEMPLATE_KIMI_K3;
    std::memcpy(out_properties, &p, std::min(out_properties->struct_size, sizeof(p)));
  });
}

EP_API ep_status ep_tokenizer_token_id(int32_t *out_id, const ep_tokenizer *tokenizer, const char *token) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_id, fn, "out_id");
    ep::capi::require_arg(tokenizer, fn, "tokenizer");
    ep::capi::require_arg(token, fn, "token");
    const auto id = tokenizer->t->tok.token_to_id(token);
    if (!id) ep::fail(ep::Status::not_found, "{}: no token '{}' in {}", fn, token, tokenizer->t->tok.describe());
    *out_id = *id;
  });
}

EP_API ep_status ep_tokenize(int32_t *out_ids, size_t capacity, size_t *out_count, const ep_tokenizer *tokenizer,
                             const char *text, size_t length, uint32_t flags) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_count, fn, "out_count");
    ep::capi::require_arg(tokenizer, fn, "tokenizer");
    if (length) ep::capi::require_arg(text, fn, "text");
    if (capacity) ep::capi::require_arg(out_ids, fn, "out_ids");
    if (flags & ~uint32_t{EP_TOKENIZE_ADD_SPECIAL | EP_TOKENIZE_SPECIAL_AS_TEXT})
      ep::fail(ep::Status::invalid_argument, "{}: unknown flags 0x{:x}", fn, flags);
    ep::tokenizer::EncodeOptions eo;
    eo.add_special = (flags & EP_TOKENIZE_ADD_SPECIAL) != 0;
    eo.match_special = (flags & EP_TOKENIZE_SPECIAL_AS_TEXT) == 0;
    const std::vector<int32_t> ids = tokenizer->t->tok.encode(std::string_view(text ? text : "", length), eo);
    *out_count = ids.size();
    if (capacity >= ids.size()) std::copy(ids.begin(), ids.end(), out_ids);
  });
}

EP_API ep_status ep_detokenize(char *out_text, size_t capacity, size_t *out_length, const ep_tokenizer *tokenizer,
                               const int32_t *ids, size_t n_ids, uint32_t flags) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(tokenizer, fn, "tokenizer");
    if (n_ids) ep::capi::require_arg(ids, fn, "ids");
    if (flags & ~uint32_t{EP_DETOKENIZE_SKIP_SPECIAL}) ep::fail(ep::Status::invalid_argument, "{}: unknown flags 0x{:x}", fn, flags);
    const std::string text = tokenizer->t->tok.decode(std::span<const int32_t>(ids, n_ids), (flags & EP_DETOKENIZE_SKIP_SPECIAL) != 0);
    fill_text(out_text, capacity, out_length, text, fn);
  });
}

EP_API void ep_chat_options_init(ep_chat_options *options) {
  if (!options) return;
  *options = ep_chat_options{};
  options->struct_size = sizeof(ep_chat_options);
  options->chat_template = EP_CHAT_TEMPLATE_AUTO;
  options->thinking = -1;
  options->add_generation_prompt = 1;
}

EP_API ep_status ep_chat_render(char *out_text, size_t capacity, size_t *out_length, const ep_tokenizer *tokenizer,
                                const ep_chat_message *messages, size_t n_messages, const ep_chat_options *options) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_length, fn, "out_length");
    ep::capi::require_arg(tokenizer, fn, "tokenizer");
    const ep::engine::ChatOptions o = read_chat_options(options, fn);
    const std::vector<ep::engine::ChatMessage> msgs = read_messages(messages, n_messages, options, fn);
    fill_text(out_text, capacity, out_length, ep::engine::render_chat(*tokenizer->t, msgs, o), fn);
  });
}

EP_API ep_status ep_chat_tool_call_prefix(char *out_text, size_t capacity, size_t *out_length, const ep_tokenizer *tokenizer,
                                          const char *name, const ep_chat_options *options) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_length, fn, "out_length");
    ep::capi::require_arg(tokenizer, fn, "tokenizer");
    const ep::engine::ChatOptions o = read_chat_options(options, fn);
    const std::string n = name ? name : "";
    if (const size_t bad = ep::tokenizer::utf8_first_invalid(n); bad != n.size())
      ep::fail(ep::Status::invalid_argument, "{}: name is not valid UTF-8 (byte {})", fn, bad);
    fill_text(out_text, capacity, out_length, ep::engine::tool_call_prefix(*tokenizer->t, o, n), fn);
  });
}

EP_API ep_status ep_generate_text(ep_generate_stats *out_stats, ep_session *session, const ep_tokenizer *tokenizer,
                                  const char *prompt, const ep_generate_options *options, ep_text_fn callback,
                                  void *payload) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(session, fn, "session");
    ep::capi::require_arg(tokenizer, fn, "tokenizer");
    ep::capi::require_arg(prompt, fn, "prompt");
    ep::capi::check_generate_stats(out_stats);
    const ep::engine::GenerateParams params = ep::capi::generate_params(ep::capi::read_generate_options(options, fn));
    with_stats(out_stats, [&](ep::engine::GenerateStats &st) {
      ep::engine::generate_text(ep::capi::session_of(*session), *tokenizer->t, std::string(prompt), params,
                                text_sink(callback, payload), st);
    });
  });
}

EP_API ep_status ep_generate_chat(ep_generate_stats *out_stats, ep_session *session, const ep_tokenizer *tokenizer,
                                  const ep_chat_message *messages, size_t n_messages, const ep_chat_options *chat_options,
                                  const ep_generate_options *options, ep_text_fn callback, void *payload) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(session, fn, "session");
    ep::capi::require_arg(tokenizer, fn, "tokenizer");
    ep::capi::require_arg(messages, fn, "messages");
    if (!n_messages) ep::fail(ep::Status::invalid_argument, "{}: no messages", fn);
    ep::capi::check_generate_stats(out_stats);
    const ep::engine::ChatOptions co = read_chat_options(chat_options, fn);
    const std::vector<ep::engine::ChatMessage> msgs = read_messages(messages, n_messages, chat_options, fn);
    const ep::engine::GenerateParams params = ep::capi::generate_params(ep::capi::read_generate_options(options, fn));
    with_stats(out_stats, [&](ep::engine::GenerateStats &st) {
      ep::engine::generate_chat(ep::capi::session_of(*session), *tokenizer->t, msgs, co, params, text_sink(callback, payload), st);
    });
  });
}

EP_API ep_status ep_text_stream_open(ep_text_stream **out_stream, const ep_tokenizer *tokenizer,
                                     const char *const *stop_strings, size_t n_stop_strings) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_stream, fn, "out_stream");
    *out_stream = nullptr;
    ep::capi::require_arg(tokenizer, fn, "tokenizer");
    if (n_stop_strings) ep::capi::require_arg(stop_strings, fn, "stop_strings");
    std::vector<std::string> stops;
    for (size_t i = 0; i < n_stop_strings; ++i) {
      if (!stop_strings[i]) ep::fail(ep::Status::invalid_argument, "{}: stop_strings[{}] is NULL", fn, i);
      stops.emplace_back(stop_strings[i]);
    }
    auto s = std::make_unique<ep_text_stream>();
    s->stream = std::make_unique<ep::engine::TextStream>(*tokenizer->t, std::move(stops));
    *out_stream = s.release();
  });
}

namespace {
ep_status text_stream_step(ep_text_stream *stream, const int32_t *token, ep_text_fn callback, void *payload,
                           int32_t *out_stopped, const char *function) {
  return ep::capi::guard(function, [&](const char *fn) {
    ep::capi::require_arg(stream, fn, "stream");
    if (out_stopped) *out_stopped = 0;
    const ep::engine::TextSink sink = text_sink(callback, payload);
    const int r = token ? stream->stream->push(*token, sink) : stream->stream->finish(sink);
    if (out_stopped) *out_stopped = r > 0 || stream->stream->stopped() ? 1 : 0;
    if (r < 0) ep::fail(ep::Status::cancelled, "{}: the callback stopped the text", fn);
  });
}
}  // namespace

EP_API ep_status ep_text_stream_push(ep_text_stream *stream, int32_t token, ep_text_fn callback, void *payload,
                                     int32_t *out_stopped) {
  return text_stream_step(stream, &token, callback, payload, out_stopped, __func__);
}

EP_API ep_status ep_text_stream_finish(ep_text_stream *stream, ep_text_fn callback, void *payload, int32_t *out_stopped) {
  return text_stream_step(stream, nullptr, callback, payload, out_stopped, __func__);
}

EP_API void ep_text_stream_close(ep_text_stream *stream) { delete stream; }

}  // extern "C"
