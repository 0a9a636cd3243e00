// Hand-checked unit tests of the byte-level BPE tokenizer on tiny vocabularies built in code.
#include "core/error.hpp"
#include "support/catch.hpp"
#include "tokenizer/regex.hpp"
#include "tokenizer/tokenizer.hpp"
#include "tokenizer/utf8.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

using ep::tokenizer::AddedToken;
using ep::tokenizer::EncodeOptions;
using ep::tokenizer::StreamDecoder;
using ep::tokenizer::Tokenizer;
using json = nlohmann::json;
using Ids = std::vector<int32_t>;
using Pieces = std::vector<std::string>;

namespace {

// A tiny GPT-2 style tokenizer.json: the byte-level letters a b c d, space (Ġ) and newline (Ċ),
// a few merges, and added tokens with various flags.
json tiny_json() {
  json j;
  j["version"] = "1.0";
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  j["post_processor"] = {{"type", "ByteLevel"}};
  j["decoder"] = {{"type", "ByteLevel"}};
  j["model"] = {{"type", "BPE"},
                {"vocab", {{"a", 0}, {"b", 1}, {"c", 2}, {"Ġ", 3}, {"ab", 4}, {"abc", 5}, {"Ġa", 6}, {"d", 7}, {"Ċ", 8},
                           {"Ġab", 9}, {"bc", 10}}},
                {"merges", json::array({"a b", json::array({"ab", "c"}), "Ġ a", "Ġa b", "b c"})}};
  j["added_tokens"] = json::array({
      {{"id", 20}, {"content", "<s>"}, {"special", true}, {"normalized", false}, {"lstrip", false}, {"rstrip", false},
       {"single_word", false}},
      {{"id", 21}, {"content", "<s>x"}, {"special", false}, {"normalized", false}, {"lstrip", false}, {"rstrip", false},
       {"single_word", false}},
      {{"id", 25}, {"content", "a<"}, {"special", false}, {"normalized", true}, {"lstrip", false}, {"rstrip", false},
       {"single_word", false}},
      {{"id", 22}, {"content", "<L>"}, {"special", true}, {"normalized", false}, {"lstrip", true}, {"rstrip", false},
       {"single_word", false}},
      {{"id", 23}, {"content", "<R>"}, {"special", true}, {"normalized", false}, {"lstrip", false}, {"rstrip", true},
       {"single_word", false}},
      {{"id", 24}, {"content", "cd"}, {"special", false}, {"normalized", false}, {"lstrip", false}, {"rstrip", false},
       {"single_word", true}},
  });
  return j;
}

Tokenizer tiny() { return Tokenizer::from_json_text(tiny_json().dump(), "tiny.json"); }

// A tokenizer whose only pre-tokenizer is Split("-", behavior) + ByteLevel(no regex).
Tokenizer split_tokenizer(const char *behavior, bool invert = false, const char *pattern = "-") {
  json j = tiny_json();
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         json::array({{{"type", "Split"}, {"pattern", {{"String", pattern}}}, {"behavior", behavior},
                                       {"invert", invert}},
                                      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  j["added_tokens"] = json::array();
  return Tokenizer::from_json_text(j.dump(), "split.json");
}

template <typename Fn>
std::string error_of(Fn &&fn, ep::Status expected) {
  try {
    fn();
  } catch (const ep::Error &e) {
    CHECK(e.status() == expected);
    return e.what();
  }
  FAIL("no ep::Error thrown");
  return {};
}

std::string lossy(std::string_view bytes) {
  std::string out;
  ep::tokenizer::utf8_append_lossy(out, bytes);
  return out;
}

}  // namespace

TEST_CASE("BPE merges by rank, hand-checked") {
  const Tokenizer t = tiny();
  // GPT-2 split: "abc" | " ab". "abc": a b (rank 0) -> ab c (rank 1) -> abc.
  // " ab": pairs (Ġ,a) rank 2 and (a,b) rank 0 -> Ġ ab; then (Ġ,ab) has no merge... but
  // "Ġa b" needs Ġa first, which never forms: result [Ġ, ab].
  CHECK(t.encode("abc ab") == Ids{5, 3, 4});
  // " ac": (Ġ,a) rank 2 -> Ġa c; (Ġa,c) none.
  CHECK(t.encode(" ac") == Ids{6, 2});
  // "bc": merge "b c" rank 4.
  CHECK(t.encode("bc") == Ids{10});
  // "abbc": pairs ab(0) bb(-) bc(4): ab first -> ab b c -> (ab,b) none, (b,c) 4 -> ab bc.
  CHECK(t.encode("abbc") == Ids{4, 10});
  CHECK(t.encode("").empty());
  // Bytes without a token are dropped, as HF does without unk_token.
  CHECK(t.encode("abe") == Ids{4});
  CHECK(t.encode("a\nb") == Ids{0, 8, 1});
  CHECK(t.vocab_size() == 26);
  CHECK(t.token_to_id("Ġab") == std::optional<int32_t>(9));
  CHECK(t.token_bytes(9) == " ab");
}

TEST_CASE("added tokens: before pre-tokenization, leftmost-longest, flags") {
  const Tokenizer t = tiny();
  CHECK(t.encode("a<s>b") == Ids{0, 20, 1});
  CHECK(t.encode("<s>xa") == Ids{21, 0});  // leftmost-longest: "<s>x" beats "<s>"
  // Non-normalized tokens are split out first, then normalized ones in what is left (HF order).
  CHECK(t.encode("a<b") == Ids{25, 1});
  CHECK(t.encode("a<s>") == Ids{0, 20});
  CHECK(t.encode("<s><s>") == Ids{20, 20});
  CHECK(t.encode("<s") == Ids{});          // '<' and 's' are not in the vocab: dropped
  // lstrip eats whitespace on the left, rstrip on the right.
  CHECK(t.encode("a  <L>b") == Ids{0, 22, 1});
  CHECK(t.encode("a<R> \n b") == Ids{0, 23, 1});
  CHECK(t.encode("a <R>b") == Ids{0, 3, 23, 1});
  // single_word: only when not inside a word.
  CHECK(t.encode("a cd b") == Ids{0, 3, 24, 3, 1});
  CHECK(t.encode("acd") == Ids{0, 2, 7});
  // match_special = false: specials are plain text (here: their bytes are not in the vocab).
  EncodeOptions no_special;
  no_special.match_special = false;
  CHECK(t.encode("b<s>b", no_special) == Ids{1, 1});
  CHECK(t.is_special(20));
  CHECK_FALSE(t.is_special(21));
  CHECK(t.decode(Ids{0, 20, 1}) == "a<s>b");
  CHECK(t.decode(Ids{0, 20, 1}, /*skip_special=*/true) == "ab");
  CHECK(t.decode(Ids{0, 999, -5, 1}) == "ab");  // unknown ids are skipped, as HF does
}

TEST_CASE("Split behaviors match HF SplitDelimiterBehavior") {
  const std::string text = "the-final--countdown";
  CHECK(split_tokenizer("Removed").pre_tokenize(text) == Pieces{"the", "final", "countdown"});
  CHECK(split_tokenizer("Isolated").pre_tokenize(text) == Pieces{"the", "-", "final", "-", "-", "countdown"});
  CHECK(split_tokenizer("MergedWithPrevious").pre_tokenize(text) == Pieces{"the-", "final-", "-", "countdown"});
  CHECK(split_tokenizer("MergedWithNext").pre_tokenize(text) == Pieces{"the", "-final", "-", "-countdown"});
  CHECK(split_tokenizer("Contiguous").pre_tokenize(text) == Pieces{"the", "-", "final", "--", "countdown"});
  CHECK(split_tokenizer("Removed", /*invert=*/true).pre_tokenize(text) == Pieces{"-", "-", "-"});
  CHECK(split_tokenizer("Isolated").pre_tokenize("") == Pieces{});
  CHECK_THROWS_AS(split_tokenizer("Sideways"), ep::Error);
}

TEST_CASE("GPT-2 and DeepSeek pre-tokenizer pieces") {
  const Tokenizer t = tiny();
  CHECK(t.pre_tokenize("Hello world's  end\n\n") == Pieces{"Hello", " world", "'s", " ", " end", "\n\n"});
  json j = tiny_json();
  json steps = json::array();
  for (const auto &s : ep::tokenizer::deepseek_v3_pre_tokenizer()) {
    if (s.kind == ep::tokenizer::PreTokenizerStep::Kind::split) {
      steps.push_back({{"type", "Split"}, {"pattern", {{"Regex", s.pattern}}}, {"behavior", "Isolated"}, {"invert", false}});
    } else {
      steps.push_back({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}});
    }
  }
  j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", steps}};
  const Tokenizer ds = Tokenizer::from_json_text(j.dump(), "ds.json");
  // Digits in runs of at most 3; CJK/kana runs isolated; punctuation + letters; look-ahead on spaces.
  CHECK(ds.pre_tokenize("1234567") == Pieces{"123", "456", "7"});
  CHECK(ds.pre_tokenize("ab我们cd") == Pieces{"ab", "我们", "cd"});
  CHECK(ds.pre_tokenize("x  y") == Pieces{"x", " ", " y"});
  CHECK(ds.pre_tokenize(".hello world!!\n") == Pieces{".hello", " world", "!!\n"});
}

TEST_CASE("ByteLevel add_prefix_space") {
  json j = tiny_json();
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  j["added_tokens"] = json::array();
  const Tokenizer t = Tokenizer::from_json_text(j.dump(), "prefix.json");
  // "ab" becomes " ab": Ġ a b; (a,b) has rank 0 < (Ġ,a) rank 2, so Ġ ab, and there is no "Ġ ab" merge.
  CHECK(t.encode("ab") == Ids{3, 4});
  CHECK(t.encode(" ab") == Ids{3, 4});  // no second space when the piece starts with one
  CHECK(t.pre_tokenize("c") == Pieces{" c"});
}

TEST_CASE("UTF-8: lossy decoding replaces maximal ill-formed subparts") {
  CHECK(lossy("abc") == "abc");
  CHECK(lossy("\xE4\xB8") == "\xEF\xBF\xBD");
  CHECK(lossy("\xE4\xB8" "A") == "\xEF\xBF\xBD" "A");
  CHECK(lossy("\xE4" "A") == "\xEF\xBF\xBD" "A");
  CHECK(lossy("\xED\xA0\x80") == "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  CHECK(lossy("\xC0\x80") == "\xEF\xBF\xBD\xEF\xBF\xBD");                  // overlong
  CHECK(lossy("\xF4\x90\x80\x80") == "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // > U+10FFFF
  CHECK(lossy("\xF0\x9F\x98\x80") == "\xF0\x9F\x98\x80");
  CHECK(lossy("\xF0\x9F\x98") == "\xEF\xBF\xBD");
  CHECK(lossy("\x80\x80") == "\xEF\xBF\xBD\xEF\xBF\xBD");
  CHECK(ep::tokenizer::utf8_first_invalid("ok\xFFno") == 2);
  CHECK(ep::tokenizer::utf8_first_invalid("\xE6\x88\x91") == 3);
}

TEST_CASE("streaming decode holds back incomplete UTF-8") {
  const Tokenizer t = tiny();
  json j = tiny_json();
  // Single-byte tokens for the three bytes of U+6211 (我 = E6 88 91).
  const std::string b1 = ep::tokenizer::bytes_to_byte_level("\xE6");
  const std::string b2 = ep::tokenizer::bytes_to_byte_level("\x88");
  const std::string b3 = ep::tokenizer::bytes_to_byte_level("\x91");
  j["model"]["vocab"][b1] = 30;
  j["model"]["vocab"][b2] = 31;
  j["model"]["vocab"][b3] = 32;
  const Tokenizer u = Tokenizer::from_json_text(j.dump(), "bytes.json");
  CHECK(u.encode("我a") == Ids{30, 31, 32, 0});
  StreamDecoder d(u);
  CHECK(d.push(0) == "a");
  CHECK(d.push(30).empty());
  CHECK(d.pending_bytes() == 1);
  CHECK(d.push(31).empty());
  CHECK(d.push(32) == "我");
  CHECK(d.pending_bytes() == 0);
  // An incomplete sequence followed by ASCII: replaced, like decode().
  CHECK(d.push(30).empty());
  CHECK(d.push(0) == "\xEF\xBF\xBD" "a");
  CHECK(d.push(30).empty());
  CHECK(d.finish() == "\xEF\xBF\xBD");
  CHECK(u.decode(Ids{30, 0, 30}) == "\xEF\xBF\xBD" "a" "\xEF\xBF\xBD");
  CHECK(d.push(20) == "<s>");
  StreamDecoder skip(u, /*skip_special=*/true);
  CHECK(skip.push(20).empty());
}

TEST_CASE("errors name the file and the problem") {
  {
    json j = tiny_json();
    j["model"]["merges"] = json::array({"a b", "a q"});
    const std::string msg = error_of([&] { Tokenizer::from_json_text(j.dump(), "bad-merge.json"); }, ep::Status::format);
    CHECK(msg.find("bad-merge.json") != std::string::npos);
    CHECK(msg.find("merge 1") != std::string::npos);
  }
  {
    json j = tiny_json();
    j["model"]["merges"] = json::array({"a b c"});
    const std::string msg = error_of([&] { Tokenizer::from_json_text(j.dump(), "m.json"); }, ep::Status::format);
    CHECK(msg.find("merge 0") != std::string::npos);
  }
  {
    json j = tiny_json();
    j["model"]["merges"] = json::array({"b a"});  // "ba" is not in the vocab
    const std::string msg = error_of([&] { Tokenizer::from_json_text(j.dump(), "m.json"); }, ep::Status::format);
    CHECK(msg.find("'ba'") != std::string::npos);
  }
  {
    json j = tiny_json();
    j["pre_tokenizer"] = {{"type", "Whitespace"}};
    const std::string msg = error_of([&] { Tokenizer::from_json_text(j.dump(), "ws.json"); }, ep::Status::unsupported);
    CHECK(msg.find("ws.json") != std::string::npos);
    CHECK(msg.find("Whitespace") != std::string::npos);
  }
  {
    json j = tiny_json();
    j["normalizer"] = {{"type", "NFC"}};
    const std::string msg = error_of([&] { Tokenizer::from_json_text(j.dump(), "nfc.json"); }, ep::Status::unsupported);
    CHECK(msg.find("NFC") != std::string::npos);
  }
  {
    json j = tiny_json();
    j["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers",
                           json::array({{{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}},
                                        {{"type", "ByteLevel"}, {"use_regex", false}}})}};
    const std::string msg = error_of([&] { Tokenizer::from_json_text(j.dump(), "re.json"); }, ep::Status::format);
    CHECK(msg.find("re.json") != std::string::npos);
  }
  {
    const std::string msg = error_of([&] { tiny().encode("ab\xFF"); }, ep::Status::invalid_argument);
    CHECK(msg.find("byte offset 2") != std::string::npos);
  }
  // Ids that are not integers in 0..2^24 (found by tokenizer_fuzz: a float id was converted with
  // undefined behaviour).
  for (const json &bad : {json(3.3e29), json(1.5), json(-1), json("7"), json(int64_t{1} << 40)}) {
    json j = tiny_json();
    j["model"]["vocab"]["a"] = bad;
    const std::string msg = error_of([&] { Tokenizer::from_json_text(j.dump(), "ids.json"); }, ep::Status::format);
    CHECK(msg.find("ids.json") != std::string::npos);
    CHECK(msg.find("vocab id") != std::string::npos);
  }
  error_of([&] { Tokenizer::from_json_text("{not json", "x.json"); }, ep::Status::format);
  error_of([&] { Tokenizer::from_file("/nonexistent/tokenizer.json"); }, ep::Status::not_found);
}

TEST_CASE("tiktoken rank files") {
  // Ranks: the 256 bytes, then "bc" 256, "ab" 257, "abc" 258.
  const auto dir = std::filesystem::temp_directory_path() / ("ep_tiktoken_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = (dir / "tiny.tiktoken").string();
  {
    static const char *b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    auto enc = [](const std::string &s) {
      std::string out;
      size_t i = 0;
      for (; i + 2 < s.size(); i += 3) {
        const uint32_t v = (uint8_t(s[i]) << 16) | (uint8_t(s[i + 1]) << 8) | uint8_t(s[i + 2]);
        for (int k = 18; k >= 0; k -= 6) out.push_back(b64[(v >> k) & 63]);
      }
      if (i + 1 == s.size()) {
        const uint32_t v = uint8_t(s[i]) << 16;
        out += {b64[(v >> 18) & 63], b64[(v >> 12) & 63], '=', '='};
      } else if (i + 2 == s.size()) {
        const uint32_t v = (uint8_t(s[i]) << 16) | (uint8_t(s[i + 1]) << 8);
        out += {b64[(v >> 18) & 63], b64[(v >> 12) & 63], b64[(v >> 6) & 63], '='};
      }
      return out;
    };
    std::ofstream f(path, std::ios::binary);
    for (int b = 0; b < 256; ++b) f << enc(std::string(1, static_cast<char>(b))) << ' ' << b << '\n';
    f << enc("bc") << " 256\n" << enc("ab") << " 257\n" << enc("abc") << " 258\n";
  }
  std::vector<AddedToken> specials{{"<|end|>", 300, true}};
  const Tokenizer t = Tokenizer::from_tiktoken_file(path, ep::tokenizer::kCl100kPattern, specials);
  CHECK(t.encode("abc") == Ids{258});             // whole piece is a rank
  CHECK(t.encode("abcd") == Ids{258, 'd'});       // bc (256) first, then a+bc = abc (258)
  CHECK(t.encode("ab<|end|>") == Ids{257, 300});
  CHECK(t.encode(" ab") == Ids{' ', 257});
  CHECK(t.decode(Ids{258, 300}) == "abc<|end|>");
  CHECK(t.vocab_size() == 301);
  {
    std::ofstream f(dir / "bad.tiktoken");
    f << "YQ== notanumber\n";
  }
  const std::string msg = error_of([&] { Tokenizer::from_tiktoken_file((dir / "bad.tiktoken").string(), "x"); },
                                   ep::Status::format);
  CHECK(msg.find("line 1") != std::string::npos);
  {  // a lone huge rank is a damaged file, not a 16M-entry table (found by tokenizer_fuzz)
    std::ofstream f(dir / "sparse.tiktoken");
    f << "YQ== 13666666\n";
  }
  const std::string sparse = error_of(
      [&] { Tokenizer::from_tiktoken_file((dir / "sparse.tiktoken").string(), "x"); }, ep::Status::format);
  CHECK(sparse.find("dense") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("GGUF vocabulary from plain vectors") {
  ep::tokenizer::GgufVocab v;
  v.tokens = {"a", "b", "c", "Ġ", "ab", "abc", "<|x|>", "[PAD7]"};
  v.token_types = {1, 1, 1, 1, 1, 1, 3, 5};
  v.merges = {"a b", "ab c"};
  v.pre = "gpt2";
  v.bos_id = 6;
  v.add_bos = true;
  const Tokenizer t = Tokenizer::from_gguf_vocab(v, "tiny.gguf");
  CHECK(t.encode("abc ab<|x|>") == Ids{5, 3, 4, 6});
  EncodeOptions with_bos;
  with_bos.add_special = true;
  CHECK(t.encode("c", with_bos) == Ids{6, 2});
  CHECK(t.is_special(6));
  CHECK(t.decode(Ids{5, 7, 6}) == "abc<|x|>");  // unused tokens decode to nothing
  v.pre = "no-such-pre";
  const std::string msg = error_of([&] { Tokenizer::from_gguf_vocab(v, "tiny.gguf"); }, ep::Status::unsupported);
  CHECK(msg.find("no-such-pre") != std::string::npos);
  v.pre = "deepseek-v3";
  CHECK(Tokenizer::from_gguf_vocab(v, "ds.gguf").encode("abc") == Ids{5});
  v.merges = {"a z"};
  error_of([&] { Tokenizer::from_gguf_vocab(v, "bad.gguf"); }, ep::Status::format);
}

TEST_CASE("post-processor template adds BOS only when asked") {
  json j = tiny_json();
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
      {"pair", json::array()},
      {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", json::array({20})}, {"tokens", json::array({"<s>"})}}}}}};
  const Tokenizer t = Tokenizer::from_json_text(j.dump(), "tpl.json");
  CHECK(t.encode("ab") == Ids{4});
  EncodeOptions o;
  o.add_special = true;
  CHECK(t.encode("ab", o) == Ids{20, 4});
}

TEST_CASE("regex: \\s means Unicode White_Space (as in Oniguruma and Rust regex), not PCRE2's \\h") {
  using ep::tokenizer::Regex;
  std::vector<std::pair<size_t, size_t>> m;
  Regex ws(R"(\s+)", "test");
  ws.find_all("a\u00a0\u3000b", m);
  CHECK(m == std::vector<std::pair<size_t, size_t>>{{1, 6}});
  ws.find_all("a\u180eb", m);  // U+180E is a format character since Unicode 6.3
  CHECK(m.empty());
  ws.find_all("a\u200bb", m);  // ZERO WIDTH SPACE is not White_Space either
  CHECK(m.empty());
  Regex not_ws(R"(\S+)", "test");
  not_ws.find_all(" \u180e ", m);
  CHECK(m == std::vector<std::pair<size_t, size_t>>{{1, 4}});
  Regex cls(R"([^\s\p{L}]+)", "test");
  cls.find_all("ab!?\u2009\u180e", m);
  CHECK(m == std::vector<std::pair<size_t, size_t>>{{2, 4}, {7, 10}});
  CHECK(ep::tokenizer::translate_pattern(R"(a\\s[]s\s])", "t") ==
        std::string(R"(a\\s[]s\t-\r\x{20}\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}])"));
  CHECK_THROWS_AS(ep::tokenizer::translate_pattern(R"([\S])", "t"), ep::Error);
  // Empty matches step one character and are reported once.
  Regex empty("x*", "test");
  empty.find_all("ab", m);
  CHECK(m.size() == 3);
}
