#include "reasoning.hpp"

#include <algorithm>

namespace ep_server {

namespace {

int32_t token_id(const ep_tokenizer *t, const char *text) {
  int32_t id = -1;
  return ep_tokenizer_token_id(&id, t, text) == EP_OK ? id : -1;
}

/// A tag's name: the text before its first space (`message role="assistant"` → `message`).
std::string tag_name(const ep_tokenizer *t, const std::vector<int32_t> &ids) {
  size_t n = 0;
  if (ep_detokenize(nullptr, 0, &n, t, ids.data(), ids.size(), 0) != EP_OK) return {};
  std::string s(n + 1, '\0');
  if (ep_detokenize(s.data(), s.size(), &n, t, ids.data(), ids.size(), 0) != EP_OK) return {};
  s.resize(n);
  const size_t start = s.find_first_not_of(' ');
  if (start == std::string::npos) return {};
  return s.substr(start, s.find(' ', start) - start);
}

}  // namespace

ThinkingMarkers ThinkingMarkers::of(const ep_tokenizer *tokenizer, ep_chat_template chat_template) {
  ThinkingMarkers m;
  if (chat_template == EP_CHAT_TEMPLATE_DEEPSEEK_V4) {
    m.think_open = token_id(tokenizer, "<think>");
    m.think_close = token_id(tokenizer, "</think>");
  } else if (chat_template == EP_CHAT_TEMPLATE_KIMI_K3) {
    m.tag_open = token_id(tokenizer, "<|open|>");
    m.tag_close = token_id(tokenizer, "<|close|>");
    m.tag_sep = token_id(tokenizer, "<|sep|>");
  }
  const std::vector<int32_t> candidates = chat_template == EP_CHAT_TEMPLATE_KIMI_K3 ? std::vector<int32_t>{m.tag_open, m.tag_close, m.tag_sep}
                                                                                     : std::vector<int32_t>{token_id(tokenizer, "｜DSML｜")};
  for (const int32_t id : candidates) {
    if (id < 0) continue;
    // Special: a text stream leaves it out (its text with special tokens skipped is empty).
    size_t n = 0;
    if (ep_detokenize(nullptr, 0, &n, tokenizer, &id, 1, EP_DETOKENIZE_SKIP_SPECIAL) == EP_OK && n == 0) m.tool_markup.push_back(id);
  }
  return m;
}

bool ThinkingMarkers::is_tool_markup(int32_t token) const {
  return std::find(tool_markup.begin(), tool_markup.end(), token) != tool_markup.end();
}

ReasoningSplitter::ReasoningSplitter(const ThinkingMarkers &markers, const ep_tokenizer *tokenizer, bool start_in_reasoning, bool tool_calls,
                                     bool start_in_tool_calls)
    : m_(markers), tokenizer_(tokenizer), channel_(start_in_reasoning ? Channel::reasoning : Channel::content) {
  tool_calls_ = tool_calls;
  if (start_in_tool_calls && m_.tag_sep >= 0) answer_over_ = true;  // Kimi-K3: the prompt closed the response
}

Channel ReasoningSplitter::route(int32_t token) {
  constexpr size_t kLongestTag = 32;  // tokens; a longer "tag" is not one: give up on it
  if (answer_over_ && tool_calls_) return Channel::content;  // the tool calls, markup and all
  if (in_tag_) {
    if (token == m_.tag_sep) {
      end_tag();
    } else {
      tag_.push_back(token);
      if (tag_.size() > kLongestTag) {
        in_tag_ = false;
        tag_.clear();
      }
    }
    return Channel::markup;
  }
  if (token >= 0 && (token == m_.tag_open || token == m_.tag_close)) {
    in_tag_ = true;
    closing_ = token == m_.tag_close;
    tag_.clear();
    return Channel::markup;
  }
  if (token >= 0 && token == m_.think_open) {
    channel_ = Channel::reasoning;
    return Channel::markup;
  }
  if (token >= 0 && token == m_.think_close) {
    channel_ = Channel::content;
    return Channel::markup;
  }
  return answer_over_ ? Channel::markup : channel_;
}

void ReasoningSplitter::end_tag() {
  in_tag_ = false;
  const std::string name = tag_name(tokenizer_, tag_);
  tag_.clear();
  if (name == "think") {
    channel_ = closing_ ? Channel::content : Channel::reasoning;
  } else if (name == "response") {
    channel_ = Channel::content;
    if (closing_) answer_over_ = true;  // what follows the response (closing the message) is not text
  }
}

}  // namespace ep_server
