#include "engine/text.hpp"

#include "core/error.hpp"
#include "engine/engine.hpp"
#include "engine/session.hpp"
#include "format/file_format.hpp"
#include "format/gguf.hpp"

#include <algorithm>
#include <chrono>
#include <filesystem>

namespace ep::engine {

namespace {

namespace fs = std::filesystem;

/// The tokenizer file in a checkpoint directory.
std::string tokenizer_file_in(const fs::path &dir) {
  for (const char *name : {"tokenizer.json", "tiktoken.model", "tokenizer.model"}) {
    std::error_code ec;
    if (fs::is_regular_file(dir / name, ec)) return (dir / name).string();
  }
  fail(Status::not_found, "{} holds no tokenizer.json (nor tiktoken.model / tokenizer.model)", dir.string());
}

}  // namespace

TextStream::TextStream(const ChatTokenizer &t, std::vector<std::string> stop_strings)
    : dec_(t.tok, /*skip_special=*/true), stops_(std::move(stop_strings)) {
  for (size_t i = 0; i < stops_.size(); ++i)
    if (stops_[i].empty()) fail(Status::invalid_argument, "stop_strings[{}] is empty", i);
}

int TextStream::push(int32_t token, const TextSink &sink) {
  if (stopped_) return 1;
  pending_ += dec_.push(token);
  return drain(false, sink);
}

int TextStream::finish(const TextSink &sink) {
  if (stopped_) return 1;
  pending_ += dec_.finish();
  return drain(true, sink);
}

int TextStream::drain(bool final, const TextSink &sink) {
  auto emit = [&](const std::string &text) { return text.empty() || !sink ? 0 : (sink(text) != 0 ? -1 : 0); };
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

std::shared_ptr<const grammar::Vocabulary> ChatTokenizer::vocabulary() const {
  std::lock_guard<std::mutex> lock(vocabulary_mu_);
  if (!vocabulary_) vocabulary_ = grammar::Vocabulary::from_tokenizer(tok);
  return vocabulary_;
}

std::shared_ptr<const grammar::TokenGrammar> json_grammar(const ChatTokenizer &t, const std::string *schema) {
  grammar::JsonGrammar g = schema ? grammar::JsonGrammar::from_schema(*schema) : grammar::JsonGrammar::any_object();
  std::vector<int32_t> end;
  for (int32_t id : {t.eos, t.end_of_turn})
    if (id >= 0 && std::find(end.begin(), end.end(), id) == end.end()) end.push_back(id);
  if (end.empty()) fail(Status::unsupported, "JSON grammar: the tokenizer ({}) has no EOS or end-of-turn token to end the value with", t.tok.describe());
  return std::make_shared<const grammar::TokenGrammar>(std::move(g), t.vocabulary(), std::move(end));
}

std::unique_ptr<ChatTokenizer> open_tokenizer(const std::string &path_in) {
  std::error_code ec;
  if (!fs::exists(path_in, ec)) fail(Status::not_found, "{} does not exist", path_in);
  const std::string path = fs::is_directory(path_in, ec) ? tokenizer_file_in(path_in) : path_in;
  auto t = std::make_unique<ChatTokenizer>(tokenizer::Tokenizer::from_file(path));
  if (const auto text = tokenizer::read_chat_template_text(path)) t->chat = tokenizer::detect_chat_template_text(*text);
  if (!t->chat) t->chat = tokenizer::detect_chat_template_tokens(t->tok);
  if (const auto b = t->tok.bos_id()) {
    t->bos = *b;
    const int32_t ids[1] = {*b};
    t->bos_text = t->tok.decode(ids);
  }
  if (const auto e = t->tok.eos_id()) t->eos = *e;
  tokenizer::EncodeOptions eo;
  eo.add_special = true;
  const std::vector<int32_t> empty = t->tok.encode("", eo);
  t->adds_bos = t->bos >= 0 && !empty.empty() && empty.front() == t->bos;
  t->end_of_turn = t->eos;
  if (t->chat)
    if (const auto id = t->tok.token_to_id(tokenizer::end_of_turn_token(*t->chat))) t->end_of_turn = *id;
  return t;
}

std::unique_ptr<ChatTokenizer> open_model_tokenizer(const Engine &engine) {
  const std::string &source = engine.source_path();
  std::error_code ec;
  std::string path;
  if (fs::is_directory(source, ec))
    path = tokenizer_file_in(source);
  else if (format::is_gguf_file(source))
    path = source;
  else
    path = tokenizer_file_in(fs::path(source).parent_path());
  if (path == source && format::is_gguf_file(source)) {
    // A GGUF without tokenizer.ggml.*: the checkpoint's own tokenizer files beside it (e.g.
    // Kimi-K3's tiktoken.model with tokenizer_config.json), else not found.
    const format::GgufFile f = format::GgufFile::open(source);
    if (!f.find("tokenizer.ggml.tokens")) {
      try {
        path = tokenizer_file_in(fs::path(source).parent_path());
      } catch (const Error &) {
        fail(Status::not_found,
             "the model's GGUF {} has no tokenizer (tokenizer.ggml.tokens) and its directory no tokenizer.json, "
             "tiktoken.model or tokenizer.model; open one with ep_tokenizer_open()",
             source);
      }
    }
  }
  auto t = open_tokenizer(path);
  // No template text or markers: the model's architecture decides where it has one.
  if (!t->chat) {
    t->chat = tokenizer::chat_template_by_name(engine.info().architecture);
    if (t->chat)
      if (const auto id = t->tok.token_to_id(tokenizer::end_of_turn_token(*t->chat))) t->end_of_turn = *id;
  }
  return t;
}

namespace {

tokenizer::ChatTemplate template_of(const ChatTokenizer &t, const ChatOptions &o) {
  const std::optional<tokenizer::ChatTemplate> which = o.chat_template ? o.chat_template : t.chat;
  if (!which)
    fail(Status::unsupported, "no chat template is known for this tokenizer ({}); pick one in ep_chat_options",
         t.tok.describe());
  return *which;
}

tokenizer::ChatRenderOptions render_options(const ChatTokenizer &t, const ChatOptions &o) {
  tokenizer::ChatRenderOptions ro;
  ro.add_generation_prompt = o.add_generation_prompt;
  if (o.thinking) ro.thinking = *o.thinking;
  ro.bos_token = t.bos_text;
  ro.tools_json = o.tools_json;
  ro.tool_choice = o.tool_choice;
  return ro;
}

}  // namespace

std::string render_chat(const ChatTokenizer &t, std::span<const ChatMessage> messages, const ChatOptions &o) {
  return tokenizer::render_chat(template_of(t, o), messages, render_options(t, o));
}

std::string tool_call_prefix(const ChatTokenizer &t, const ChatOptions &o, std::string_view name) {
  return tokenizer::tool_call_prefix(template_of(t, o), render_options(t, o), name);
}

void generate_text(Session &session, const ChatTokenizer &t, std::span<const int32_t> prompt, const GenerateParams &params_in,
                   const TextSink &sink, GenerateStats &st) {
  GenerateParams params = params_in;
  if (!params.ignore_eos)
    for (int32_t id : {t.eos, t.end_of_turn})
      if (id >= 0) params.stop_tokens.push_back(id);
  check_generate_params(params);
  TextStream stream(t, params.stop_strings);
  const TokenHook hook = [&](int32_t token, uint32_t, StopReason &reason) {
    const int r = stream.push(token, sink);
    if (r > 0) reason = StopReason::string;
    return r;
  };
  const uint32_t reused = st.reused_tokens;
  try {
    generate(session, prompt, params, hook, st);
  } catch (...) {
    st.reused_tokens = reused;
    throw;
  }
  st.reused_tokens = reused;
  if (st.stop_reason != StopReason::string) {
    const int r = stream.finish(sink);
    if (r > 0) st.stop_reason = StopReason::string;
    if (r < 0) {
      st.stop_reason = StopReason::cancelled;
      fail(Status::cancelled, "the callback stopped generation after {} tokens", st.generated_tokens);
    }
  }
}

void generate_text(Session &session, const ChatTokenizer &t, const std::string &text, const GenerateParams &params,
                   const TextSink &sink, GenerateStats &stats) {
  std::vector<int32_t> ids;
  if (session.tokens().empty() && t.adds_bos) ids.push_back(t.bos);
  t.tok.encode_append(text, ids);
  stats.reused_tokens = 0;
  generate_text(session, t, ids, params, sink, stats);
}

namespace {

size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  const size_t n = std::min(a.size(), b.size());
  return static_cast<size_t>(std::mismatch(a.begin(), a.begin() + n, b.begin()).first - a.begin());
}

bool is_prefix(std::span<const int32_t> p, std::span<const int32_t> of) {
  return p.size() <= of.size() && std::equal(p.begin(), p.end(), of.begin());
}

}  // namespace

void generate_chat(Session &session, const ChatTokenizer &t, std::span<const ChatMessage> messages, const ChatOptions &options,
                   const GenerateParams &params, const TextSink &sink, GenerateStats &stats) {
  if (messages.empty()) fail(Status::invalid_argument, "no messages");
  ChatOptions o = options;
  o.add_generation_prompt = true;
  const std::vector<int32_t> ids = t.tok.encode(render_chat(t, messages, o));
  // Where the next turn's rendering (this conversation, an answer, one more user message) parts
  // from this prompt: DeepSeek-V4 renders an answered turn without the generation prompt's
  // thinking markers, so the two part right after the assistant's marker. The state there is
  // kept, and the next turn continues from it.
  size_t keep_at = ids.size();
  {
    std::vector<ChatMessage> next(messages.begin(), messages.end());
    next.push_back({"assistant", "", ""});
    next.push_back({"user", "", ""});
    ChatOptions no_prompt = options;
    no_prompt.add_generation_prompt = false;
    try {
      keep_at = common_prefix(ids, t.tok.encode(render_chat(t, next, no_prompt)));
    } catch (const Error &) {
      keep_at = ids.size();  // a template that refuses the probe: no snapshot (reuse is an optimisation)
    }
  }
  // Reuse: the session itself when its tokens start this rendering, else its kept snapshot.
  size_t reused = 0;
  if (!session.tokens().empty() && is_prefix(session.tokens(), ids)) {
    reused = session.tokens().size();
  } else if (!session.snapshot_tokens().empty() && is_prefix(session.snapshot_tokens(), ids)) {
    session.restore_snapshot();
    reused = session.tokens().size();
  } else if (!session.tokens().empty() || !session.snapshot_tokens().empty()) {
    session.reset();
  }
  stats.reused_tokens = static_cast<uint32_t>(reused);
  if (keep_at <= reused || keep_at >= ids.size()) {
    generate_text(session, t, std::span<const int32_t>(ids).subspan(reused), params, sink, stats);
    return;
  }
  // the prompt up to the parting point, the snapshot, then the rest with the generation
  Engine &engine = session.engine();
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t read0 = engine.expert_read_bytes();
  session.append(std::span<const int32_t>(ids).subspan(reused, keep_at - reused));
  session.keep_snapshot();
  const double head_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const uint64_t head_bytes = engine.expert_read_bytes() - read0;
  auto count_head = [&] {  // the statistics cover the whole prompt pass, also when generation throws
    stats.prompt_tokens += static_cast<uint32_t>(keep_at - reused);
    stats.prefill_seconds += head_seconds;
    stats.prefill_expert_bytes += head_bytes;
    stats.prefill_tokens_per_second = stats.prefill_seconds > 0 ? stats.prompt_tokens / stats.prefill_seconds : 0.0;
  };
  try {
    generate_text(session, t, std::span<const int32_t>(ids).subspan(keep_at), params, sink, stats);
  } catch (...) {
    count_head();
    throw;
  }
  count_head();
}

}  // namespace ep::engine
