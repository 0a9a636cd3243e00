// The JSON automaton (accept / reject tables), the JSON Schema compiler (its subset and its
// errors) and the token mask: equal to brute force (each token's bytes fed to a copy of the
// state) on a small vocabulary along seeded random walks, and on states of the DeepSeek-V3
// vocabulary.
#include "core/error.hpp"
#include "grammar/json_automaton.hpp"
#include "grammar/json_schema.hpp"
#include "grammar/schema_validator.hpp"
#include "grammar/token_mask.hpp"
#include "support/catch.hpp"
#include "tokenizer/tokenizer.hpp"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

using ep::grammar::JsonAutomaton;
using ep::grammar::JsonGrammar;
using ep::grammar::Matcher;
using ep::grammar::TokenGrammar;
using ep::grammar::Vocabulary;
using json = nlohmann::json;

namespace {

bool accepts(const JsonGrammar &g, std::string_view text) {
  JsonAutomaton a(g);
  return a.feed(text) && a.complete();
}

// True when text is refused at some byte (not merely incomplete).
bool refuses(const JsonGrammar &g, std::string_view text) {
  JsonAutomaton a(g);
  return !a.feed(text);
}

std::string compile_error(std::string_view schema) {
  try {
    JsonGrammar::from_schema(schema);
  } catch (const ep::Error &e) {
    return e.what();
  }
  return "";
}

const char *kPersonSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string"},
    "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2},
    "kind": {"enum": ["a", "b", 1]},
    "opt": {"type": ["string", "null"]},
    "score": {"type": "number", "description": "annotations are allowed"}
  },
  "required": ["name", "age", "tags", "kind"],
  "additionalProperties": false
})";

const char *kListSchema = R"({
  "$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
                     "required": ["v", "next"], "additionalProperties": false}},
  "$ref": "#/$defs/node"
})";

const char *kAnyOfSchema = R"({"anyOf": [
  {"type": "object", "properties": {"a": {"const": 1}}, "required": ["a"], "additionalProperties": false},
  {"type": "object", "properties": {"ab": {"type": "string"}}, "required": ["ab"], "additionalProperties": false}]})";

}  // namespace

TEST_CASE("the automaton accepts JSON values and refuses what is not JSON", "[grammar]") {
  const JsonGrammar any = JsonGrammar::any_value();
  for (const char *ok : {"{}", "[]", "0", "-0", "-1.5E+10", "12.25e-3", "true", "false", "null", "\"\"", "\"a\\\"b\\\\c\\/\\b\\f\\n\\r\\t\"",
                         "\"\\u00e9\\ud83d\\ude00\"", "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"", "{\"a\":1,\"b\":[1,2,{\"c\":null}]}",
                         " { \"a\" : [ ] , \"a\" : { } }", "[1,\n  2]"}) {
    INFO(ok);
    CHECK(accepts(any, ok));
  }
  for (const char *bad : {"{a:1}", "[1,]", "01", "1.", "-", ".5", "+1", "1e", "tru", "nul", "[1 2]", "{\"a\" 1}", "{\"a\":1,}", "{}}", "[]]",
                          "\"\x01\"", "\"\\x\"", "\"\\ud800\"", "\"\\udc00\"", "\"\\ud800\\u0041\"", "\"\xc0\x80\"", "\"\xed\xa0\x80\"",
                          "\"\xf4\x90\x80\x80\"", "\"\x80\"", "\"\xe2\x82\"", "{} ", "1 ", "[\"a\"] x"}) {
    INFO(bad);
    CHECK_FALSE(accepts(any, bad));
  }
  // Prefixes are incomplete, not refused.
  for (const char *prefix : {"{", "[1,", "\"ab", "\"\\u00", "-", "1.", "1e+", "tr", "{\"a\"", "{\"a\":", "\"\xe2\x82"}) {
    INFO(prefix);
    CHECK_FALSE(refuses(any, prefix));
    CHECK_FALSE(accepts(any, prefix));
  }
  // Whitespace is bounded: 16 bytes in a row, not 17.
  auto spaced = [](size_t n) {
    std::string t(n + 3, ' ');
    t.front() = '[';
    t[n + 1] = '1';
    t.back() = ']';
    return t;
  };
  CHECK(accepts(any, spaced(16)));
  CHECK(refuses(any, spaced(17)));
  // Numbers stop at 32 bytes.
  CHECK(accepts(any, std::string(32, '1')));
  CHECK_FALSE(accepts(any, std::string(33, '1')));
  // Nesting is bounded.
  CHECK(refuses(any, std::string(100, '[')));
}

TEST_CASE("json_object mode accepts only objects", "[grammar]") {
  const JsonGrammar obj = JsonGrammar::any_object();
  CHECK(accepts(obj, "{\"x\": [1, \"y\", {\"z\": null}]}"));
  CHECK(accepts(obj, "{}"));
  for (const char *bad : {"[]", "1", "\"a\"", "null", "true"}) {
    INFO(bad);
    CHECK(refuses(obj, bad));
  }
}

TEST_CASE("a compiled schema admits exactly its values", "[grammar]") {
  const JsonGrammar g = JsonGrammar::from_schema(kPersonSchema);
  for (const char *ok : {R"({"name":"x","age":3,"tags":["a"],"kind":"a"})", R"({"kind":1,"tags":["a","b"],"age":-2,"name":""})",
                         R"({"name":"x","age":3,"tags":["a"],"kind":"b","opt":null,"score":1.5})", R"({ "name" : "x" , "age" : 0, "tags" : [ "t" ], "kind" : "a", "opt" : "o" })"}) {
    INFO(ok);
    CHECK(accepts(g, ok));
    CHECK(ep::testing::schema_valid(json::parse(kPersonSchema), json::parse(ok)));
  }
  for (const char *bad : {R"({"name":"x"})", R"({"zzz")", R"({"name":"x","name")", R"({"name":"x","age":1.5)", R"({"name":"x","age":3,"tags":["a","b","c"])",
                          R"({"kind":"c")", R"({"tags":[])", R"({"opt":1)", R"({"age":"3")", R"({"nam":)", R"([])"}) {
    INFO(bad);
    CHECK(refuses(g, bad));
  }
  const JsonGrammar list = JsonGrammar::from_schema(kListSchema);
  CHECK(accepts(list, R"({"v":1,"next":{"v":2,"next":{"v":3,"next":null}}})"));
  CHECK(refuses(list, R"({"v":1,"next":{"v":2,"next":3)"));
  const JsonGrammar alt = JsonGrammar::from_schema(kAnyOfSchema);
  CHECK(accepts(alt, R"({"a":1})"));
  CHECK(accepts(alt, R"({"ab":"x"})"));
  CHECK(refuses(alt, R"({"a":"x")"));
  CHECK(refuses(alt, R"({"ab":1)"));
  // const and enum of structured values are matched as their compact text.
  const JsonGrammar c = JsonGrammar::from_schema(R"({"enum": [{"k": [1, 2]}, 12, 1, "s\"q"]})");
  for (const char *ok : {R"({"k":[1,2]})", "12", "1", R"("s\"q")"}) CHECK(accepts(c, ok));
  for (const char *bad : {R"({"k": [1,2]})", "2", "123", R"("s")"}) CHECK_FALSE(accepts(c, bad));
  // Property names that need escapes are written escaped.
  const JsonGrammar esc = JsonGrammar::from_schema(R"({"type":"object","properties":{"a\"b":{"type":"null"}},"required":["a\"b"],"additionalProperties":false})");
  CHECK(accepts(esc, R"({"a\"b":null})"));
  // Without additionalProperties: false other keys are allowed, with any value.
  const JsonGrammar open = JsonGrammar::from_schema(R"({"type":"object","properties":{"a":{"type":"integer"}}})");
  CHECK(accepts(open, R"({"b":[true],"a":1,"ab":"x"})"));
  CHECK(refuses(open, R"({"a":"x")"));
}

TEST_CASE("a keyword outside the subset is an error naming it and its pointer", "[grammar]") {
  struct Case {
    const char *schema, *expect;
  };
  for (const Case &c : {Case{R"({"type":"string","pattern":"x"})", "/pattern: keyword \"pattern\""},
                        Case{R"({"type":"object","properties":{"a":{"type":"integer","minimum":1}}})", "/properties/a/minimum"},
                        Case{R"({"properties":{"a/b":{"format":"date"}}})", "/properties/a~1b/format"},
                        Case{R"({"$ref":"#/$defs/missing"})", "names nothing"},
                        Case{R"({"type":"strin"})", "unknown \"type\" \"strin\""},
                        Case{R"({"anyOf":[{"$ref":"#"}]})", "refers back"},
                        Case{R"({"additionalProperties":{"type":"string"}})", "/additionalProperties: only true or false"},
                        Case{R"({"type":"array","items":[{"type":"string"}]})", "/items"},
                        Case{R"({"type":"array","minItems":3,"maxItems":2})", "/minItems"},
                        Case{R"({"type":"object","properties":{"a":{}},"required":["b"]})", "/required/0"},
                        Case{R"({"enum":[]})", "/enum"},
                        Case{R"({"type":"string","enum":[1,2]})", "no value is of the schema's \"type\""},
                        Case{R"({"anyOf":[{"type":"string"}],"type":"string"})", "/type: keyword \"type\" beside \"anyOf\""},
                        Case{R"({"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})", "chain of references"},
                        Case{"{not json", "not JSON"},
                        Case{"false", "admits no value"}}) {
    INFO(c.schema);
    const std::string e = compile_error(c.schema);
    CHECK(e.find(c.expect) != std::string::npos);
    if (e.find(c.expect) == std::string::npos) FAIL(e);
  }
}

TEST_CASE("a schema's size and nesting are bounded, and long chains of references compile", "[grammar]") {
  // 5000 definitions: more schemas than the limit.
  json many = {{"$defs", json::object()}, {"$ref", "#/$defs/d0"}};
  for (int i = 0; i < 5000; ++i) {
    char name[8];
    std::snprintf(name, sizeof name, "d%d", i);
    many["$defs"][name] = {{"type", "integer"}};
  }
  CHECK(compile_error(many.dump()).find("more than 4096 schemas") != std::string::npos);
  // 200 levels of properties: deeper than the limit, named where it is crossed.
  json deep = {{"type", "integer"}};
  for (int i = 0; i < 200; ++i) deep = {{"type", "object"}, {"properties", {{"a", deep}}}};
  CHECK(compile_error(deep.dump()).find("deeper than 128") != std::string::npos);
  // A chain of 1500 anyOf definitions, each naming the one before it. Reached from the root it
  // is refused (nested deeper than the limit); defined first and referenced after, the compiler's
  // recursion stays shallow (each reference finds the one before compiled) and the long chain
  // compiles and runs.
  json defs = {{"d0000", {{"type", "integer"}}}};
  for (int i = 1; i < 1500; ++i) {
    char ref[24], name[8];
    std::snprintf(ref, sizeof ref, "#/$defs/d%04d", i - 1);
    std::snprintf(name, sizeof name, "d%04d", i);
    defs[name] = {{"anyOf", json::array({{{"$ref", ref}}, {{"type", "null"}}})}};
  }
  const json from_root = {{"$defs", defs}, {"$ref", "#/$defs/d1499"}};
  CHECK(compile_error(from_root.dump()).find("deeper than 128") != std::string::npos);
  json chain = {{"anyOf", json::array({{{"type", "boolean"}, {"$defs", defs}}, {{"$ref", "#/anyOf/0/$defs/d1499"}}})}};
  // The definitions' references point at their own $defs: rewrite them to where they are.
  for (auto &[name, d] : chain["anyOf"][0]["$defs"].items())
    if (d.contains("anyOf")) d["anyOf"][0]["$ref"] = "#/anyOf/0" + d["anyOf"][0]["$ref"].get<std::string>().substr(1);
  const JsonGrammar g = JsonGrammar::from_schema(chain.dump());
  CHECK(accepts(g, "12"));
  CHECK(accepts(g, "null"));
  CHECK(accepts(g, "true"));
  CHECK(refuses(g, "\"x\""));
}

namespace {

// The mask by brute force: every token's bytes fed to a copy of the state.
std::vector<uint32_t> brute_mask(const TokenGrammar &g, const JsonAutomaton &state) {
  const Vocabulary &v = g.vocabulary();
  std::vector<uint32_t> m(g.mask_words(), 0);
  for (size_t id = 0; id < v.size(); ++id) {
    const auto t = static_cast<int32_t>(id);
    bool ok = false;
    if (g.is_end(t)) {
      ok = state.complete();
    } else if (!v.special(t) && !v.bytes(t).empty()) {
      JsonAutomaton a = state;
      ok = a.feed(v.bytes(t));
    }
    if (ok) m[id / 32] |= uint32_t{1} << (id % 32);
  }
  return m;
}

std::vector<int32_t> ids_of(const std::vector<uint32_t> &m) {
  std::vector<int32_t> out;
  for (size_t i = 0; i < m.size() * 32; ++i)
    if (m[i / 32] >> (i % 32) & 1) out.push_back(static_cast<int32_t>(i));
  return out;
}

std::shared_ptr<const Vocabulary> small_vocabulary() {
  std::vector<std::string> t = {"{", "}", "\"", "a", "\"a", "\":", "1", "12", ".5", " ", "  ", ",", "[", "]", "true", "null", "\\u", "00",
                                "e9", "\xc3\xa9", "\"}", "\":\"", "{\"", "\xc3", "\xa9", "<eos>", "<s>", "\"name", "age", "\":[\"", "\"]",
                                "b", "kind", "tags", "opt", "\",\"", "-", "0", "e", "E+", "\n", "\\", "n", "\":1", "3}", "ab", "\"ab"};
  // Every printable ASCII byte is a token too, as in a byte-level BPE vocabulary (so that every
  // state the automaton reaches has a continuation).
  for (int c = ' '; c <= '~'; ++c) {
    const char one[2] = {static_cast<char>(c), 0};
    t.emplace_back(one);
  }
  std::vector<bool> special(t.size(), false);
  special[25] = special[26] = true;
  return std::make_shared<const Vocabulary>(std::move(t), std::move(special));
}

// Seeded random walks: at each step the mask equals brute force, then an allowed token is taken.
void walk_and_compare(const std::shared_ptr<const TokenGrammar> &g, uint32_t seeds, uint32_t steps) {
  for (uint32_t seed = 0; seed < seeds; ++seed) {
    std::mt19937 rng(seed);
    Matcher m(g);
    std::string text;
    for (uint32_t step = 0; step < steps && !m.ended(); ++step) {
      INFO("seed " << seed << " text " << text);
      const std::vector<uint32_t> fast = *m.allowed();
      REQUIRE(fast == brute_mask(*g, m.state()));
      const std::vector<int32_t> ids = ids_of(fast);
      REQUIRE_FALSE(ids.empty());  // no dead end
      const int32_t t = ids[std::uniform_int_distribution<size_t>(0, ids.size() - 1)(rng)];
      m.accept(t);
      if (!m.ended()) text += g->vocabulary().bytes(t);
    }
  }
}

}  // namespace

TEST_CASE("the mask equals brute force on a small vocabulary", "[grammar]") {
  const auto vocab = small_vocabulary();
  REQUIRE(vocab->trie_nodes() > 10);
  walk_and_compare(std::make_shared<const TokenGrammar>(JsonGrammar::any_object(), vocab, std::vector<int32_t>{25}), 40, 60);
  walk_and_compare(std::make_shared<const TokenGrammar>(JsonGrammar::from_schema(kPersonSchema), vocab, std::vector<int32_t>{25}), 40, 60);
  walk_and_compare(std::make_shared<const TokenGrammar>(JsonGrammar::from_schema(kAnyOfSchema), vocab, std::vector<int32_t>{25}), 40, 60);
  // A refused token is an error naming it; an end token before the value is complete too.
  Matcher m(std::make_shared<const TokenGrammar>(JsonGrammar::any_object(), vocab, std::vector<int32_t>{25}));
  auto refusal = [&](int32_t token) {
    try {
      m.accept(token);
    } catch (const ep::Error &e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(refusal(1).find("token 1 (") != std::string::npos);
  CHECK(refusal(25).find("before the JSON value is complete") != std::string::npos);
  CHECK(refusal(26).find("special token 26") != std::string::npos);
  m.accept(0);
  m.accept(1);
  CHECK(m.complete());
  CHECK(ids_of(*m.allowed()) == std::vector<int32_t>{25});
  m.accept(25);
  CHECK(m.ended());
  CHECK(ids_of(*m.allowed()) == std::vector<int32_t>{25});
}

TEST_CASE("the mask equals brute force on states of the DeepSeek-V3 vocabulary", "[grammar]") {
  const auto tok = ep::tokenizer::Tokenizer::from_json_file(std::string(EP_TEST_BUILD_DATA_DIR) + "/tokenizer/deepseek-v3/tokenizer.json");
  const auto vocab = Vocabulary::from_tokenizer(tok);
  REQUIRE(tok.eos_id());
  const std::vector<int32_t> end = {*tok.eos_id()};
  const auto person = std::make_shared<const TokenGrammar>(JsonGrammar::from_schema(kPersonSchema), vocab, end);
  const auto object = std::make_shared<const TokenGrammar>(JsonGrammar::any_object(), vocab, end);
  // States: prefixes of texts, cut at several places (in a key, a string, a number, between values).
  const std::string text = R"({"name": "Zoë \"q\" \u00e9", "age": 42, "tags": ["x"], "kind": 1, "score": -1.5e3})";
  double total_ms = 0, cached_us = 0;
  int timed = 0;
  for (const auto &g : {person, object}) {
    for (size_t cut : {size_t{0}, size_t{1}, size_t{3}, size_t{8}, size_t{12}, size_t{17}, size_t{24}, size_t{33}, size_t{37}, size_t{48},
                       size_t{56}, size_t{66}, size_t{74}, size_t{80}, text.size()}) {
      JsonAutomaton s(g->json());
      REQUIRE(s.feed(std::string_view(text).substr(0, cut)));
      INFO("cut " << cut << ": " << text.substr(0, cut));
      const auto t0 = std::chrono::steady_clock::now();
      const std::vector<uint32_t> fast = g->compute_mask(s);
      const auto t1 = std::chrono::steady_clock::now();
      REQUIRE(*g->mask(s) == fast);  // first: computed and kept
      const auto t2 = std::chrono::steady_clock::now();
      REQUIRE(*g->mask(s) == fast);  // then: from the cache
      total_ms += std::chrono::duration<double, std::milli>(t1 - t0).count();
      cached_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t2).count();
      ++timed;
      CHECK(fast == brute_mask(*g, s));
      CHECK_FALSE(ids_of(fast).empty());
    }
  }
  // Informational (not checked): the uncached trie walk's cost per token on this machine.
  std::printf("grammar mask over %zu ids (%zu trie nodes): %.2f ms per uncached mask, %.1f us per cached one (means of %d states)\n",
              vocab->size(), vocab->trie_nodes(), total_ms / timed, cached_us / timed, timed);
}
