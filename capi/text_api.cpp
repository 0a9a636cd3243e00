// C API: tokenizers, chat templates and text generation (include/expertpack/text.h).
#include <expertpack/expertpack.h>

#include "capi/guard.hpp"
#include "capi/model_internal.hpp"
#include "format/file_format.hpp"
#include "format/gguf.hpp"
#include "tokenizer/chat_template.hpp"
#include "tokenizer/tokenizer.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

struct ep_tokenizer {
  ep::tokenizer::Tokenizer tok;
  std::optional<ep::tokenizer::ChatTemplate> chat;
  std::string bos_text;
  int32_t bos = -1, eos = -1, end_of_turn = -1;
  bool adds_bos = false;

  explicit ep_tokenizer(ep::tokenizer::Tokenizer t) : tok(std::move(t)) {}
};

namespace {

namespace fs = std::filesystem;
using ep::tokenizer::ChatTemplate;

constexpr size_t kTokenizerPropertiesV1 = sizeof(ep_tokenizer_properties);
constexpr size_t kChatOptionsV1 = sizeof(ep_chat_options);

/// The tokenizer file in a checkpoint directory.
std::string tokenizer_file_in(const fs::path &dir, const char *fn) {
  for (const char *name : {"tokenizer.json", "tiktoken.model", "tokenizer.model"}) {
    std::error_code ec;
    if (fs::is_regular_file(dir / name, ec)) return (dir / name).string();
  }
  ep::fail(ep::Status::not_found, "{}: {} holds no tokenizer.json (nor tiktoken.model / tokenizer.model)", fn, dir.string());
}

std::unique_ptr<ep_tokenizer> open_tokenizer(const std::string &path_in, const char *fn) {
  std::error_code ec;
  if (!fs::exists(path_in, ec)) ep::fail(ep::Status::not_found, "{}: {} does not exist", fn, path_in);
  const std::string path = fs::is_directory(path_in, ec) ? tokenizer_file_in(path_in, fn) : path_in;
  auto t = std::make_unique<ep_tokenizer>(ep::tokenizer::Tokenizer::from_file(path));
  if (const auto text = ep::tokenizer::read_chat_template_text(path)) t->chat = ep::tokenizer::detect_chat_template_text(*text);
  if (!t->chat) t->chat = ep::tokenizer::detect_chat_template_tokens(t->tok);
  if (const auto b = t->tok.bos_id()) {
    t->bos = *b;
    const int32_t ids[1] = {*b};
    t->bos_text = t->tok.decode(ids);
  }
  if (const auto e = t->tok.eos_id()) t->eos = *e;
  ep::tokenizer::EncodeOptions eo;
  eo.add_special = true;
  const std::vector<int32_t> empty = t->tok.encode("", eo);
  t->adds_bos = t->bos >= 0 && !empty.empty() && empty.front() == t->bos;
  t->end_of_turn = t->eos;
  if (t->chat)
    if (const auto id = t->tok.token_to_id(ep::tokenizer::end_of_turn_token(*t->chat))) t->end_of_turn = *id;
  return t;
}

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

ep_chat_options read_chat_options(const ep_chat_options *options) {
  ep_chat_options o;
  ep_chat_options_init(&o);
  if (options) {
    ep::capi::check_struct_size(options->struct_size, kChatOptionsV1, sizeof(ep_chat_options), "ep_chat_options");
    std::memcpy(&o, options, std::min(options->struct_size, sizeof(ep_chat_options)));
    o.struct_size = sizeof(ep_chat_options);
  }
  return o;
}

std::string render(const ep_tokenizer &t, const ep_chat_message *messages, size_t n, const ep_chat_options &o, const char *fn) {
  if (n) ep::capi::require_arg(messages, fn, "messages");
  ChatTemplate which;
  switch (o.chat_template) {
    case EP_CHAT_TEMPLATE_AUTO:
      if (!t.chat)
        ep::fail(ep::Status::unsupported, "{}: no chat template is known for this tokenizer ({}); pick one in ep_chat_options", fn,
                 t.tok.describe());
      which = *t.chat;
      break;
    case EP_CHAT_TEMPLATE_DEEPSEEK_V4: which = ChatTemplate::deepseek_v4; break;
    case EP_CHAT_TEMPLATE_KIMI_K3: which = ChatTemplate::kimi_k3; break;
    default:
      ep::fail(ep::Status::invalid_argument, "{}: chat_template {} is not a template to render with", fn,
               static_cast<int>(o.chat_template));
  }
  if (o.thinking < -1 || o.thinking > 1) ep::fail(ep::Status::invalid_argument, "{}: thinking {} (expected -1, 0 or 1)", fn, o.thinking);
  if (o.add_generation_prompt < 0 || o.add_generation_prompt > 1)
    ep::fail(ep::Status::invalid_argument, "{}: add_generation_prompt {} (expected 0 or 1)", fn, o.add_generation_prompt);
  std::vector<ep::tokenizer::ChatMessage> msgs(n);
  for (size_t i = 0; i < n; ++i) {
    if (!messages[i].role) ep::fail(ep::Status::invalid_argument, "{}: messages[{}].role is NULL", fn, i);
    msgs[i].role = messages[i].role;
    if (messages[i].content) msgs[i].content = messages[i].content;
    if (messages[i].reasoning_content) msgs[i].reasoning = messages[i].reasoning_content;
  }
  ep::tokenizer::ChatRenderOptions ro;
  ro.add_generation_prompt = o.add_generation_prompt != 0;
  if (o.thinking >= 0) ro.thinking = o.thinking != 0;
  ro.bos_token = t.bos_text;
  return ep::tokenizer::render_chat(which, msgs, ro);
}

/// Streams generated tokens as text: complete UTF-8 only (StreamDecoder), special tokens
/// skipped, and text that may begin a stop string held back until it is known not to.
class TextStream {
 public:
  TextStream(const ep_tokenizer &t, const ep_generate_options &o, ep_text_fn cb, void *payload)
      : dec_(t.tok, /*skip_special=*/true), cb_(cb), payload_(payload) {
    for (size_t i = 0; i < o.n_stop_strings; ++i) stops_.emplace_back(o.stop_strings[i]);
  }
  /// 0 continue, 1 a stop string ended the text, -1 the callback cancelled.
  int push(int32_t token) {
    pending_ += dec_.push(token);
    return drain(false);
  }
  int finish() {
    pending_ += dec_.finish();
    return drain(true);
  }

 private:
  int emit(const std::string &s) {
    if (s.empty() || !cb_) return 0;
    return cb_(s.data(), s.size(), payload_) != 0 ? -1 : 0;
  }
  int drain(bool final) {
    size_t cut = std::string::npos;
    for (const std::string &s : stops_) cut = std::min(cut, pending_.find(s));
    if (cut != std::string::npos) {
      const int r = emit(pending_.substr(0, cut));
      pending_.clear();
      stopped_ = true;
      return r < 0 ? -1 : 1;
    }
    size_t hold = 0;
    if (!final)
      for (const std::string &s : stops_)
        for (size_t k = std::min(s.size() - 1, pending_.size()); k > hold; --k)
          if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
            hold = k;
            break;
          }
    const std::string out = pending_.substr(0, pending_.size() - hold);
    pending_.erase(0, pending_.size() - hold);
    return emit(out);
  }

  ep::tokenizer::StreamDecoder dec_;
  ep_text_fn cb_;
  void *payload_;
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
};

/// Generates text after @p prompt on @p session (see ep_generate_text()).
void generate_text(ep_generate_stats *out_stats, ep_session &session, const ep_tokenizer &t, std::span<const int32_t> prompt,
                   const ep_generate_options *options, ep_text_fn callback, void *payload, uint32_t reused, const char *fn) {
  ep_generate_options opts = ep::capi::read_generate_options(options, true, fn);
  std::vector<int32_t> stop_tokens(opts.stop_tokens, opts.stop_tokens + opts.n_stop_tokens);
  if (!opts.ignore_eos)
    for (int32_t id : {t.eos, t.end_of_turn})
      if (id >= 0) stop_tokens.push_back(id);
  opts.stop_tokens = stop_tokens.data();
  opts.n_stop_tokens = stop_tokens.size();
  TextStream stream(t, opts, callback, payload);
  ep_generate_stats st{};
  const ep::capi::TokenHook hook = [&](int32_t token, uint32_t, ep_stop_reason &reason) {
    const int r = stream.push(token);
    if (r > 0) reason = EP_STOP_STRING;
    return r;
  };
  try {
    ep::capi::generate(session, prompt, opts, hook, st, fn);
  } catch (...) {
    st.reused_tokens = reused;
    ep::capi::write_generate_stats(out_stats, st);
    throw;
  }
  st.reused_tokens = reused;
  if (st.stop_reason != EP_STOP_STRING) {
    const int r = stream.finish();
    if (r > 0) st.stop_reason = EP_STOP_STRING;
    if (r < 0) {
      st.stop_reason = EP_STOP_CANCELLED;
      ep::capi::write_generate_stats(out_stats, st);
      ep::fail(ep::Status::cancelled, "{}: the callback stopped generation after {} tokens", fn, st.generated_tokens);
    }
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
    *out_tokenizer = open_tokenizer(path, fn).release();
  });
}

EP_API ep_status ep_tokenizer_open_model(ep_tokenizer **out_tokenizer, const ep_model *model) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_tokenizer, fn, "out_tokenizer");
    *out_tokenizer = nullptr;
    ep::capi::require_arg(model, fn, "model");
    const std::string &source = ep::capi::model_source_path(*model);
    std::error_code ec;
    std::string path;
    if (fs::is_directory(source, ec))
      path = tokenizer_file_in(source, fn);
    else if (ep::format::is_gguf_file(source))
      path = source;
    else
      path = tokenizer_file_in(fs::path(source).parent_path(), fn);
    if (path == source && ep::format::is_gguf_file(source)) {
      // A GGUF without tokenizer.ggml.*: the checkpoint's own tokenizer files beside it (e.g.
      // Kimi-K3's tiktoken.model with tokenizer_config.json), else not found.
      const ep::format::GgufFile f = ep::format::GgufFile::open(source);
      if (!f.find("tokenizer.ggml.tokens")) {
        try {
          path = tokenizer_file_in(fs::path(source).parent_path(), fn);
        } catch (const ep::Error &) {
          ep::fail(ep::Status::not_found,
                   "{}: the model's GGUF {} has no tokenizer (tokenizer.ggml.tokens) and its directory no tokenizer.json, "
                   "tiktoken.model or tokenizer.model; open one with ep_tokenizer_open()",
                   fn, source);
        }
      }
    }
    auto t = open_tokenizer(path, fn);
    // No template text or markers: the model's architecture decides where it has one.
    if (!t->chat) {
      t->chat = ep::tokenizer::chat_template_by_name(ep::capi::model_architecture(*model));
      if (t->chat)
        if (const auto id = t->tok.token_to_id(ep::tokenizer::end_of_turn_token(*t->chat))) t->end_of_turn = *id;
    }
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
    p.vocab_size = static_cast<uint32_t>(tokenizer->tok.vocab_size());
    p.bos_id = tokenizer->bos;
    p.eos_id = tokenizer->eos;
    p.end_of_turn_id = tokenizer->end_of_turn;
    p.chat_template = !tokenizer->chat ? EP_CHAT_TEMPLATE_NONE
                      : *tokenizer->chat == ChatTemplate::deepseek_v4 ? EP_CHAT_TEMPLATE_DEEPSEEK_V4
                                                                       : EP_CHAT_TEMPLATE_KIMI_K3;
    std::memcpy(out_properties, &p, std::min(out_properties->struct_size, sizeof(p)));
  });
}

EP_API ep_status ep_tokenizer_token_id(int32_t *out_id, const ep_tokenizer *tokenizer, const char *token) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_id, fn, "out_id");
    ep::capi::require_arg(tokenizer, fn, "tokenizer");
    ep::capi::require_arg(token, fn, "token");
    const auto id = tokenizer->tok.token_to_id(token);
    if (!id) ep::fail(ep::Status::not_found, "{}: no token '{}' in {}", fn, token, tokenizer->tok.describe());
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
    const std::vector<int32_t> ids = tokenizer->tok.encode(std::string_view(text ? text : "", length), eo);
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
    const std::string text = tokenizer->tok.decode(std::span<const int32_t>(ids, n_ids), (flags & EP_DETOKENIZE_SKIP_SPECIAL) != 0);
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
    const ep_chat_options o = read_chat_options(options);
    fill_text(out_text, capacity, out_length, render(*tokenizer, messages, n_messages, o, fn), fn);
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
    std::vector<int32_t> ids;
    if (ep::capi::session_tokens(*session).empty() && tokenizer->adds_bos) ids.push_back(tokenizer->bos);
    tokenizer->tok.encode_append(prompt, ids);
    generate_text(out_stats, *session, *tokenizer, ids, options, callback, payload, 0, fn);
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
    ep_chat_options co = read_chat_options(chat_options);
    co.add_generation_prompt = 1;
    const std::string text = render(*tokenizer, messages, n_messages, co, fn);
    const std::vector<int32_t> ids = tokenizer->tok.encode(text);
    const std::span<const int32_t> have = ep::capi::session_tokens(*session);
    size_t reused = 0;
    if (!have.empty() && have.size() <= ids.size() && std::equal(have.begin(), have.end(), ids.begin()))
      reused = have.size();
    else if (!have.empty())
      ep::capi::session_reset(*session);
    generate_text(out_stats, *session, *tokenizer, std::span<const int32_t>(ids).subspan(reused), options, callback, payload,
                  static_cast<uint32_t>(reused), fn);
  });
}

}  // extern "C"
