// Constrained sampling through the C API on the trained demo model (CPU backend): in json_object
// and json_schema mode, over many seeds, every answer that ends is text that nlohmann-json parses
// and that validates against the schema (tests/grammar/schema_validator.hpp, written apart from
// the compiler); every drawn token was in the state's mask; a schema outside the subset is
// refused naming the keyword and its JSON pointer.
#include "grammar/schema_validator.hpp"
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

#include "support/demo_model_golden.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

using namespace demomodel;

namespace {

const char *kSchema = R"({
  "type": "object",
  "properties": {
    "book": {"enum": ["Genesis", "Exodus", "Psalms"]},
    "chapter": {"type": "integer"},
    "verses": {"type": "array", "items": {"$ref": "#/$defs/verse"}, "minItems": 1, "maxItems": 2},
    "holy": {"type": "boolean"},
    "note": {"type": ["string", "null"]},
    "see": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}
  },
  "required": ["book", "chapter", "verses", "holy", "note", "see"],
  "additionalProperties": false,
  "$defs": {"verse": {"type": "object", "properties": {"n": {"type": "integer"}, "word": {"const": "Amen"}},
                      "required": ["n", "word"], "additionalProperties": false}}
})";

struct Answer {
  std::string text;
  bool ended = false;
};

// Samples up to @p max tokens with @p grammar from a session holding @p prompt, each drawn token
// checked against the state's mask before it is taken.
Answer generate(ep_model *m, ep_tokenizer *tok, const ep_grammar *grammar, const std::vector<int32_t> &prompt, float temperature,
                uint64_t seed, uint32_t max) {
  ep_tokenizer_properties tp;
  ep_tokenizer_properties_init(&tp);
  REQUIRE(ep_tokenizer_info(&tp, tok) == EP_OK);
  ep_session *s = nullptr;
  REQUIRE(ep_session_open(&s, m) == EP_OK);
  const int32_t *pt = prompt.data();
  const size_t pn = prompt.size();
  REQUIRE(ep_sessions_append(&s, &pt, &pn, 1) == EP_OK);
  ep_grammar_state *state = nullptr;
  REQUIRE(ep_grammar_state_open(&state, grammar) == EP_OK);
  ep_generate_options o;
  ep_generate_options_init(&o);
  o.temperature = temperature;
  o.seed = seed;
  o.grammar = state;
  std::vector<int32_t> out;
  Answer a;
  std::vector<uint32_t> mask;
  for (uint32_t i = 0; i < max; ++i) {
    size_t words = 0;
    REQUIRE(ep_grammar_state_allowed(nullptr, 0, &words, state) == EP_OK);
    mask.assign(words, 0);
    REQUIRE(ep_grammar_state_allowed(mask.data(), words, &words, state) == EP_OK);
    int32_t t = -1;
    REQUIRE(ep_session_sample(&t, s, &o) == EP_OK);
    REQUIRE((static_cast<size_t>(t) / 32 < words && (mask[static_cast<size_t>(t) / 32] >> (t % 32) & 1)));
    if (t == tp.eos_id || t == tp.end_of_turn_id) {
      a.ended = true;
      break;
    }
    out.push_back(t);
    const int32_t *one = &t;
    const size_t n1 = 1;
    REQUIRE(ep_sessions_append(&s, &one, &n1, 1) == EP_OK);
  }
  int32_t complete = 0;
  REQUIRE(ep_grammar_state_complete(&complete, state) == EP_OK);
  if (a.ended) CHECK(complete == 1);
  size_t len = 0;
  REQUIRE(ep_detokenize(nullptr, 0, &len, tok, out.data(), out.size(), 0) == EP_OK);
  a.text.resize(len + 1);
  REQUIRE(ep_detokenize(a.text.data(), a.text.size(), &len, tok, out.data(), out.size(), 0) == EP_OK);
  a.text.resize(len);
  ep_grammar_state_close(state);
  ep_session_close(s);
  return a;
}

}  // namespace

TEST_CASE("json_object and json_schema answers of the demo model parse and follow the schema", "[model][grammar]") {
  ep::test::TempDir dir;
  ep_model *m = open_model(dir.str(), EP_DEVICE_CPU);
  ep_tokenizer *tok = nullptr;
  REQUIRE(ep_tokenizer_open_model(&tok, m) == EP_OK);
  std::vector<int32_t> prompt = passage_tokens();
  prompt.resize(std::min<size_t>(prompt.size(), 16));

  ep_grammar *object = nullptr, *schema = nullptr;
  REQUIRE(ep_grammar_json_object(&object, tok) == EP_OK);
  REQUIRE(ep_grammar_json_schema(&schema, tok, kSchema, std::strlen(kSchema)) == EP_OK);
  const nlohmann::json schema_json = nlohmann::json::parse(kSchema);
  int ended_object = 0, ended_schema = 0;
  for (uint64_t seed = 0; seed < 16; ++seed) {
    const float temperature = seed == 0 ? 0.0f : 1.0f;
    for (int mode = 0; mode < 2; ++mode) {
      const Answer a = generate(m, tok, mode == 0 ? object : schema, prompt, temperature, seed, 400);
      INFO("seed " << seed << " mode " << mode << ": " << a.text);
      if (!a.ended) continue;  // ran out of tokens inside a value
      nlohmann::json v;
      REQUIRE_NOTHROW(v = nlohmann::json::parse(a.text));
      if (mode == 0) {
        CHECK(v.is_object());
        ++ended_object;
      } else {
        CHECK(ep::testing::schema_valid(schema_json, v));
        ++ended_schema;
      }
    }
  }
  // A good share of the answers end within the budget (the test would pass vacuously otherwise;
  // at temperature 1 the demo model often writes a string on and on).
  CHECK(ended_object >= 4);
  CHECK(ended_schema >= 4);
  ep_grammar_close(object);
  ep_grammar_close(schema);
  ep_tokenizer_close(tok);
  ep_model_close(m);
}

TEST_CASE("a schema outside the subset is refused naming the keyword and its pointer", "[model][grammar]") {
  ep_tokenizer *tok = nullptr;
  REQUIRE(ep_tokenizer_open(&tok, hf_tokenizer_path().c_str()) == EP_OK);
  ep_grammar *g = nullptr;
  const std::string bad = R"({"type":"object","properties":{"age":{"type":"integer","minimum":0}}})";
  CHECK(ep_grammar_json_schema(&g, tok, bad.data(), bad.size()) == EP_ERR_INVALID_ARGUMENT);
  CHECK(g == nullptr);
  const std::string e = ep_last_error();
  CHECK(e.find("/properties/age/minimum") != std::string::npos);
  CHECK(e.find("\"minimum\"") != std::string::npos);
  // A token the state does not allow is refused by name and leaves the state as it was.
  REQUIRE(ep_grammar_json_object(&g, tok) == EP_OK);
  ep_grammar_state *st = nullptr;
  REQUIRE(ep_grammar_state_open(&st, g) == EP_OK);
  ep_grammar_close(g);  // the state keeps what it needs
  int32_t brace = -1, close = -1;
  REQUIRE(ep_tokenizer_token_id(&brace, tok, "{") == EP_OK);
  REQUIRE(ep_tokenizer_token_id(&close, tok, "}") == EP_OK);
  CHECK(ep_grammar_state_accept(st, close) == EP_ERR_INVALID_ARGUMENT);
  CHECK(std::string(ep_last_error()).find("token " + std::to_string(close)) != std::string::npos);
  CHECK(ep_grammar_state_accept(st, brace) == EP_OK);
  CHECK(ep_grammar_state_accept(st, close) == EP_OK);
  int32_t complete = 0;
  REQUIRE(ep_grammar_state_complete(&complete, st) == EP_OK);
  CHECK(complete == 1);
  ep_grammar_state_close(st);
  ep_tokenizer_close(tok);
}
