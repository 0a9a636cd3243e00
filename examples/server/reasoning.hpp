// Splits an assistant turn's generated tokens into reasoning and answer by the chat template's
// thinking markers. The markers are special tokens, which a text stream leaves out, so the
// split is decided per token id:
//   DeepSeek-V4: reasoning runs until `</think>` (the generation prompt opens `<think>` when
//   thinking is on, and closes it at once when off).
//   Kimi-K3: `<|open|>think<|sep|> ... <|close|>think<|sep|>` then
//   `<|open|>response<|sep|> ... <|close|>response<|sep|>`: the tag names between the
//   open/close and sep tokens are markup, not text. With tools, what follows the response
//   (`<|open|>tools<|sep|>...`) is content, tags and all, for the tool-call parser.
#pragma once

#include <expertpack/expertpack.h>

#include "job.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace ep_server {

/// The marker token ids of a tokenizer (-1 where it has none).
struct ThinkingMarkers {
  int32_t think_open = -1, think_close = -1;        // DeepSeek-V4
  int32_t tag_open = -1, tag_close = -1, tag_sep = -1;  // Kimi-K3
  /// The special tokens of the tool-call markup (Kimi-K3's tag tokens, DeepSeek-V4's ｜DSML｜
  /// where it is special): a request with tools keeps them in its content as text.
  std::vector<int32_t> tool_markup;
  static ThinkingMarkers of(const ep_tokenizer *tokenizer, ep_chat_template chat_template);
  bool is_tool_markup(int32_t token) const;
};

class ReasoningSplitter {
 public:
  /// @p tokenizer names the tags (Kimi-K3) and must outlive the splitter.
  /// @p tool_calls: what follows the response (Kimi-K3's tool calls) is content, its tags
  /// included; @p start_in_tool_calls: the prompt closed the response and began a call.
  ReasoningSplitter(const ThinkingMarkers &markers, const ep_tokenizer *tokenizer, bool start_in_reasoning, bool tool_calls = false,
                    bool start_in_tool_calls = false);
  /// The channel of one generated token.
  Channel route(int32_t token);

 private:
  void end_tag();
  ThinkingMarkers m_;
  const ep_tokenizer *tokenizer_;
  Channel channel_;
  bool in_tag_ = false, closing_ = false, answer_over_ = false;
  bool tool_calls_ = false;
  std::vector<int32_t> tag_;
};

}  // namespace ep_server
