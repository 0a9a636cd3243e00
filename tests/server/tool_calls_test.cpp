// The tool-call parser (examples/server/tool_calls.cpp) on hand-written model outputs in the
// DeepSeek-V4 and Kimi-K3 formats: content, calls and their arguments; every output also fed
// one byte at a time, and in two pieces cut at every byte, where the concatenated deltas must
// equal the whole parse (the streamed answer equals the whole answer).
#include "support/catch.hpp"
#include "tool_calls.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

using ep_server::ToolCallParser;
using ep_server::ToolDelta;
using ep_server::ToolFormat;

namespace {

struct Call {
  std::string name, arguments;
  bool operator==(const Call &) const = default;
};

struct Parsed {
  std::string content;
  std::vector<Call> calls;
  bool operator==(const Parsed &) const = default;
};

/// Folds deltas into a message, checking their shape: a call's first delta names it, the
/// indices count up from 0 and never go back.
void fold(const ToolDelta &d, Parsed &p) {
  p.content += d.content;
  for (const auto &c : d.calls) {
    if (c.index == p.calls.size()) {
      REQUIRE_FALSE(c.name.empty());
      p.calls.push_back({c.name, c.arguments});
    } else {
      REQUIRE(c.index + 1 == p.calls.size());
      REQUIRE(c.name.empty());
      p.calls.back().arguments += c.arguments;
    }
  }
}

Parsed parse_pieces(ToolFormat f, const std::vector<std::string> &pieces, bool parallel = true, const std::string &prime = {}) {
  ToolCallParser parser(f, parallel);
  if (!prime.empty()) parser.prime(prime);
  Parsed p;
  for (const std::string &piece : pieces) {
    ToolDelta d;
    parser.push(piece, d);
    fold(d, p);
  }
  ToolDelta d;
  parser.finish(d);
  fold(d, p);
  CHECK(parser.calls() == p.calls.size());
  return p;
}

/// The whole parse, checked against every cut into pieces of one byte and every split in two.
Parsed parse(ToolFormat f, const std::string &text, bool parallel = true, const std::string &prime = {}) {
  const Parsed whole = parse_pieces(f, {text}, parallel, prime);
  std::vector<std::string> bytes;
  for (const char c : text) bytes.emplace_back(1, c);
  INFO("output: " << text);
  CHECK(parse_pieces(f, bytes, parallel, prime) == whole);
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    INFO("cut at " << cut);
    REQUIRE(parse_pieces(f, {text.substr(0, cut), text.substr(cut)}, parallel, prime) == whole);
  }
  for (const Call &c : whole.calls) CHECK(nlohmann::json::accept(c.arguments));
  return whole;
}

const std::string D = "｜DSML｜";

std::string ds_call(const std::string &name, const std::string &params) {
  return "<" + D + "invoke name=\"" + name + "\">\n" + params + "</" + D + "invoke>\n";
}
std::string ds_param(const std::string &key, const std::string &value, bool is_string) {
  return "<" + D + "parameter name=\"" + key + "\" string=\"" + (is_string ? "true" : "false") + "\">" + value + "</" + D + "parameter>\n";
}
std::string ds_section(const std::string &calls) { return "\n\n<" + D + "tool_calls>\n" + calls + "</" + D + "tool_calls>"; }

std::string k_call(const std::string &name, int index, const std::string &args) {
  return "<|open|>call tool=\"" + name + "\" index=\"" + std::to_string(index) + "\"<|sep|>" + args + "<|close|>call<|sep|>";
}
std::string k_arg(const std::string &key, const std::string &type, const std::string &value) {
  return "<|open|>argument key=\"" + key + "\" type=\"" + type + "\"<|sep|>" + value + "<|close|>argument<|sep|>";
}
std::string k_section(const std::string &calls) { return "<|open|>tools<|sep|>" + calls + "<|close|>tools<|sep|><|close|>message<|sep|>"; }

}  // namespace

TEST_CASE("tool calls, DeepSeek-V4: content, one call, parallel calls, typed values", "[tools]") {
  const Parsed plain = parse(ToolFormat::deepseek_v4, "Just text, with <b>markup</b> and a < sign.\n\n");
  CHECK(plain.content == "Just text, with <b>markup</b> and a < sign.\n\n");
  CHECK(plain.calls.empty());

  const Parsed one = parse(ToolFormat::deepseek_v4, "Let me check." + ds_section(ds_call("get_weather", ds_param("location", "Paris", true) +
                                                                                                      ds_param("unit", "celsius", true))));
  CHECK(one.content == "Let me check.");
  REQUIRE(one.calls.size() == 1);
  CHECK(one.calls[0] == Call{"get_weather", R"({"location": "Paris", "unit": "celsius"})"});

  const std::string tricky = "a \"quoted\" & <tag>\nline \\ é";
  const Parsed two = parse(ToolFormat::deepseek_v4,
                           ds_section(ds_call("search", ds_param("query", tricky, true) + ds_param("limit", "3", false) +
                                                            ds_param("filters", " {\"lang\": [\"en\", \"fr\"]} ", false) +
                                                            ds_param("exact", "true", false) + ds_param("none", "null", false)) +
                                      ds_call("now", "")));
  CHECK(two.content.empty());
  REQUIRE(two.calls.size() == 2);
  CHECK(two.calls[0].name == "search");
  const auto args = nlohmann::json::parse(two.calls[0].arguments);
  CHECK(args["query"] == tricky);
  CHECK(args["limit"] == 3);
  CHECK(args["filters"]["lang"][1] == "fr");
  CHECK(args["exact"] == true);
  CHECK(args["none"].is_null());
  CHECK(two.calls[1] == Call{"now", "{}"});

  // parallel_tool_calls false: the first call only.
  const Parsed first = parse(ToolFormat::deepseek_v4, ds_section(ds_call("a", "") + ds_call("b", "")), false);
  REQUIRE(first.calls.size() == 1);
  CHECK(first.calls[0].name == "a");
}

TEST_CASE("tool calls, DeepSeek-V4: malformed and unterminated calls", "[tools]") {
  // A value that is not JSON ends the parsing: the call so far stands, the rest is content.
  const Parsed bad_json = parse(ToolFormat::deepseek_v4,
                                ds_section(ds_call("f", ds_param("a", "1", false) + ds_param("b", "{not json", false)) + ds_call("g", "")));
  REQUIRE(bad_json.calls.size() == 1);
  CHECK(bad_json.calls[0] == Call{"f", R"({"a": 1})"});
  CHECK(bad_json.content.rfind("{not json</" + D + "parameter>", 0) == 0);
  CHECK(bad_json.content.find("invoke name=\"g\"") != std::string::npos);

  // Cut off in a value (max_tokens): the call is closed with what it completed.
  const Parsed cut = parse(ToolFormat::deepseek_v4, "\n\n<" + D + "tool_calls>\n<" + D +
                                                        "invoke name=\"f\">\n" + ds_param("a", "x", true) + "<" + D +
                                                        "parameter name=\"b\" string=\"true\">unfinish");
  REQUIRE(cut.calls.size() == 1);
  CHECK(cut.calls[0] == Call{"f", R"({"a": "x"})"});
  CHECK(cut.content == "unfinish");

  // A section with no call in it before the text goes wrong: all of it is content.
  const std::string junk = "Hello\n\n<" + D + "tool_calls>\nthis is not a call";
  const Parsed no_call = parse(ToolFormat::deepseek_v4, junk);
  CHECK(no_call.calls.empty());
  CHECK(no_call.content == "Hello<" + D + "tool_calls>\nthis is not a call");

  // An unterminated opener at the end is content.
  const Parsed partial = parse(ToolFormat::deepseek_v4, "Hi <" + D + "tool_ca");
  CHECK(partial.calls.empty());
  CHECK(partial.content == "Hi <" + D + "tool_ca");

  // A call without a name is not a call.
  const Parsed nameless = parse(ToolFormat::deepseek_v4, ds_section("<" + D + "invoke name=\"\">\n</" + D + "invoke>\n"));
  CHECK(nameless.calls.empty());
}

TEST_CASE("tool calls, DeepSeek-V4: a call forced by the prompt", "[tools]") {
  const std::string named = "<" + D + "tool_calls>\n<" + D + "invoke name=\"get_weather\">\n";
  const Parsed p = parse(ToolFormat::deepseek_v4, ds_param("location", "Oslo", true) + "</" + D + "invoke>\n</" + D + "tool_calls>", true, named);
  REQUIRE(p.calls.size() == 1);
  CHECK(p.calls[0] == Call{"get_weather", R"({"location": "Oslo"})"});
  CHECK(p.content.empty());
  // The model writes nonsense after the forced opening: the call stands, with no arguments.
  const Parsed junk = parse(ToolFormat::deepseek_v4, "In the beginning", true, named);
  REQUIRE(junk.calls.size() == 1);
  CHECK(junk.calls[0] == Call{"get_weather", "{}"});
  CHECK(junk.content == "In the beginning");
  // Required, any function: the model writes the name.
  const std::string any = "<" + D + "tool_calls>\n<" + D + "invoke name=\"";
  const Parsed chosen = parse(ToolFormat::deepseek_v4, "now\">\n</" + D + "invoke>\n</" + D + "tool_calls>", true, any);
  REQUIRE(chosen.calls.size() == 1);
  CHECK(chosen.calls[0] == Call{"now", "{}"});
  // ... and nothing of the forced text becomes content when it goes wrong.
  const Parsed none = parse(ToolFormat::deepseek_v4, "and God said", true, any);
  CHECK(none.calls.empty());
  CHECK(none.content == "and God said");
}

TEST_CASE("tool calls, Kimi-K3: content, calls, typed arguments, the JSON block, malformed", "[tools]") {
  const Parsed plain = parse(ToolFormat::kimi_k3, "The answer.<|close|>message<|sep|>");
  CHECK(plain.content == "The answer.");
  CHECK(plain.calls.empty());

  const Parsed calls = parse(ToolFormat::kimi_k3, "Checking." + k_section(k_call("get_weather", 1, k_arg("location", "string", "Paris") +
                                                                                                    k_arg("days", "number", "3") +
                                                                                                    k_arg("opts", "object", "{\"a\": [1, 2]}")) +
                                                                            k_call("now", 2, "")));
  CHECK(calls.content == "Checking.");
  REQUIRE(calls.calls.size() == 2);
  CHECK(calls.calls[0] == Call{"get_weather", R"({"location": "Paris", "days": 3, "opts": {"a": [1, 2]}})"});
  CHECK(calls.calls[1] == Call{"now", "{}"});

  const Parsed block = parse(ToolFormat::kimi_k3, k_section("<|open|>call tool=\"a&quot;b\" index=\"1\"<|sep|><|open|>json type=\"object\"<|sep|>"
                                                            "{\"x\": 1}<|close|>json<|sep|><|close|>call<|sep|>"));
  REQUIRE(block.calls.size() == 1);
  CHECK(block.calls[0] == Call{"a\"b", R"({"x": 1})"});

  const Parsed bad = parse(ToolFormat::kimi_k3, k_section(k_call("f", 1, k_arg("n", "number", "three"))));
  REQUIRE(bad.calls.size() == 1);
  CHECK(bad.calls[0] == Call{"f", "{}"});
  CHECK(bad.content.rfind("three<|close|>argument<|sep|>", 0) == 0);

  const Parsed one = parse(ToolFormat::kimi_k3, k_section(k_call("a", 1, "") + k_call("b", 2, "")), false);
  REQUIRE(one.calls.size() == 1);
  CHECK(one.calls[0].name == "a");

  const Parsed forced = parse(ToolFormat::kimi_k3, k_arg("q", "string", "x") + "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>", true,
                              "<|open|>tools<|sep|><|open|>call tool=\"search\" index=\"1\"<|sep|>");
  REQUIRE(forced.calls.size() == 1);
  CHECK(forced.calls[0] == Call{"search", R"({"q": "x"})"});
  CHECK(forced.content.empty());
}
