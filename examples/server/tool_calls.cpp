#include "tool_calls.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>

namespace ep_server {

namespace {

/// The markup of one format.
struct Markup {
  std::string section_open, section_close;
  std::string call_open, call_close;      // call_open: the tag's start, attributes follow
  std::string param_open, param_close;    // the same for a parameter
  std::string json_open, json_close;      // Kimi-K3's whole-arguments block (empty: none)
  std::string tag_end;                    // what ends an open tag
  std::string name_attr, key_attr, type_attr;
  std::string text_drop;                  // markup in the text that is not content (empty: none)
};

const Markup &markup(ToolFormat f) {
  static const Markup ds = {"<｜DSML｜tool_calls>",
                            "</｜DSML｜tool_calls>",
                            "<｜DSML｜invoke",
                            "</｜DSML｜invoke>",
                            "<｜DSML｜parameter",
                            "</｜DSML｜parameter>",
                            "",
                            "",
                            ">",
                            "name",
                            "name",
                            "string",
                            ""};
  static const Markup kimi = {"<|open|>tools<|sep|>",
                              "<|close|>tools<|sep|>",
                              "<|open|>call",
                              "<|close|>call<|sep|>",
                              "<|open|>argument",
                              "<|close|>argument<|sep|>",
                              "<|open|>json",
                              "<|close|>json<|sep|>",
                              "<|sep|>",
                              "tool",
                              "key",
                              "type",
                              "<|close|>message<|sep|>"};
  return f == ToolFormat::deepseek_v4 ? ds : kimi;
}

constexpr size_t kLongestTag = 4096;  // bytes of an open tag's attributes; longer is not the format

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

/// Whether @p s (shorter than @p p) could still become @p p.
bool could_become(std::string_view s, std::string_view p) { return s.size() < p.size() && p.substr(0, s.size()) == s; }

/// The longest suffix of @p s that is a proper prefix of @p p.
size_t partial_suffix(std::string_view s, std::string_view p) {
  if (p.empty()) return 0;
  for (size_t n = std::min(s.size(), p.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == p.substr(0, n)) return n;
  return 0;
}

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string unescape_attr(std::string_view v) {
  std::string r;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v.substr(i, 6) == "&quot;") {
      r += '"';
      i += 5;
    } else if (v.substr(i, 5) == "&amp;") {
      r += '&';
      i += 4;
    } else {
      r += v[i];
    }
  }
  return r;
}

/// @p text as a JSON string (nlohmann escapes; the text is valid UTF-8 from the text stream).
std::string json_string(const std::string &text) { return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

/// @p text when it is one JSON value (surrounding whitespace dropped), else empty.
std::string json_value(std::string_view text) {
  size_t b = 0, e = text.size();
  while (b < e && is_space(text[b])) ++b;
  while (e > b && is_space(text[e - 1])) --e;
  const std::string_view v = text.substr(b, e - b);
  if (v.empty() || !nlohmann::json::accept(v)) return {};
  return std::string(v);
}

const std::string *attr(const std::vector<std::pair<std::string, std::string>> &attrs, const std::string &key) {
  for (const auto &[k, v] : attrs)
    if (k == key) return &v;
  return nullptr;
}

}  // namespace

ToolCallParser::ToolCallParser(ToolFormat format, bool parallel) : format_(format), parallel_(parallel) {}

void ToolCallParser::prime(std::string_view text) {
  ToolDelta out;
  buf_.append(text);
  primed_left_ += text.size();
  while (step(out)) {
  }
  // Whatever the prompt's text opened (a call with its name) is reported with the model's first text.
  pending_ = std::move(out);
}

void ToolCallParser::push(std::string_view text, ToolDelta &out) {
  if (!pending_.empty()) {
    out.content += pending_.content;
    out.calls.insert(out.calls.end(), pending_.calls.begin(), pending_.calls.end());
    pending_ = {};
  }
  buf_.append(text);
  while (step(out)) {
  }
  if (pos_ > 0) {
    buf_.erase(0, pos_);
    pos_ = 0;
  }
}

void ToolCallParser::finish(ToolDelta &out) {
  push({}, out);
  ended_ = true;
  while (step(out)) {
  }
  if (state_ == State::section || state_ == State::call || state_ == State::value) fail(out);  // not closed by the end
  if (state_ == State::raw) skip_primed();
  if (state_ == State::raw || state_ == State::text) emit_content(std::string_view(buf_).substr(pos_), out);
  buf_.clear();
  pos_ = 0;
}

void ToolCallParser::consume(size_t n) {
  const size_t primed = std::min(n, primed_left_);
  primed_left_ -= primed;
  if (calls_ == 0 && state_ != State::text) section_raw_.append(buf_, pos_ + primed, n - primed);
  pos_ += n;
}

void ToolCallParser::skip_primed() {
  pos_ += primed_left_;
  primed_left_ = 0;
}

void ToolCallParser::emit_content(std::string_view text, ToolDelta &out) {
  const std::string &drop = markup(format_).text_drop;
  if (drop.empty()) {
    out.content += text;
    return;
  }
  for (size_t at; (at = text.find(drop)) != std::string_view::npos; text.remove_prefix(at + drop.size())) out.content += text.substr(0, at);
  out.content += text;
}

void ToolCallParser::add_arguments(std::string fragment, ToolDelta &out) {
  if (!out.calls.empty() && out.calls.back().index == calls_) {
    out.calls.back().arguments += fragment;  // the same call's piece before, in this delta
  } else {
    out.calls.push_back({calls_, "", std::move(fragment)});
  }
}

void ToolCallParser::fail(ToolDelta &out) {
  if (call_open_) {
    add_arguments(args_whole_ ? std::string() : args_started_ ? std::string("}") : std::string("{}"), out);
    call_open_ = false;
    ++calls_;
  }
  // No call came of the section: its text is the content it was.
  if (calls_ == 0) emit_content(section_raw_, out);
  section_raw_.clear();
  state_ = State::raw;
}

bool ToolCallParser::read_tag(std::string_view prefix, std::vector<std::pair<std::string, std::string>> &attrs, bool &bad) {
  const std::string &end = markup(format_).tag_end;
  const std::string_view rest = std::string_view(buf_).substr(pos_ + prefix.size());
  const size_t close = rest.find(end);
  if (close == std::string_view::npos) {
    bad = ended_ || rest.size() > kLongestTag;
    return false;
  }
  std::string_view body = rest.substr(0, close);
  attrs.clear();
  bad = false;
  if (!body.empty() && body[0] != ' ') {  // another tag that starts alike (<｜DSML｜invokes ...)
    bad = true;
    return false;
  }
  while (!body.empty()) {
    while (!body.empty() && body[0] == ' ') body.remove_prefix(1);
    if (body.empty()) break;
    const size_t eq = body.find("=\"");
    if (eq == std::string_view::npos) {
      bad = true;
      return false;
    }
    const size_t q = body.find('"', eq + 2);
    if (q == std::string_view::npos) {
      bad = true;
      return false;
    }
    attrs.emplace_back(std::string(body.substr(0, eq)), unescape_attr(body.substr(eq + 2, q - eq - 2)));
    body.remove_prefix(q + 1);
  }
  consume(prefix.size() + close + end.size());
  return true;
}

bool ToolCallParser::step(ToolDelta &out) {
  const Markup &m = markup(format_);
  const std::string_view rest = std::string_view(buf_).substr(pos_);
  switch (state_) {
    case State::ignore: pos_ = buf_.size(); return false;
    case State::raw: {
      skip_primed();
      const std::string_view r = std::string_view(buf_).substr(pos_);
      const size_t keep = ended_ ? 0 : partial_suffix(r, markup(format_).text_drop);  // the dropped markup, whole
      emit_content(r.substr(0, r.size() - keep), out);
      pos_ = buf_.size() - keep;
      return false;
    }
    case State::text: {
      const size_t at = rest.find(m.section_open);
      if (at == std::string_view::npos) {
        // Hold back what may begin the section opener (or the markup dropped from the text),
        // and the whitespace before it (the templates put "\n\n" between the text and the calls).
        size_t keep = ended_ ? 0 : std::max(partial_suffix(rest, m.section_open), partial_suffix(rest, m.text_drop));
        if (!ended_)
          while (keep < rest.size() && is_space(rest[rest.size() - keep - 1])) ++keep;
        // Never split the dropped markup: emit only up to its start when it is whole in the text.
        emit_content(rest.substr(0, rest.size() - keep), out);
        pos_ += rest.size() - keep;
        return false;
      }
      size_t end = at;
      while (end > 0 && is_space(rest[end - 1])) --end;
      emit_content(rest.substr(0, end), out);
      pos_ += at;
      state_ = State::section;
      section_raw_.clear();
      consume(m.section_open.size());
      return true;
    }
    case State::section: {
      size_t ws = 0;
      while (ws < rest.size() && is_space(rest[ws])) ++ws;
      consume(ws);
      const std::string_view r = rest.substr(ws);
      if (r.empty()) return false;
      if (starts_with(r, m.section_close)) {
        consume(m.section_close.size());
        state_ = State::text;
        section_raw_.clear();
        return true;
      }
      if (starts_with(r, m.call_open)) {
        std::vector<std::pair<std::string, std::string>> attrs;
        bool bad = false;
        if (!read_tag(m.call_open, attrs, bad)) {
          if (bad) fail(out);
          return bad;
        }
        const std::string *name = attr(attrs, m.name_attr);
        if (!name || name->empty()) {
          fail(out);
          return true;
        }
        if (!parallel_ && calls_ >= 1) {  // one call was asked for: the rest is dropped
          state_ = State::ignore;
          return true;
        }
        out.calls.push_back({calls_, *name, ""});
        call_open_ = true;
        args_started_ = args_whole_ = false;
        state_ = State::call;
        return true;
      }
      if (!ended_ && (could_become(r, m.section_close) || could_become(r, m.call_open))) return false;
      fail(out);
      return true;
    }
    case State::call: {
      size_t ws = 0;
      while (ws < rest.size() && is_space(rest[ws])) ++ws;
      consume(ws);
      const std::string_view r = rest.substr(ws);
      if (r.empty()) return false;
      if (starts_with(r, m.call_close)) {
        consume(m.call_close.size());
        add_arguments(args_whole_ ? std::string() : args_started_ ? std::string("}") : std::string("{}"), out);
        call_open_ = false;
        ++calls_;
        state_ = State::section;
        return true;
      }
      const bool json_block = !m.json_open.empty() && starts_with(r, m.json_open);
      if (json_block || starts_with(r, m.param_open)) {
        std::vector<std::pair<std::string, std::string>> attrs;
        bool bad = false;
        if (!read_tag(json_block ? m.json_open : m.param_open, attrs, bad)) {
          if (bad) fail(out);
          return bad;
        }
        const std::string *key = attr(attrs, m.key_attr);
        const std::string *type = attr(attrs, m.type_attr);
        if (json_block ? args_started_ || args_whole_ : !key || !type || args_whole_) {
          fail(out);
          return true;
        }
        value_key_ = json_block ? std::string() : *key;
        value_type_ = json_block ? std::string("json") : *type;
        state_ = State::value;
        return true;
      }
      if (!ended_ && (could_become(r, m.call_close) || could_become(r, m.param_open) || (!m.json_open.empty() && could_become(r, m.json_open))))
        return false;
      fail(out);
      return true;
    }
    case State::value: {
      const std::string &close = value_type_ == "json" ? m.json_close : m.param_close;
      const size_t at = rest.find(close);
      if (at == std::string_view::npos) {
        if (ended_) fail(out);
        return ended_;
      }
      const std::string raw(rest.substr(0, at));
      const bool is_string = format_ == ToolFormat::deepseek_v4 ? value_type_ == "true" : value_type_ == "string";
      std::string value = is_string ? json_string(raw) : json_value(raw);
      if (value.empty() || (value_type_ == "json" && value.front() != '{')) {
        fail(out);
        return true;
      }
      consume(at + close.size());
      if (value_type_ == "json") {
        add_arguments(std::move(value), out);
        args_whole_ = true;
      } else {
        add_arguments(std::string(args_started_ ? ", " : "{") + json_string(value_key_) + ": " + value, out);
        args_started_ = true;
      }
      state_ = State::call;
      return true;
    }
  }
  return false;
}

}  // namespace ep_server
