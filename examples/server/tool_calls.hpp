// Tool calls in a model's output, parsed into OpenAI's tool_calls as the text arrives. The
// formats are the vendors' own, as their chat templates render an assistant's calls
// (src/tokenizer/chat_template.cpp writes the same markup back):
//   DeepSeek-V4: <｜DSML｜tool_calls>
//                <｜DSML｜invoke name="NAME">
//                <｜DSML｜parameter name="KEY" string="true|false">VALUE</｜DSML｜parameter>
//                </｜DSML｜invoke> ... </｜DSML｜tool_calls>
//     (string="true": VALUE is the string as it is; "false": VALUE is JSON)
//   Kimi-K3:     <|open|>tools<|sep|><|open|>call tool="NAME" index="1"<|sep|>
//                <|open|>argument key="KEY" type="string|number|boolean|null|object|array"<|sep|>VALUE<|close|>argument<|sep|>
//                (or one <|open|>json type="object"<|sep|>{...}<|close|>json<|sep|>)
//                <|close|>call<|sep|> ... <|close|>tools<|sep|>
//     (after the response: <|close|>response<|sep|> comes first; the message's own
//      <|close|>message<|sep|> after the calls is markup, not text)
// Text before the calls is the message's content. A call is reported as soon as its name is
// known, and its arguments (a JSON object's text, as OpenAI sends them) grow one complete
// parameter at a time. Output that breaks the format (markup where none may be, a value that
// is not JSON, a call not closed by the end) ends the parsing: the call in progress is closed
// with the parameters it completed, and the rest of the text is content. Streamed and whole
// answers are the same deltas, concatenated (docs/server.md, "Tool calls").
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace ep_server {

enum class ToolFormat { deepseek_v4, kimi_k3 };

/// One piece of one call: the first piece of a call has its name.
struct ToolCallDelta {
  size_t index = 0;       ///< the call's position in the message (0, 1, ...)
  std::string name;       ///< set on the call's first piece only
  std::string arguments;  ///< a fragment of the arguments' JSON text
};

/// What some model text turned into.
struct ToolDelta {
  std::string content;
  std::vector<ToolCallDelta> calls;
  bool empty() const { return content.empty() && calls.empty(); }
};

class ToolCallParser {
 public:
  /// @p parallel false: only the first call is reported (the output after it is dropped).
  ToolCallParser(ToolFormat format, bool parallel);

  /// Feeds text the prompt wrote for the model (a forced call's opening, from the call
  /// section's opener on): parsed like model text, but never returned as content.
  void prime(std::string_view text);
  /// Feeds model text; what it completes is appended to @p out.
  void push(std::string_view text, ToolDelta &out);
  /// The end of the model's text: what was held back, and the end of an unfinished call.
  void finish(ToolDelta &out);

  /// Calls reported so far.
  size_t calls() const { return calls_; }

 private:
  enum class State { text, section, call, value, raw, ignore };
  /// One step of parsing at pos_; false when it needs more text.
  bool step(ToolDelta &out);
  void fail(ToolDelta &out);
  void consume(size_t n);
  /// Steps over what is left of the prompt's text (it is never content).
  void skip_primed();
  void emit_content(std::string_view text, ToolDelta &out);
  void add_arguments(std::string fragment, ToolDelta &out);
  /// The attributes of the open tag at pos_ whose prefix is @p prefix; false when the tag is
  /// not complete yet (or, at the end, never will be: then @p bad).
  bool read_tag(std::string_view prefix, std::vector<std::pair<std::string, std::string>> &attrs, bool &bad);

  ToolFormat format_;
  bool parallel_;
  bool ended_ = false;
  size_t primed_left_ = 0;    // bytes at pos_ the prompt wrote (prime()), not the model
  State state_ = State::text;
  std::string buf_;
  size_t pos_ = 0;
  size_t calls_ = 0;          // calls reported
  bool call_open_ = false;    // a reported call not closed yet
  bool args_started_ = false, args_whole_ = false;
  std::string value_key_, value_type_;  // the parameter being read
  std::string section_raw_;   // the model's text of the section so far, while it has reported no call
  ToolDelta pending_;         // what prime() opened, handed out with the first model text
};

}  // namespace ep_server
