// The text C API (include/expertpack/text.h) end to end on a synthetic DeepSeek-V4 model that
// carries the byte-level chat tokenizer: tokenizer from the model, tokenize/detokenize and the
// buffer protocol, chat rendering, streamed text generation (complete UTF-8 only, equal to the
// token path), stop strings, stop tokens, cancellation, chat turns with session reuse, the
// sampling extras, option checks, and several threads sharing one model.
#include <expertpack/expertpack.h>

#include "tokenizer/corpus_util.hpp"
#include "support/catch.hpp"
#include "support/temp_dir.hpp"
#include "testkit/chat_vocab.hpp"
#include "testkit/deepseek_v4_gguf.hpp"
#include "tokenizer/chat_template.hpp"
#include "tokenizer/utf8.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <list>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Fixture {
  ep::test::TempDir dir;
  std::string model_path;
  Fixture() {
    ep::testkit::DeepseekV4SyntheticSpec spec;
    spec.seed = 7;
    spec.chat_tokenizer = true;
    spec.vocab = ep::testkit::kSyntheticChatVocabMin;
    model_path = dir / "chat.gguf";
    ep::testkit::write_deepseek_v4_synthetic_gguf(spec, model_path);
  }
};

const Fixture &fixture() {
  static const Fixture f;
  return f;
}

struct Model {
  ep_model *m = nullptr;
  explicit Model(bool packed = false, uint64_t cache_bytes = 0) {
    ep_model_options o;
    ep_model_options_init(&o);
    std::string pack_dir = fixture().dir / "packs";
    if (packed) {
      o.pack_dir = pack_dir.c_str();
      o.cache_budget_bytes = cache_bytes;
    } else {
      o.resident_experts = 1;
    }
    const ep_status st = ep_model_open(&m, fixture().model_path.c_str(), &o);
    INFO(ep_last_error());
    REQUIRE(st == EP_OK);
  }
  ~Model() { ep_model_close(m); }
};

struct Tok {
  ep_tokenizer *t = nullptr;
  explicit Tok(const ep_model *m) {
    const ep_status st = ep_tokenizer_open_model(&t, m);
    INFO(ep_last_error());
    REQUIRE(st == EP_OK);
  }
  ~Tok() { ep_tokenizer_close(t); }
};

struct Session {
  ep_session *s = nullptr;
  explicit Session(ep_model *m) { REQUIRE(ep_session_open(&s, m) == EP_OK); }
  ~Session() { ep_session_close(s); }
};

std::vector<int32_t> tokenize(const ep_tokenizer *t, const std::string &text, uint32_t flags = 0) {
  size_t n = 0;
  REQUIRE(ep_tokenize(nullptr, 0, &n, t, text.data(), text.size(), flags) == EP_OK);
  std::vector<int32_t> ids(n);
  size_t n2 = 0;
  REQUIRE(ep_tokenize(ids.data(), ids.size(), &n2, t, text.data(), text.size(), flags) == EP_OK);
  REQUIRE(n2 == n);
  return ids;
}

std::string detokenize(const ep_tokenizer *t, const std::vector<int32_t> &ids, uint32_t flags = 0) {
  size_t len = 0;
  REQUIRE(ep_detokenize(nullptr, 0, &len, t, ids.data(), ids.size(), flags) == EP_OK);
  std::string s(len + 1, '\0');
  REQUIRE(ep_detokenize(s.data(), s.size(), &len, t, ids.data(), ids.size(), flags) == EP_OK);
  s.resize(len);
  return s;
}

struct Pieces {
  std::vector<std::string> pieces;
  int cancel_after = -1;  // cancel when this many pieces arrived
  std::string joined() const {
    std::string r;
    for (const auto &p : pieces) r += p;
    return r;
  }
};

int on_piece(const char *piece, size_t length, void *payload) {
  auto &p = *static_cast<Pieces *>(payload);
  p.pieces.emplace_back(piece, length);
  return p.cancel_after >= 0 && static_cast<int>(p.pieces.size()) >= p.cancel_after ? 1 : 0;
}

int on_token(int32_t token, uint32_t, void *payload) {
  static_cast<std::vector<int32_t> *>(payload)->push_back(token);
  return 0;
}

ep_generate_options sampled(uint32_t n, uint64_t seed) {
  ep_generate_options o;
  ep_generate_options_init(&o);
  o.max_new_tokens = n;
  o.temperature = 0.9f;
  o.seed = seed;
  return o;
}

bool valid_utf8(const std::string &s) { return ep::tokenizer::utf8_first_invalid(s) == s.size(); }

}  // namespace

TEST_CASE("text api: the synthetic model's tokenizer", "[text][capi]") {
  Model model;
  Tok tok(model.m);
  ep_tokenizer_properties p;
  ep_tokenizer_properties_init(&p);
  REQUIRE(ep_tokenizer_info(&p, tok.t) == EP_OK);
  CHECK(p.vocab_size == 262);
  CHECK(p.bos_id == 0);
  CHECK(p.eos_id == 1);
  CHECK(p.end_of_turn_id == 1);
  CHECK(p.chat_template == EP_CHAT_TEMPLATE_DEEPSEEK_V4);
  int32_t id = -1;
  REQUIRE(ep_tokenizer_token_id(&id, tok.t, "<｜User｜>") == EP_OK);
  CHECK(id == 258);
  CHECK(ep_tokenizer_token_id(&id, tok.t, "<｜nope｜>") == EP_ERR_NOT_FOUND);

  const std::string text = "héllo <think>x</think> 日本";
  const auto ids = tokenize(tok.t, text);
  CHECK(ids[0] == 'h' + 2);  // one token per byte, bytes at 2..257
  CHECK(std::count(ids.begin(), ids.end(), 260) == 1);  // <think> matched as one token
  CHECK(detokenize(tok.t, ids) == text);
  const auto with_bos = tokenize(tok.t, text, EP_TOKENIZE_ADD_SPECIAL);
  REQUIRE(with_bos.size() == ids.size() + 1);
  CHECK(with_bos[0] == 0);
  const auto as_text = tokenize(tok.t, "<｜User｜>", EP_TOKENIZE_SPECIAL_AS_TEXT);
  CHECK(as_text.size() == std::string("<｜User｜>").size());
  CHECK(detokenize(tok.t, {0, 'a' + 2, 258}, EP_DETOKENIZE_SKIP_SPECIAL) == "a");
  CHECK(detokenize(tok.t, {0xC3 + 2}) == "\xEF\xBF\xBD");  // a lone lead byte: U+FFFD

  // buffer protocol: too small writes nothing (an empty string), reports the size
  std::vector<int32_t> small(2, -7);
  size_t n = 0;
  REQUIRE(ep_tokenize(small.data(), small.size(), &n, tok.t, text.data(), text.size(), 0) == EP_OK);
  CHECK(n == ids.size());
  CHECK(small[0] == -7);
  char buf[4] = {'x', 'x', 'x', 'x'};
  size_t len = 0;
  REQUIRE(ep_detokenize(buf, sizeof buf, &len, tok.t, ids.data(), ids.size(), 0) == EP_OK);
  CHECK(len == text.size());
  CHECK(buf[0] == '\0');
  // errors
  CHECK(ep_tokenize(nullptr, 0, &n, tok.t, "\xff", 1, 0) == EP_ERR_INVALID_ARGUMENT);
  CHECK(std::string(ep_last_error()).find("UTF-8") != std::string::npos);
  CHECK(ep_tokenize(nullptr, 0, &n, tok.t, "a", 1, 0x80) == EP_ERR_INVALID_ARGUMENT);
  CHECK(ep_tokenize(nullptr, 0, nullptr, tok.t, "a", 1, 0) == EP_ERR_INVALID_ARGUMENT);
  ep_tokenizer *unused = reinterpret_cast<ep_tokenizer *>(&p);  // overwritten with NULL on error
  CHECK(ep_tokenizer_open(&unused, nullptr) == EP_ERR_INVALID_ARGUMENT);
  CHECK(unused == nullptr);
  ep_tokenizer *none = reinterpret_cast<ep_tokenizer *>(1);
  CHECK(ep_tokenizer_open(&none, (fixture().dir / "missing.json").c_str()) == EP_ERR_NOT_FOUND);
  CHECK(none == nullptr);
  ep_tokenizer_close(nullptr);
}

TEST_CASE("text api: chat rendering through the C API equals the C++ renderer", "[text][capi]") {
  ep_tokenizer *t = nullptr;
  REQUIRE(ep_tokenizer_open(&t, ep_test::deepseek_tokenizer_path().c_str()) == EP_OK);
  ep_tokenizer_properties p;
  ep_tokenizer_properties_init(&p);
  REQUIRE(ep_tokenizer_info(&p, t) == EP_OK);
  CHECK(p.chat_template == EP_CHAT_TEMPLATE_DEEPSEEK_V4);
  CHECK(p.bos_id == 0);
  const ep_chat_message msgs[] = {{"system", "Be brief.", nullptr}, {"user", "Hi ünïcode", nullptr},
                                  {"assistant", "Hello", "thinking"}, {"user", nullptr, nullptr}};
  for (int thinking : {-1, 0, 1}) {
    ep_chat_options o;
    ep_chat_options_init(&o);
    o.thinking = thinking;
    size_t len = 0;
    REQUIRE(ep_chat_render(nullptr, 0, &len, t, msgs, 4, &o) == EP_OK);
    std::string text(len + 1, '\0');
    REQUIRE(ep_chat_render(text.data(), text.size(), &len, t, msgs, 4, &o) == EP_OK);
    text.resize(len);
    std::vector<ep::tokenizer::ChatMessage> cm = {{"system", "Be brief.", ""}, {"user", "Hi ünïcode", ""},
                                                  {"assistant", "Hello", "thinking"}, {"user", "", ""}};
    ep::tokenizer::ChatRenderOptions ro;
    if (thinking >= 0) ro.thinking = thinking == 1;
    CHECK(text == ep::tokenizer::render_chat(ep::tokenizer::ChatTemplate::deepseek_v4, cm, ro));
  }
  ep_chat_options o;
  ep_chat_options_init(&o);
  o.chat_template = EP_CHAT_TEMPLATE_KIMI_K3;
  o.thinking = 0;
  o.add_generation_prompt = 0;
  size_t len = 0;
  char buf[256];
  REQUIRE(ep_chat_render(buf, sizeof buf, &len, t, msgs, 1, &o) == EP_OK);
  CHECK(std::string(buf) == "<|open|>message role=\"system\"<|sep|>Be brief.<|close|>message<|sep|><|end_of_msg|>");
  const ep_chat_message bad[] = {{nullptr, "x", nullptr}};
  CHECK(ep_chat_render(buf, sizeof buf, &len, t, bad, 1, nullptr) == EP_ERR_INVALID_ARGUMENT);
  const ep_chat_message narrator[] = {{"narrator", "x", nullptr}};
  CHECK(ep_chat_render(buf, sizeof buf, &len, t, narrator, 1, nullptr) == EP_ERR_INVALID_ARGUMENT);
  o.chat_template = EP_CHAT_TEMPLATE_NONE;
  CHECK(ep_chat_render(buf, sizeof buf, &len, t, msgs, 1, &o) == EP_ERR_INVALID_ARGUMENT);
  o.chat_template = EP_CHAT_TEMPLATE_AUTO;
  o.struct_size = 3;
  CHECK(ep_chat_render(buf, sizeof buf, &len, t, msgs, 1, &o) == EP_ERR_STRUCT_SIZE);
  ep_tokenizer_close(t);
}

namespace {

std::string render_c(const ep_tokenizer *t, const ep_chat_message *msgs, size_t n, const ep_chat_options *o) {
  size_t len = 0;
  REQUIRE(ep_chat_render(nullptr, 0, &len, t, msgs, n, o) == EP_OK);
  std::string text(len + 1, '\0');
  REQUIRE(ep_chat_render(text.data(), text.size(), &len, t, msgs, n, o) == EP_OK);
  text.resize(len);
  return text;
}

}  // namespace

TEST_CASE("text api: tools, tool calls and tool results through the C API equal the C++ renderer", "[text][capi]") {
  ep_tokenizer *t = nullptr;
  REQUIRE(ep_tokenizer_open(&t, ep_test::deepseek_tokenizer_path().c_str()) == EP_OK);
  const char *tools = R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])";
  const ep_chat_message msgs[] = {{"user", "Weather?", nullptr}, {"assistant", nullptr, nullptr}, {"tool", "21 C", nullptr}};
  const char *fields[] = {
      nullptr,
      R"({"tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"days\": 2}"}}]})",
      R"({"tool_call_id": "c1"})"};
  ep::tokenizer::ChatMessage a{"assistant", "", ""};
  a.tool_calls.push_back({"c1", "get_weather", R"({"city": "Oslo", "days": 2})"});
  ep::tokenizer::ChatMessage r{"tool", "21 C", ""};
  r.tool_call_id = "c1";
  const std::vector<ep::tokenizer::ChatMessage> cm = {{"user", "Weather?", ""}, a, r};
  for (const ep_chat_template tmpl : {EP_CHAT_TEMPLATE_DEEPSEEK_V4, EP_CHAT_TEMPLATE_KIMI_K3}) {
    ep_chat_options o;
    ep_chat_options_init(&o);
    CHECK(o.tools_json == nullptr);
    CHECK(o.message_tools_json == nullptr);
    CHECK(o.tool_choice == nullptr);
    o.chat_template = tmpl;
    o.tools_json = tools;
    o.message_tools_json = fields;
    o.tool_choice = "required";
    ep::tokenizer::ChatRenderOptions ro;
    ro.tools_json = tools;
    ro.tool_choice = "required";
    const auto which = tmpl == EP_CHAT_TEMPLATE_KIMI_K3 ? ep::tokenizer::ChatTemplate::kimi_k3 : ep::tokenizer::ChatTemplate::deepseek_v4;
    const std::string text = render_c(t, msgs, 3, &o);
    CHECK(text == ep::tokenizer::render_chat(which, cm, ro));
    CHECK(text.find(tmpl == EP_CHAT_TEMPLATE_KIMI_K3 ? "<|open|>argument key=\"days\" type=\"number\"<|sep|>2" : "string=\"false\">2<") !=
          std::string::npos);
    // The forced call's opening.
    size_t len = 0;
    REQUIRE(ep_chat_tool_call_prefix(nullptr, 0, &len, t, "get_weather", &o) == EP_OK);
    std::string prefix(len + 1, '\0');
    REQUIRE(ep_chat_tool_call_prefix(prefix.data(), prefix.size(), &len, t, "get_weather", &o) == EP_OK);
    prefix.resize(len);
    CHECK(prefix == ep::tokenizer::tool_call_prefix(which, ro, "get_weather"));
  }
  // Tool fields that are not what the options say are errors naming them.
  ep_chat_options o;
  ep_chat_options_init(&o);
  const char *not_object[] = {nullptr, "[1]", nullptr};
  o.message_tools_json = not_object;
  size_t len = 0;
  CHECK(ep_chat_render(nullptr, 0, &len, t, msgs, 3, &o) == EP_ERR_INVALID_ARGUMENT);
  CHECK(std::string(ep_last_error()).find("message_tools_json[1]") != std::string::npos);
  const char *unknown[] = {nullptr, R"({"refusal": "no"})", nullptr};
  o.message_tools_json = unknown;
  CHECK(ep_chat_render(nullptr, 0, &len, t, msgs, 3, &o) == EP_ERR_INVALID_ARGUMENT);
  o.message_tools_json = nullptr;
  o.tool_choice = "sometimes";
  CHECK(ep_chat_render(nullptr, 0, &len, t, msgs, 1, &o) == EP_ERR_INVALID_ARGUMENT);
  o.tool_choice = nullptr;
  o.tools_json = "{";
  CHECK(ep_chat_render(nullptr, 0, &len, t, msgs, 1, &o) == EP_ERR_INVALID_ARGUMENT);
  CHECK(ep_chat_tool_call_prefix(nullptr, 0, nullptr, t, "f", nullptr) == EP_ERR_INVALID_ARGUMENT);
  // A caller built against the options before the tool fields is still served.
  ep_chat_options old;
  ep_chat_options_init(&old);
  old.struct_size = offsetof(ep_chat_options, tools_json);
  CHECK(ep_chat_render(nullptr, 0, &len, t, msgs, 1, &old) == EP_OK);
  ep_tokenizer_close(t);
}

TEST_CASE("text api: streamed text is complete UTF-8 and equals the token path", "[text][capi]") {
  Model model;
  Tok tok(model.m);
  const std::string prompt = "Bonjour, ça va? 你好";
  // token path: BOS + prompt, same options
  std::vector<int32_t> ids = {0};
  const auto p = tokenize(tok.t, prompt);
  ids.insert(ids.end(), p.begin(), p.end());
  for (uint64_t seed : {1, 2, 3}) {
    ep_generate_options o = sampled(40, seed);
    o.ignore_eos = 1;
    std::vector<int32_t> gen;
    {
      Session s(model.m);
      REQUIRE(ep_generate(nullptr, s.s, ids.data(), ids.size(), &o, on_token, &gen) == EP_OK);
    }
    Pieces pieces;
    ep_generate_stats st;
    ep_generate_stats_init(&st);
    Session s(model.m);
    const ep_status rc = ep_generate_text(&st, s.s, tok.t, prompt.c_str(), &o, on_piece, &pieces);
    INFO(ep_last_error());
    REQUIRE(rc == EP_OK);
    CHECK(st.prompt_tokens == ids.size());
    CHECK(st.generated_tokens == 40);
    CHECK(st.stop_reason == EP_STOP_LENGTH);
    CHECK(st.session_tokens == ids.size() + 40);
    CHECK(st.decode_tokens_per_second > 0);
    for (const auto &piece : pieces.pieces) {
      CHECK(!piece.empty());
      CHECK(valid_utf8(piece));
    }
    CHECK(pieces.joined() == detokenize(tok.t, gen, EP_DETOKENIZE_SKIP_SPECIAL));
  }
}

TEST_CASE("text api: stop strings, stop tokens, EOS and cancellation", "[text][capi]") {
  Model model;
  Tok tok(model.m);
  ep_generate_options o = sampled(60, 11);
  o.ignore_eos = 1;
  Pieces full;
  {
    Session s(model.m);
    REQUIRE(ep_generate_text(nullptr, s.s, tok.t, "abc", &o, on_piece, &full) == EP_OK);
  }
  const std::string text = full.joined();
  REQUIRE(text.size() > 12);
  // a stop string from the middle of the text, cut on character boundaries
  size_t a = text.size() / 2;
  while (a > 0 && (static_cast<unsigned char>(text[a]) & 0xC0) == 0x80) --a;
  size_t b = a + 1;
  while (b < text.size() && (static_cast<unsigned char>(text[b]) & 0xC0) == 0x80) ++b;
  const std::string stop = text.substr(a, b - a);
  const std::string want = text.substr(0, text.find(stop));
  const char *stops[] = {"\x01never-appears\x02", stop.c_str()};
  o.stop_strings = stops;
  o.n_stop_strings = 2;
  Pieces cut;
  ep_generate_stats st;
  ep_generate_stats_init(&st);
  {
    Session s(model.m);
    REQUIRE(ep_generate_text(&st, s.s, tok.t, "abc", &o, on_piece, &cut) == EP_OK);
  }
  CHECK(cut.joined() == want);
  CHECK(st.stop_reason == EP_STOP_STRING);
  CHECK(st.generated_tokens <= 60);
  o.stop_strings = nullptr;
  o.n_stop_strings = 0;

  // ep_generate refuses stop strings (it has no tokenizer)
  {
    Session s(model.m);
    ep_generate_options bad = o;
    bad.stop_strings = stops;
    bad.n_stop_strings = 1;
    const int32_t one = 5;
    CHECK(ep_generate(nullptr, s.s, &one, 1, &bad, nullptr, nullptr) == EP_ERR_INVALID_ARGUMENT);
  }

  // stop tokens: the first generated token of the full run stops it after one token
  std::vector<int32_t> gen;
  {
    Session s(model.m);
    std::vector<int32_t> ids = {0};
    const auto p = tokenize(tok.t, "abc");
    ids.insert(ids.end(), p.begin(), p.end());
    REQUIRE(ep_generate(nullptr, s.s, ids.data(), ids.size(), &o, on_token, &gen) == EP_OK);
  }
  const int32_t stop_tok[] = {999999, gen[2]};
  ep_generate_options ot = o;
  ot.stop_tokens = stop_tok;
  ot.n_stop_tokens = 2;
  {
    Session s(model.m);
    std::vector<int32_t> got;
    ep_generate_stats st2;
    ep_generate_stats_init(&st2);
    std::vector<int32_t> ids = {0};
    const auto p = tokenize(tok.t, "abc");
    ids.insert(ids.end(), p.begin(), p.end());
    REQUIRE(ep_generate(&st2, s.s, ids.data(), ids.size(), &ot, on_token, &got) == EP_OK);
    const size_t first = static_cast<size_t>(std::find(gen.begin(), gen.end(), gen[2]) - gen.begin());
    CHECK(got.size() == first + 1);
    CHECK(st2.stop_reason == EP_STOP_TOKEN);
  }

  // EOS: with ignore_eos 0, a run whose tokens include EOS (1) stops there
  ep_generate_options oe = sampled(200, 0);
  oe.temperature = 2.0f;
  bool saw_eos = false;
  for (uint64_t seed = 0; seed < 20 && !saw_eos; ++seed) {
    oe.seed = seed;
    ep_generate_stats st3;
    ep_generate_stats_init(&st3);
    Session s(model.m);
    REQUIRE(ep_generate_text(&st3, s.s, tok.t, "x", &oe, nullptr, nullptr) == EP_OK);
    if (st3.stop_reason == EP_STOP_TOKEN) {
      saw_eos = true;
      CHECK(st3.generated_tokens < 200);
    }
  }
  CHECK(saw_eos);

  // cancellation from the text callback
  Pieces cancel;
  cancel.cancel_after = 2;
  ep_generate_stats st4;
  ep_generate_stats_init(&st4);
  Session s(model.m);
  CHECK(ep_generate_text(&st4, s.s, tok.t, "abc", &o, on_piece, &cancel) == EP_ERR_CANCELLED);
  CHECK(st4.stop_reason == EP_STOP_CANCELLED);
  CHECK(cancel.pieces.size() == 2);
  uint64_t len = 0;
  REQUIRE(ep_session_length(&len, s.s) == EP_OK);
  CHECK(len == 4 + st4.generated_tokens);
}

TEST_CASE("text api: chat turns reuse the session when the rendering extends it", "[text][capi]") {
  Model model;
  Tok tok(model.m);
  Session s(model.m);
  std::vector<ep_chat_message> msgs = {{"system", "Be brief.", nullptr}, {"user", "Hello there", nullptr}};
  ep_generate_options o = sampled(0, 5);  // prompt only
  ep_generate_stats st;
  ep_generate_stats_init(&st);
  REQUIRE(ep_generate_chat(&st, s.s, tok.t, msgs.data(), msgs.size(), nullptr, &o, nullptr, nullptr) == EP_OK);
  size_t len = 0;
  char buf[512];
  REQUIRE(ep_chat_render(buf, sizeof buf, &len, tok.t, msgs.data(), msgs.size(), nullptr) == EP_OK);
  const auto rendered = tokenize(tok.t, buf);
  CHECK(st.prompt_tokens == rendered.size());
  CHECK(st.reused_tokens == 0);
  CHECK(rendered[0] == 0);  // BOS from the template text, not added twice
  CHECK(rendered[1] != 0);
  // the same conversation again: everything is reused, only generation runs
  o.max_new_tokens = 6;
  o.ignore_eos = 1;
  Pieces answer;
  REQUIRE(ep_generate_chat(&st, s.s, tok.t, msgs.data(), msgs.size(), nullptr, &o, on_piece, &answer) == EP_OK);
  CHECK(st.reused_tokens == rendered.size());
  CHECK(st.prompt_tokens == 0);
  CHECK(st.generated_tokens == 6);
  // next turn: DeepSeek-V4 renders the earlier answer without the generation prompt's thinking
  // markers, so the session's tokens do not start the new rendering; it continues from the state
  // kept where the two part, and answers as a fresh session given the whole conversation does
  ep_generate_options g = o;
  g.temperature = 0.0f;
  std::list<std::string> answers{answer.joined()};  // stable addresses for the messages' pointers
  msgs.push_back({"assistant", answers.back().c_str(), nullptr});
  msgs.push_back({"user", "And now?", nullptr});
  for (int turn = 2; turn <= 3; ++turn) {
    REQUIRE(ep_chat_render(buf, sizeof buf, &len, tok.t, msgs.data(), msgs.size(), nullptr) == EP_OK);
    const auto whole = tokenize(tok.t, buf);
    Pieces kept, fresh;
    REQUIRE(ep_generate_chat(&st, s.s, tok.t, msgs.data(), msgs.size(), nullptr, &g, on_piece, &kept) == EP_OK);
    INFO("turn " << turn << ": " << st.reused_tokens << " of " << whole.size() << " prompt tokens reused");
    CHECK(st.reused_tokens > 0);
    CHECK(st.reused_tokens < whole.size());
    CHECK(st.prompt_tokens + st.reused_tokens == whole.size());
    uint64_t slen = 0;
    REQUIRE(ep_session_length(&slen, s.s) == EP_OK);
    CHECK(slen == whole.size() + st.generated_tokens);
    Session f(model.m);
    ep_generate_stats sf;
    ep_generate_stats_init(&sf);
    REQUIRE(ep_generate_chat(&sf, f.s, tok.t, msgs.data(), msgs.size(), nullptr, &g, on_piece, &fresh) == EP_OK);
    CHECK(sf.reused_tokens == 0);
    CHECK(sf.prompt_tokens == whole.size());
    CHECK(kept.joined() == fresh.joined());
    CHECK(st.generated_tokens == sf.generated_tokens);
    answers.push_back(kept.joined());
    msgs.push_back({"assistant", answers.back().c_str(), nullptr});
    msgs.push_back({"user", "Once more.", nullptr});
  }
  // another conversation on the same session: neither the session nor its snapshot starts it
  std::vector<ep_chat_message> other = {{"user", "Something else", nullptr}};
  REQUIRE(ep_generate_chat(&st, s.s, tok.t, other.data(), other.size(), nullptr, &g, nullptr, nullptr) == EP_OK);
  CHECK(st.reused_tokens == 0);
  CHECK(ep_generate_chat(&st, s.s, tok.t, msgs.data(), 0, nullptr, &o, nullptr, nullptr) == EP_ERR_INVALID_ARGUMENT);
}

TEST_CASE("text api: sampling extras and option checks", "[text][capi]") {
  Model model;
  Session s(model.m);
  const int32_t prompt[] = {0, 5, 6, 7};
  ep_generate_options o;
  ep_generate_options_init(&o);
  CHECK(o.repetition_penalty == 1.0f);
  CHECK(o.repetition_window == 64);
  CHECK(o.min_p == 0.0f);
  o.min_p = 1.5f;
  CHECK(ep_generate(nullptr, s.s, prompt, 4, &o, nullptr, nullptr) == EP_ERR_INVALID_ARGUMENT);
  o.min_p = 0.0f;
  o.repetition_penalty = 0.0f;
  CHECK(ep_generate(nullptr, s.s, prompt, 4, &o, nullptr, nullptr) == EP_ERR_INVALID_ARGUMENT);
  o.repetition_penalty = 1.0f;
  o.n_stop_tokens = 2;
  CHECK(ep_generate(nullptr, s.s, prompt, 4, &o, nullptr, nullptr) == EP_ERR_INVALID_ARGUMENT);
  // a v1 struct (sizeof 40: the fields up to stop_token) ignores what lies past stop_token
  ep_generate_options v1;
  std::memset(&v1, 0xFF, sizeof v1);
  ep_generate_options_init(&v1);
  v1.max_new_tokens = 3;
  v1.min_p = 7.0f;  // in v1's padding: must be ignored
  v1.struct_size = 40;
  std::vector<int32_t> got;
  ep_generate_stats st;
  ep_generate_stats_init(&st);
  st.struct_size = 32;  // v1 stats: prompt/generated/prefill/decode only
  REQUIRE(ep_generate(&st, s.s, prompt, 4, &v1, on_token, &got) == EP_OK);
  CHECK(got.size() == 3);
  CHECK(st.generated_tokens == 3);

  // The first token against the logits of the prompt (ep_score), computed here independently:
  // the penalty divides positive / multiplies negative logits of the prompt's tokens.
  const uint32_t V = 262;
  int changed = 0;
  for (int32_t k = 0; k < 12; ++k) {
    std::vector<int32_t> q = {0, 3 + k, 40 + 2 * k, 90 + k, 3 + k, 120 + 7 * k, 200 - k};
    std::vector<float> logits(q.size() * V);
    {
      Session a(model.m);
      REQUIRE(ep_score(a.s, q.data(), q.size(), 0, nullptr, logits.data()) == EP_OK);
    }
    std::vector<float> z(logits.end() - V, logits.end());
    const float penalty = 1.8f;
    std::vector<int32_t> seen = q;
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    const int32_t before = static_cast<int32_t>(std::max_element(z.begin(), z.end()) - z.begin());
    for (int32_t t : seen) z[t] = z[t] > 0 ? z[t] / penalty : z[t] * penalty;
    const int32_t want = static_cast<int32_t>(std::max_element(z.begin(), z.end()) - z.begin());
    changed += want != before;
    ep_generate_options g;
    ep_generate_options_init(&g);
    g.max_new_tokens = 1;
    g.repetition_penalty = penalty;
    g.repetition_window = 0;
    std::vector<int32_t> first;
    Session a(model.m);
    REQUIRE(ep_generate(nullptr, a.s, q.data(), q.size(), &g, on_token, &first) == EP_OK);
    REQUIRE(first.size() == 1);
    CHECK(first[0] == want);
    // a window of 1 sees only the last prompt token
    g.repetition_window = 1;
    std::vector<float> z1(logits.end() - V, logits.end());
    const int32_t last = q.back();
    z1[last] = z1[last] > 0 ? z1[last] / penalty : z1[last] * penalty;
    const int32_t want1 = static_cast<int32_t>(std::max_element(z1.begin(), z1.end()) - z1.begin());
    std::vector<int32_t> got1;
    Session b(model.m);
    REQUIRE(ep_generate(nullptr, b.s, q.data(), q.size(), &g, on_token, &got1) == EP_OK);
    CHECK(got1[0] == want1);

    // min_p: every draw keeps p_i >= min_p · p_max (temperature 1)
    std::vector<float> z0(logits.end() - V, logits.end());
    const float zmax = *std::max_element(z0.begin(), z0.end());
    ep_generate_options m = sampled(1, 0);
    m.temperature = 1.0f;
    m.min_p = 0.3f;
    for (uint64_t seed = 0; seed < 8; ++seed) {
      m.seed = seed * 31 + static_cast<uint64_t>(k);
      std::vector<int32_t> d;
      Session c(model.m);
      REQUIRE(ep_generate(nullptr, c.s, q.data(), q.size(), &m, on_token, &d) == EP_OK);
      CHECK(std::exp(z0[d[0]] - zmax) >= 0.3f * 0.999f);
    }
  }
  CHECK(changed > 0);  // the penalty changed the greedy choice somewhere
}

TEST_CASE("text api: sessions on several threads share one model and match sequential runs", "[text][capi][threads]") {
  // Experts from the pack through a small cache (evictions), so the expert store is shared too.
  Model model(true, 1 << 20);
  constexpr int kThreads = 4;
  constexpr uint32_t kTokens = 12;
  auto run = [&](int i, std::vector<int32_t> &out) {
    ep_session *s = nullptr;
    if (ep_session_open(&s, model.m) != EP_OK) return;
    const int32_t prompt[] = {0, static_cast<int32_t>(10 + i), 20, 30};
    ep_generate_options o = sampled(kTokens, 100 + static_cast<uint64_t>(i));
    ep_generate(nullptr, s, prompt, 4, &o, on_token, &out);
    ep_session_close(s);
  };
  std::vector<std::vector<int32_t>> sequential(kThreads), parallel(kThreads);
  for (int i = 0; i < kThreads; ++i) run(i, sequential[i]);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) threads.emplace_back(run, i, std::ref(parallel[i]));
  for (auto &t : threads) t.join();
  for (int i = 0; i < kThreads; ++i) {
    CHECK(sequential[i].size() == kTokens);
    CHECK(parallel[i] == sequential[i]);
  }
  ep_store_stats ss;
  ep_store_stats_init(&ss);
  REQUIRE(ep_model_store_stats(&ss, model.m) == EP_OK);
  CHECK(ss.acquires > 0);
}
