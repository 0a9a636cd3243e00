// Chat templates rendered in C++ against transformers' rendering of llama.cpp's template texts
// (tests/data/tokenizer/chat_goldens.jsonl from tests/oracle/chat_template_goldens.py): every
// case must be byte-identical. Fails when the goldens are missing. Also: template detection,
// role errors, and tokenizing a rendered DeepSeek-V4 conversation with the real tokenizer.
#include "core/error.hpp"
#include "corpus_util.hpp"
#include "support/catch.hpp"
#include "tokenizer/chat_template.hpp"
#include "tokenizer/tokenizer.hpp"

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

using ep::tokenizer::ChatMessage;
using ep::tokenizer::ChatRenderOptions;
using ep::tokenizer::ChatTemplate;
using json = nlohmann::json;

namespace {

std::vector<ChatMessage> messages_of(const json &arr) {
  std::vector<ChatMessage> out;
  for (const json &m : arr) {
    ChatMessage c;
    c.role = m.at("role").get<std::string>();
    if (!m.at("content").is_null()) c.content = m.at("content").get<std::string>();
    if (m.contains("reasoning_content") && !m["reasoning_content"].is_null())
      c.reasoning = m["reasoning_content"].get<std::string>();
    out.push_back(std::move(c));
  }
  return out;
}

std::string read_text(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("chat templates: byte-identical to transformers on every golden case", "[tokenizer][chat]") {
  const auto records = ep_test::read_jsonl(std::string(EP_TEST_DATA_DIR) + "/tokenizer/chat_goldens.jsonl");
  REQUIRE(records.size() > 200);
  REQUIRE(records[0].value("header", false));
  CHECK(records[0]["renderer"].get<std::string>().rfind("transformers", 0) == 0);
  size_t n = 0, ok = 0, ds = 0, kimi = 0;
  for (size_t i = 1; i < records.size(); ++i) {
    const json &r = records[i];
    const auto t = ep::tokenizer::chat_template_by_name(r.at("template").get<std::string>());
    REQUIRE(t.has_value());
    ChatRenderOptions o;
    o.add_generation_prompt = r.at("add_generation_prompt").get<bool>();
    if (!r.at("thinking").is_null()) o.thinking = r["thinking"].get<bool>();
    if (!r.at("thinking_effort").is_null()) o.thinking_effort = r["thinking_effort"].get<std::string>();
    const auto msgs = messages_of(r.at("messages"));
    const std::string want = r.at("text").get<std::string>();
    const std::string got = ep::tokenizer::render_chat(*t, msgs, o);
    ++n;
    if (got == want) {
      ++ok;
      (*t == ChatTemplate::deepseek_v4 ? ds : kimi)++;
    } else {
      INFO("case " << r["case"] << " template " << r["template"] << " thinking " << r["thinking"] << " gen "
                   << o.add_generation_prompt << "\nwant: " << want << "\ngot:  " << got);
      CHECK(got == want);
    }
  }
  CHECK(ok == n);
  CHECK(ds > 50);
  CHECK(kimi > 50);
}

namespace {

/// A golden's messages with their tool fields (keys in their order: the arguments' text is
/// rendered in it).
std::vector<ChatMessage> tool_messages_of(const nlohmann::ordered_json &arr) {
  std::vector<ChatMessage> out;
  for (const auto &m : arr) {
    ChatMessage c;
    c.role = m.at("role").get<std::string>();
    if (m.contains("content") && !m["content"].is_null()) c.content = m["content"].get<std::string>();
    if (m.contains("reasoning_content") && !m["reasoning_content"].is_null()) c.reasoning = m["reasoning_content"].get<std::string>();
    if (m.contains("tool_call_id")) c.tool_call_id = m["tool_call_id"].get<std::string>();
    if (m.contains("name")) c.name = m["name"].get<std::string>();
    if (m.contains("tool_calls"))
      for (const auto &tc : m["tool_calls"])
        c.tool_calls.push_back({tc.at("id").get<std::string>(), tc.at("function").at("name").get<std::string>(),
                                tc.at("function").at("arguments").dump()});
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace

TEST_CASE("chat templates: tool declarations, calls and results byte-identical to the vendors' templates", "[tokenizer][chat]") {
  const std::string path = std::string(EP_TEST_DATA_DIR) + "/tokenizer/chat_tool_goldens.jsonl";
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  std::string line;
  std::vector<nlohmann::ordered_json> records;
  while (std::getline(in, line))
    if (!line.empty()) records.push_back(nlohmann::ordered_json::parse(line));
  REQUIRE(records.size() > 100);
  REQUIRE(records[0].value("header", false));
  CHECK(records[0]["renderer"].get<std::string>().rfind("transformers", 0) == 0);  // made by the oracle, not a stand-in
  size_t n = 0, ok = 0, ds = 0, kimi = 0, with_calls = 0;
  for (size_t i = 1; i < records.size(); ++i) {
    const auto &r = records[i];
    const auto t = ep::tokenizer::chat_template_by_name(r.at("template").get<std::string>());
    REQUIRE(t.has_value());
    ChatRenderOptions o;
    o.add_generation_prompt = r.at("add_generation_prompt").get<bool>();
    if (!r.at("thinking").is_null()) o.thinking = r["thinking"].get<bool>();
    if (!r.at("tools").is_null()) o.tools_json = r["tools"].dump();
    if (!r.at("tool_choice").is_null()) o.tool_choice = r["tool_choice"].get<std::string>();
    const auto msgs = tool_messages_of(r.at("messages"));
    for (const ChatMessage &m : msgs) with_calls += m.tool_calls.size();
    const std::string want = r.at("text").get<std::string>();
    const std::string got = ep::tokenizer::render_chat(*t, msgs, o);
    ++n;
    if (got == want) {
      ++ok;
      (*t == ChatTemplate::deepseek_v4 ? ds : kimi)++;
    } else {
      INFO("case " << r["case"] << " template " << r["template"] << " thinking " << r["thinking"] << " gen " << o.add_generation_prompt
                   << "\nwant: " << want << "\ngot:  " << got);
      CHECK(got == want);
    }
  }
  CHECK(ok == n);
  CHECK(ds >= 60);
  CHECK(kimi >= 60);
  CHECK(with_calls > 50);
}

TEST_CASE("chat templates: tool-call arguments and tools are checked; the forced call prefixes", "[tokenizer][chat]") {
  ChatMessage a{"assistant", "", ""};
  a.tool_calls.push_back({"c1", "f", "[1, 2]"});
  std::vector<ChatMessage> msgs = {{"user", "hi", ""}, a};
  // DeepSeek-V4 reads the arguments as an object (from_json, then items()).
  CHECK_THROWS_AS(ep::tokenizer::render_chat(ChatTemplate::deepseek_v4, msgs), ep::Error);
  // Kimi-K3 renders arguments that are not an object as the text they are (its JSON-string form).
  CHECK(ep::tokenizer::render_chat(ChatTemplate::kimi_k3, msgs).find("<|open|>json type=\"object\"<|sep|>[1, 2]<|close|>json<|sep|>") !=
        std::string::npos);
  ChatRenderOptions o;
  o.tools_json = "{\"type\": \"function\"}";
  std::vector<ChatMessage> hi = {{"user", "hi", ""}};
  CHECK_THROWS_AS(ep::tokenizer::render_chat(ChatTemplate::deepseek_v4, hi, o), ep::Error);  // not an array
  o.tools_json = "[{\"type\": ";
  CHECK_THROWS_AS(ep::tokenizer::render_chat(ChatTemplate::kimi_k3, hi, o), ep::Error);  // not JSON
  // A tool message Kimi-K3 cannot name (no name, no id, no call at its position) is refused, as the template raises.
  std::vector<ChatMessage> orphan = {{"user", "hi", ""}, {"tool", "x", ""}};
  CHECK_THROWS_AS(ep::tokenizer::render_chat(ChatTemplate::kimi_k3, orphan), ep::Error);
  ChatMessage u{"user", "x", ""};
  u.tool_calls.push_back({"c1", "f", "{}"});
  std::vector<ChatMessage> user_calls = {u};
  CHECK_THROWS_AS(ep::tokenizer::render_chat(ChatTemplate::deepseek_v4, user_calls), ep::Error);

  ChatRenderOptions off;
  off.thinking = false;
  CHECK(ep::tokenizer::tool_call_prefix(ChatTemplate::deepseek_v4, off, "get_weather") ==
        "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n");
  ChatRenderOptions on;
  on.thinking = true;
  CHECK(ep::tokenizer::tool_call_prefix(ChatTemplate::deepseek_v4, on, "") == "</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"");
  CHECK(ep::tokenizer::tool_call_prefix(ChatTemplate::kimi_k3, off, "f") ==
        "<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|>");
  CHECK(ep::tokenizer::tool_call_prefix(ChatTemplate::kimi_k3, ChatRenderOptions{}, "") ==
        "<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"");
  // The forced prefix continues the rendering of an assistant turn with that call.
  ChatMessage call{"assistant", "", ""};
  call.tool_calls.push_back({"c1", "f", "{}"});
  for (const ChatTemplate t : {ChatTemplate::deepseek_v4, ChatTemplate::kimi_k3}) {
    for (const bool thinking : {false, true}) {
      ChatRenderOptions ro;
      ro.thinking = thinking;
      std::vector<ChatMessage> prompt = {{"user", "hi", ""}};
      const std::string forced = ep::tokenizer::render_chat(t, prompt, ro) + ep::tokenizer::tool_call_prefix(t, ro, "f");
      prompt.push_back(call);
      ro.add_generation_prompt = false;
      std::string answered = ep::tokenizer::render_chat(t, prompt, ro);
      INFO(ep::tokenizer::chat_template_name(t) << " thinking " << thinking);
      // DeepSeek-V4 renders an answered turn without thinking as `</think>` alone, where its
      // generation prompt has `<think></think>`.
      if (t == ChatTemplate::deepseek_v4 && !thinking) answered.insert(answered.rfind("<｜Assistant｜>") + std::string("<｜Assistant｜>").size(), "<think>");
      CHECK(answered.rfind(forced, 0) == 0);
    }
  }
}

TEST_CASE("chat templates: python_json writes what transformers' tojson writes", "[tokenizer][chat]") {
  using ep::tokenizer::python_json;
  CHECK(python_json(R"({"b": [1, 2.5, true, null], "a": {"x": "é\n\u0001\"\\"}})") ==
        "{\"b\": [1, 2.5, true, null], \"a\": {\"x\": \"é\\n\\u0001\\\"\\\\\"}}");
  CHECK(python_json("1.0") == "1.0");
  CHECK(python_json("100.0") == "100.0");
  CHECK(python_json("1e16") == "1e+16");
  CHECK(python_json("1.5e-5") == "1.5e-05");
  CHECK(python_json("0.0001") == "0.0001");
  CHECK(python_json("-0.25") == "-0.25");
  CHECK(python_json("123456789012345.0") == "123456789012345.0");
  CHECK(python_json("-12") == "-12");
  CHECK_THROWS_AS(python_json("{"), ep::Error);
}

TEST_CASE("chat templates: the committed template texts are detected", "[tokenizer][chat]") {
  const std::string dir = std::string(EP_TEST_DATA_DIR) + "/tokenizer/chat_templates/";
  CHECK(ep::tokenizer::detect_chat_template_text(read_text(dir + "deepseek-ai-DeepSeek-V4.jinja")) == ChatTemplate::deepseek_v4);
  CHECK(ep::tokenizer::detect_chat_template_text(read_text(dir + "Kimi-K3.jinja")) == ChatTemplate::kimi_k3);
  CHECK_FALSE(ep::tokenizer::detect_chat_template_text("{{ messages }}").has_value());
  CHECK(ep::tokenizer::chat_template_by_name("DeepSeek-V4") == ChatTemplate::deepseek_v4);
  CHECK(ep::tokenizer::chat_template_by_name("kimi-k3") == ChatTemplate::kimi_k3);
  CHECK_FALSE(ep::tokenizer::chat_template_by_name("llama3").has_value());
}

TEST_CASE("chat templates: roles, effort and UTF-8 are checked", "[tokenizer][chat]") {
  std::vector<ChatMessage> bad = {{"narrator", "x", ""}};
  CHECK_THROWS_AS(ep::tokenizer::render_chat(ChatTemplate::deepseek_v4, bad), ep::Error);
  CHECK_THROWS_AS(ep::tokenizer::render_chat(ChatTemplate::kimi_k3, bad), ep::Error);
  std::vector<ChatMessage> tool = {{"tool", "3", ""}};
  CHECK_NOTHROW(ep::tokenizer::render_chat(ChatTemplate::deepseek_v4, tool));
  tool[0].name = "f";  // Kimi-K3 names a tool message (by name, or by the call it answers)
  CHECK_NOTHROW(ep::tokenizer::render_chat(ChatTemplate::kimi_k3, tool));
  std::vector<ChatMessage> invalid = {{"user", std::string("a\xff"), ""}};
  CHECK_THROWS_AS(ep::tokenizer::render_chat(ChatTemplate::deepseek_v4, invalid), ep::Error);
  ChatRenderOptions o;
  o.thinking_effort = "extreme";
  std::vector<ChatMessage> hi = {{"user", "hi", ""}};
  CHECK_THROWS_AS(ep::tokenizer::render_chat(ChatTemplate::kimi_k3, hi, o), ep::Error);
  o.thinking = false;  // the effort only matters when thinking
  CHECK(ep::tokenizer::render_chat(ChatTemplate::kimi_k3, hi, o) ==
        "<|open|>message role=\"user\"<|sep|>hi<|close|>message<|sep|><|end_of_msg|><|open|>message role=\"assistant\"<|sep|>"
        "<|open|>response<|sep|>");
  CHECK(ep::tokenizer::is_python_blank(" \t\n\u3000\u2028"));
  CHECK_FALSE(ep::tokenizer::is_python_blank(" \u200b "));  // ZERO WIDTH SPACE is not whitespace to Python
}

TEST_CASE("chat templates: a DeepSeek-V4 rendering tokenizes its markers as single special tokens", "[tokenizer][chat]") {
  const auto tok = ep::tokenizer::Tokenizer::from_json_file(ep_test::deepseek_tokenizer_path());
  CHECK(ep::tokenizer::detect_chat_template_tokens(tok) == ChatTemplate::deepseek_v4);
  std::vector<ChatMessage> msgs = {{"system", "Be brief.", ""}, {"user", "Hi", ""}};
  const std::string text = ep::tokenizer::render_chat(ChatTemplate::deepseek_v4, msgs);
  const auto ids = tok.encode(text);
  REQUIRE(ids.size() >= 4);
  CHECK(ids.front() == 0);  // BOS
  CHECK(tok.decode(ids) == text);
  const auto user = tok.token_to_id("<｜User｜>");
  const auto assistant = tok.token_to_id("<｜Assistant｜>");
  REQUIRE(user.has_value());
  REQUIRE(assistant.has_value());
  CHECK(std::count(ids.begin(), ids.end(), *user) == 1);
  CHECK(std::count(ids.begin(), ids.end(), *assistant) == 1);
}
