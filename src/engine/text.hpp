// Text on top of the generation loop: a model's tokenizer with its chat template and special
// ids, chat rendering, streamed text generation (complete UTF-8 only, special tokens skipped,
// stop strings held back until they are known not to match) and chat turns that reuse the
// session's tokens when the new rendering extends them.
#pragma once

#include "engine/generate.hpp"
#include "grammar/token_mask.hpp"
#include "tokenizer/chat_template.hpp"
#include "tokenizer/tokenizer.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace ep::engine {

class Engine;
class Session;

/// A tokenizer, the chat template it goes with, and the ids generation stops at.
struct ChatTokenizer {
  explicit ChatTokenizer(tokenizer::Tokenizer t) : tok(std::move(t)) {}
  tokenizer::Tokenizer tok;
  std::optional<tokenizer::ChatTemplate> chat;  ///< from the template text, the tokens, or the model
  std::string bos_text;                         ///< BOS as text ("" without one)
  int32_t bos = -1, eos = -1, end_of_turn = -1;
  bool adds_bos = false;                        ///< encode(add_special) starts with BOS

  /// The vocabulary's trie for constrained sampling, built on first use (thread-safe) and shared
  /// by every grammar made for this tokenizer.
  std::shared_ptr<const grammar::Vocabulary> vocabulary() const;

 private:
  mutable std::mutex vocabulary_mu_;
  mutable std::shared_ptr<const grammar::Vocabulary> vocabulary_;
};

/// A JSON grammar over @p t's vocabulary whose end tokens are its EOS and end-of-turn tokens: any
/// JSON object when @p schema is null, else the values of that JSON Schema (Status::invalid_argument
/// naming the keyword and its JSON pointer for one outside the supported subset; docs/grammar.md).
std::shared_ptr<const grammar::TokenGrammar> json_grammar(const ChatTokenizer &t, const std::string *schema);

/// Opens the tokenizer at @p path: a tokenizer.json, tiktoken file or GGUF, or a checkpoint
/// directory holding one (Status::not_found naming what is missing).
std::unique_ptr<ChatTokenizer> open_tokenizer(const std::string &path);
/// The tokenizer of @p engine's model: its GGUF's tokenizer.ggml.* metadata, else the
/// tokenizer files beside its source; the architecture supplies the chat template when the
/// tokenizer names none.
std::unique_ptr<ChatTokenizer> open_model_tokenizer(const Engine &engine);

/// One chat message (roles as the templates know them: system, user, assistant, tool), its tool
/// calls and tool-result fields included.
using ChatMessage = tokenizer::ChatMessage;
struct ChatOptions {
  std::optional<tokenizer::ChatTemplate> chat_template;  ///< none: the tokenizer's (Status::unsupported without one)
  std::optional<bool> thinking;                          ///< none: the template's default
  bool add_generation_prompt = true;
  std::string tools_json;   ///< tokenizer::ChatRenderOptions::tools_json
  std::string tool_choice;  ///< tokenizer::ChatRenderOptions::tool_choice
};
/// The conversation as the template renders it.
std::string render_chat(const ChatTokenizer &t, std::span<const ChatMessage> messages, const ChatOptions &options);
/// tokenizer::tool_call_prefix of the template @p options (or the tokenizer) names.
std::string tool_call_prefix(const ChatTokenizer &t, const ChatOptions &options, std::string_view name);

/// Receives generated text in pieces; return nonzero to cancel.
using TextSink = std::function<int(std::string_view text)>;

/// Generated tokens as text: complete UTF-8 only (the tokenizer's StreamDecoder), special tokens
/// skipped, and text that may begin a stop string held back until it is known not to.
class TextStream {
 public:
  TextStream(const ChatTokenizer &t, std::vector<std::string> stop_strings);
  /// 0 continue, 1 a stop string ended the text (what came before it was delivered), -1 the
  /// sink cancelled. After a stop, further tokens deliver nothing.
  int push(int32_t token, const TextSink &sink);
  /// Delivers what was held back; the same results.
  int finish(const TextSink &sink);
  bool stopped() const { return stopped_; }

 private:
  int drain(bool final, const TextSink &sink);
  tokenizer::StreamDecoder dec_;
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
};

/// Generates text after @p prompt (token ids; may be empty on a session with logits): stop
/// tokens plus EOS / end of turn (unless params.ignore_eos), stop strings; fills @p stats also
/// when it throws (Status::cancelled when the sink cancelled).
void generate_text(Session &session, const ChatTokenizer &t, std::span<const int32_t> prompt, const GenerateParams &params,
                   const TextSink &sink, GenerateStats &stats);
/// Encodes @p text (with BOS when the session is empty and the tokenizer adds one) and
/// generate_text().
void generate_text(Session &session, const ChatTokenizer &t, const std::string &text, const GenerateParams &params,
                   const TextSink &sink, GenerateStats &stats);
/// Renders @p messages with the generation prompt and generates the answer. When the session's
/// tokens are a prefix of the rendering, only the rest is run (stats.reused_tokens); otherwise
/// the session is reset first.
void generate_chat(Session &session, const ChatTokenizer &t, std::span<const ChatMessage> messages, const ChatOptions &options,
                   const GenerateParams &params, const TextSink &sink, GenerateStats &stats);

}  // namespace ep::engine
