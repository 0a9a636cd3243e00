// libFuzzer target: the tokenizer. The first input byte picks what the rest is:
//   0: tokenizer.json text (HF): parsed; when it loads, a fixed text is encoded and decoded;
//   1: text encoded by a small DeepSeek-V3-style tokenizer.json tokenizer built here (its
//      pre-tokenizer, all 256 byte-level symbols, merges and added tokens): valid UTF-8 must
//      decode back to exactly itself (also streamed, and with special tokens not matched);
//      invalid UTF-8 must be refused with EP_ERR_INVALID_ARGUMENT;
//   2: a tiktoken rank file ("<base64> <rank>" lines): parsed; when it loads, a text is encoded;
//   3: text encoded by a small tiktoken tokenizer (Kimi's split pattern): round trip as in 1.
// Any ep::Error from parsing is a clean rejection; a crash, a sanitizer report, a broken round
// trip (__builtin_trap) or a huge allocation is a bug.
#include "core/error.hpp"
#include "tokenizer/tokenizer.hpp"

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

using ep::tokenizer::AddedToken;
using ep::tokenizer::EncodeOptions;
using ep::tokenizer::StreamDecoder;
using ep::tokenizer::Tokenizer;

namespace {

void append_utf8(std::string &out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

// GPT-2's bytes_to_unicode: the byte-level spelling of each byte.
std::vector<std::string> byte_level_symbols() {
  std::vector<std::string> sym(256);
  uint32_t extra = 0;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    append_utf8(sym[b], printable ? b : 256 + extra++);
  }
  return sym;
}

const Tokenizer &json_tokenizer() {
  static const Tokenizer t = [] {
    const auto sym = byte_level_symbols();
    nlohmann::json vocab = nlohmann::json::object();
    for (int b = 0; b < 256; ++b) vocab[sym[b]] = b;
    // Merges over common pairs, including multi-byte UTF-8 and a space prefix.
    const std::vector<std::pair<std::string, std::string>> pairs = {
        {sym['t'], sym['h']}, {sym['t'] + sym['h'], sym['e']}, {sym[' '], sym['t']}, {sym[' '], sym['a']},
        {sym['i'], sym['n']}, {sym['e'], sym['r']},           {sym['1'], sym['2']}, {sym[0xe4], sym[0xb8]},
        {sym[0xe4] + sym[0xb8], sym[0x80]},                     {sym['\n'], sym['\n']}};
    nlohmann::json merges = nlohmann::json::array();
    int id = 256;
    for (const auto &[a, b] : pairs) {
      merges.push_back(a + " " + b);
      vocab[a + b] = id++;
    }
    nlohmann::json j;
    j["version"] = "1.0";
    j["normalizer"] = {{"type", "Sequence"}, {"normalizers", nlohmann::json::array()}};
    nlohmann::json splits = nlohmann::json::array();
    for (const char *re : {"\\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
                           "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
                           "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"})
      splits.push_back({{"type", "Split"}, {"pattern", {{"Regex", re}}}, {"behavior", "Isolated"}, {"invert", false}});
    splits.push_back({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}});
    j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", splits}};
    j["post_processor"] = nullptr;
    j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
    j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"byte_fallback", false}};
    j["added_tokens"] = nlohmann::json::array(
        {{{"id", 300}, {"content", "<|begin|>"}, {"special", true}, {"normalized", false}, {"lstrip", false},
          {"rstrip", false}, {"single_word", false}},
         {{"id", 301}, {"content", "<think>"}, {"special", false}, {"normalized", false}, {"lstrip", false},
          {"rstrip", false}, {"single_word", false}}});
    return Tokenizer::from_json_text(j.dump(), "fuzz-tiny.json");
  }();
  return t;
}

const Tokenizer &tiktoken_tokenizer() {
  static const Tokenizer t = [] {
    std::vector<std::string> ranks;
    for (int b = 0; b < 256; ++b) ranks.emplace_back(1, static_cast<char>(b));
    for (const char *m : {"th", "the", " t", "in", "er", "12", "\xe4\xb8", "\xe4\xb8\x80"}) ranks.emplace_back(m);
    std::vector<AddedToken> specials{{"<|im_end|>", 300, true}};
    return Tokenizer::from_tiktoken_ranks(std::move(ranks), ep::tokenizer::kKimiPattern, std::move(specials),
                                          "fuzz-tiny.tiktoken");
  }();
  return t;
}

// Encode → decode must give the text back; streaming must agree; an error must be
// EP_ERR_INVALID_ARGUMENT (invalid UTF-8).
void round_trip(const Tokenizer &t, std::string_view text) {
  for (const bool match_special : {true, false}) {
    EncodeOptions o;
    o.match_special = match_special;
    std::vector<int32_t> ids;
    try {
      ids = t.encode(text, o);
    } catch (const ep::Error &e) {
      if (e.status() != ep::Status::invalid_argument) __builtin_trap();
      return;
    }
    const std::string back = t.decode(ids);
    if (back != text) __builtin_trap();
    StreamDecoder d(t);
    std::string streamed;
    for (int32_t id : ids) streamed += d.push(id);
    streamed += d.finish();
    if (streamed != back) __builtin_trap();
  }
}

std::string temp_path() {
  return "/tmp/ep-tokenizer-fuzz-" + std::to_string(::getpid()) + ".tiktoken";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char *>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0:
      try {
        const Tokenizer t = Tokenizer::from_json_text(rest, "fuzz.json");
        const auto ids = t.encode("the 12 ab <s>x\n\xe4\xb8\x80!");
        (void)t.decode(ids);
        (void)t.describe();
      } catch (const ep::Error &) {
      }
      break;
    case 1:
      round_trip(json_tokenizer(), rest);
      break;
    case 2: {  // any rank may appear: the loader refuses ranks far beyond the entries (no huge table)
      const std::string path = temp_path();
      if (FILE *f = std::fopen(path.c_str(), "wb")) {
        std::fwrite(rest.data(), 1, rest.size(), f);
        std::fclose(f);
        try {
          const Tokenizer t = Tokenizer::from_tiktoken_file(path, ep::tokenizer::kCl100kPattern);
          (void)t.decode(t.encode("the 12 ab\n"));
        } catch (const ep::Error &) {
        }
        std::remove(path.c_str());
      }
      break;
    }
    default:
      round_trip(tiktoken_tokenizer(), rest);
      break;
  }
  return 0;
}
