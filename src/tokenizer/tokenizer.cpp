#include "tokenizer/tokenizer.hpp"

#include "core/error.hpp"
#include "core/log.hpp"
#include "format/file_format.hpp"
#include "tokenizer/bpe.hpp"
#include "tokenizer/regex.hpp"
#include "tokenizer/utf8.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <sstream>
#include <tuple>
#include <unordered_map>

namespace ep::tokenizer {

using json = nlohmann::json;

/// A token id read from JSON: an integer in [0, 2^24]; anything else (a float, a string, a huge
/// or negative number) is Status::format naming the file and the field.
static int32_t json_token_id(const json &v, const std::string &origin, const char *what) {
  constexpr int64_t kMaxTokenId = int64_t{1} << 24;
  const bool ok = v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(kMaxTokenId)
                  : v.is_number_integer() ? v.get<int64_t>() >= 0 && v.get<int64_t>() <= kMaxTokenId
                                          : false;
  if (!ok) fail(Status::format, "{}: {} {} is not an integer in 0..{}", origin, what, v.dump(), kMaxTokenId);
  return static_cast<int32_t>(v.get<int64_t>());
}

const char *const kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

const char *const kCl100kPattern =
    R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)";

const char *const kKimiPattern =
    R"([\p{Han}]+)"
    R"(|[^\r\n\p{L}\p{N}]?(?:(?!\p{Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])*(?:(?!\p{Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}])+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?(?:(?!\p{Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])+(?:(?!\p{Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}])*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*)"
    R"(|\s*[\r\n]+)"
    R"(|\s+(?!\S))"
    R"(|\s+)";

namespace {

PreTokenizerStep split_step(std::string pattern, SplitBehavior behavior = SplitBehavior::isolated, bool invert = false) {
  PreTokenizerStep s;
  s.kind = PreTokenizerStep::Kind::split;
  s.pattern = std::move(pattern);
  s.behavior = behavior;
  s.invert = invert;
  return s;
}

PreTokenizerStep byte_level_step(bool add_prefix_space, bool use_regex) {
  PreTokenizerStep s;
  s.kind = PreTokenizerStep::Kind::byte_level;
  s.add_prefix_space = add_prefix_space;
  s.use_regex = use_regex;
  return s;
}

}  // namespace

std::vector<PreTokenizerStep> deepseek_v3_pre_tokenizer() {
  return {
      split_step(R"(\p{N}{1,3})"),
      split_step("[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"),
      split_step(R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^)"
                 "\r\n"
                 R"(\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[)"
                 "\r\n"
                 R"(]*|\s*[)"
                 "\r\n"
                 R"(]+|\s+(?!\S)|\s+)"),
      byte_level_step(false, false),
  };
}

std::vector<PreTokenizerStep> pre_tokenizer_for_gguf_pre(std::string_view pre, std::string_view origin) {
  // llama.cpp llama-vocab.cpp: these pre names share the DeepSeek-V3 regex set.
  if (pre == "deepseek-v3" || pre == "joyai-llm" || pre == "deepseek4" || pre == "hunyuan-dense") {
    return deepseek_v3_pre_tokenizer();
  }
  if (pre == "gpt2" || pre == "default" || pre.empty()) return {byte_level_step(false, true)};
  if (pre == "llama3" || pre == "llama-bpe") {
    return {split_step(R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"),
            byte_level_step(false, false)};
  }
  if (pre == "kimi-k2") return {split_step(kKimiPattern), byte_level_step(false, false)};
  fail(Status::unsupported, "{}: tokenizer.ggml.pre '{}' is not supported (known: deepseek-v3, joyai-llm, deepseek4, "
       "hunyuan-dense, gpt2, default, llama3, llama-bpe, kimi-k2)", origin, pre);
}

namespace {

// ---- added-token matcher (leftmost-longest, like aho-corasick MatchKind::LeftmostLongest) ----
class TokenTrie {
 public:
  void add(std::string_view s, int32_t index) {
    int32_t node = 0;
    if (nodes_.empty()) nodes_.emplace_back();
    if (!s.empty()) first_[static_cast<uint8_t>(s[0])] = true;
    for (char c : s) {
      const auto b = static_cast<uint8_t>(c);
      int32_t child = find_child(node, b);
      if (child < 0) {
        child = static_cast<int32_t>(nodes_.size());
        nodes_[node].children.emplace_back(b, child);
        nodes_.emplace_back();
      }
      node = child;
    }
    if (nodes_[node].index < 0) nodes_[node].index = index;
  }
  bool empty() const noexcept { return nodes_.size() <= 1; }
  // Longest token starting at pos: returns its index and sets len, or -1.
  int32_t longest_at(std::string_view text, size_t pos, size_t &len) const noexcept {
    if (!first_[static_cast<uint8_t>(text[pos])]) return -1;
    int32_t node = 0;
    int32_t best = -1;
    for (size_t i = pos; i < text.size(); ++i) {
      node = find_child(node, static_cast<uint8_t>(text[i]));
      if (node < 0) break;
      if (nodes_[node].index >= 0) {
        best = nodes_[node].index;
        len = i + 1 - pos;
      }
    }
    return best;
  }

 private:
  struct Node {
    int32_t index = -1;
    std::vector<std::pair<uint8_t, int32_t>> children;
  };
  int32_t find_child(int32_t node, uint8_t b) const noexcept {
    for (const auto &[c, child] : nodes_[node].children) {
      if (c == b) return child;
    }
    return -1;
  }
  std::vector<Node> nodes_;
  std::array<bool, 256> first_{};
};

struct CompiledStep {
  PreTokenizerStep step;
  std::unique_ptr<Regex> regex;  // split pattern, or the GPT-2 pattern for ByteLevel use_regex
};

std::string read_file(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(Status::not_found, "{}: cannot open tokenizer file: {}", path, std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail(Status::io, "{}: read failed", path);
  return ss.str();
}

}  // namespace

// A bounded cache piece bytes -> ids, shared by all threads that use one Tokenizer (as HF's BPE
// cache). Sharded, each shard behind a shared_mutex; once a shard is full nothing more is added.
class WordCache {
 public:
  static constexpr size_t kShards = 16;
  static constexpr size_t kMaxPerShard = 8192;
  static constexpr size_t kMaxPieceBytes = 64;

  bool get(std::string_view piece, std::vector<int32_t> &out) const {
    const Shard &sh = shards_[std::hash<std::string_view>{}(piece) % kShards];
    std::shared_lock lock(sh.mutex);
    auto it = sh.map.find(piece);
    if (it == sh.map.end()) return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
  }
  void put(std::string_view piece, const int32_t *ids, size_t n) {
    Shard &sh = shards_[std::hash<std::string_view>{}(piece) % kShards];
    std::unique_lock lock(sh.mutex);
    if (sh.map.size() >= kMaxPerShard) return;
    sh.map.emplace(std::string(piece), std::vector<int32_t>(ids, ids + n));
  }

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s) * 31 + 7; }
  };
  struct Shard {
    mutable std::shared_mutex mutex;
    std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> map;
  };
  std::array<Shard, kShards> shards_;
};

struct Tokenizer::Impl {
  mutable WordCache cache;
  std::string origin;
  std::string kind;  // "tokenizer.json", "tiktoken", "gguf"
  // id -> bytes emitted by decode; id_kind: 0 hole, 1 vocab, 2 special added, 3 non-special added
  std::vector<std::string> id_bytes;
  std::vector<uint8_t> id_kind;
  std::unordered_map<std::string, int32_t> spelling_to_id;
  std::unordered_map<std::string, int32_t> bytes_to_id;  // only with ignore_merges
  MergeTable merges;
  std::array<int32_t, 256> byte_ids{};
  int32_t unk_id = -1;
  bool ignore_merges = false;
  std::vector<AddedToken> added;
  TokenTrie trie_raw;         // added tokens with normalized=false
  TokenTrie trie_normalized;  // added tokens with normalized=true
  bool have_single_word = false;
  std::unique_ptr<Regex> word_char;
  std::vector<CompiledStep> steps;
  std::vector<int32_t> special_prefix;
  std::vector<int32_t> special_suffix;
  std::optional<int32_t> bos;
  std::optional<int32_t> eos;
  size_t merge_count = 0;

  void set_id(int32_t id, std::string bytes, uint8_t k) {
    if (id < 0) fail(Status::format, "{}: negative token id {}", origin, id);
    if (static_cast<size_t>(id) >= id_bytes.size()) {
      id_bytes.resize(static_cast<size_t>(id) + 1);
      id_kind.resize(static_cast<size_t>(id) + 1, 0);
    }
    id_bytes[id] = std::move(bytes);
    id_kind[id] = k;
  }

  void compile_steps(const std::vector<PreTokenizerStep> &in) {
    for (const PreTokenizerStep &s : in) {
      CompiledStep c{s, nullptr};
      if (s.kind == PreTokenizerStep::Kind::split) {
        c.regex = std::make_unique<Regex>(s.pattern, origin);
      } else if (s.use_regex) {
        c.regex = std::make_unique<Regex>(kGpt2Pattern, origin);
      }
      steps.push_back(std::move(c));
    }
  }

  void finish_added() {
    for (size_t i = 0; i < added.size(); ++i) {
      const AddedToken &t = added[i];
      if (t.content.empty()) fail(Status::format, "{}: added token id {} has empty content", origin, t.id);
      if (t.normalized) {
        trie_normalized.add(t.content, static_cast<int32_t>(i));
      } else {
        trie_raw.add(t.content, static_cast<int32_t>(i));
      }
      if (t.single_word) have_single_word = true;
      spelling_to_id[t.content] = t.id;
    }
    if (have_single_word) word_char = std::make_unique<Regex>(R"([\p{L}\p{N}_])", origin);
  }

  void finish_byte_ids(bool byte_level_spelling) {
    byte_ids.fill(-1);
    const auto &table = byte_to_unicode();
    int missing = 0;
    for (int b = 0; b < 256; ++b) {
      std::string key;
      if (byte_level_spelling) {
        utf8_append(key, table[b]);
      } else {
        key.push_back(static_cast<char>(b));
      }
      auto it = (byte_level_spelling ? spelling_to_id : bytes_to_id).find(key);
      if (it != (byte_level_spelling ? spelling_to_id : bytes_to_id).end()) {
        byte_ids[b] = it->second;
      } else {
        ++missing;
      }
    }
    if (missing > 0) {
      log::warn("{}: {} of the 256 byte tokens are missing from the vocabulary; such bytes are {}", origin, missing,
                unk_id >= 0 ? "encoded as the unk token" : "dropped (as HF tokenizers does without unk_token)");
    }
  }

  bool is_word_char_at_end(std::string_view s) const {
    if (s.empty()) return false;
    size_t p = s.size() - 1;
    while (p > 0 && (static_cast<uint8_t>(s[p]) & 0xC0) == 0x80) --p;
    std::vector<std::pair<size_t, size_t>> m;
    word_char->find_all(s.substr(p), m);
    return !m.empty();
  }
  bool is_word_char_at_start(std::string_view s) const {
    if (s.empty()) return false;
    size_t p = 0;
    utf8_next(s, p);
    std::vector<std::pair<size_t, size_t>> m;
    word_char->find_all(s.substr(0, p), m);
    return !m.empty();
  }

  // Splits `text` by the added tokens of `trie`; calls on_text(piece) / on_token(id) in order.
  template <typename OnText, typename OnToken>
  void split_added(std::string_view text, const TokenTrie &trie, bool match_special, OnText &&on_text,
                   OnToken &&on_token) const {
    if (trie.empty()) {
      if (!text.empty()) on_text(text);
      return;
    }
    size_t start_offset = 0;
    size_t pos = 0;
    while (pos < text.size()) {
      size_t len = 0;
      const int32_t index = trie.longest_at(text, pos, len);
      if (index < 0) {
        ++pos;
        continue;
      }
      const AddedToken &t = added[index];
      size_t start = pos;
      size_t stop = pos + len;
      // A rejected match is skipped whole: aho-corasick's find_iter resumes after it.
      if (!match_special && t.special) {
        pos = stop;
        continue;
      }
      if (t.single_word) {
        const bool start_space = start == 0 || !is_word_char_at_end(text.substr(0, start));
        const bool stop_space = stop == text.size() || !is_word_char_at_start(text.substr(stop));
        if (!start_space || !stop_space) {
          pos = stop;
          continue;
        }
      }
      if (t.lstrip) {
        size_t s = start;
        while (s > start_offset) {
          size_t q = s - 1;
          while (q > start_offset && (static_cast<uint8_t>(text[q]) & 0xC0) == 0x80) --q;
          size_t qq = q;
          if (!is_unicode_whitespace(utf8_next(text, qq))) break;
          s = q;
        }
        start = s;
      }
      if (t.rstrip) {
        while (stop < text.size()) {
          size_t q = stop;
          if (!is_unicode_whitespace(utf8_next(text, q))) break;
          stop = q;
        }
      }
      if (start_offset < start) on_text(text.substr(start_offset, start - start_offset));
      on_token(t.id);
      start_offset = stop;
      pos = stop;
    }
    if (start_offset < text.size()) on_text(text.substr(start_offset));
  }

  struct Scratch {
    BpeScratch bpe;
    RegexScratch regex;
    std::vector<std::string_view> pieces;
    std::vector<std::string_view> next;
    std::deque<std::string> storage;
    std::vector<std::pair<size_t, size_t>> matches;
    struct Seg {
      size_t b, e;
      bool match;
    };
    std::vector<Seg> segs;
  };

  void split_piece(const CompiledStep &c, std::string_view piece, Scratch &s, std::vector<std::string_view> &out,
                   SplitBehavior behavior, bool invert) const {
    c.regex->find_all(piece, s.matches, s.regex);
    auto &segs = s.segs;
    segs.clear();
    size_t prev = 0;
    for (const auto &[b, e] : s.matches) {
      if (prev != b) segs.push_back({prev, b, invert});
      segs.push_back({b, e, !invert});
      prev = e;
    }
    if (prev != piece.size()) segs.push_back({prev, piece.size(), invert});

    auto emit = [&](size_t b, size_t e) {
      if (e > b) out.push_back(piece.substr(b, e - b));
    };
    switch (behavior) {
      case SplitBehavior::removed:
        for (const auto &g : segs) {
          if (!g.match) emit(g.b, g.e);
        }
        break;
      case SplitBehavior::isolated:
        for (const auto &g : segs) emit(g.b, g.e);
        break;
      case SplitBehavior::merged_with_previous:
      case SplitBehavior::contiguous: {
        std::vector<std::pair<size_t, size_t>> acc;
        bool previous_match = false;
        for (const auto &g : segs) {
          const bool join = behavior == SplitBehavior::contiguous ? (g.match == previous_match)
                                                                  : (g.match && !previous_match);
          if (join && !acc.empty()) {
            acc.back().second = g.e;
          } else {
            acc.emplace_back(g.b, g.e);
          }
          previous_match = g.match;
        }
        for (const auto &[b, e] : acc) emit(b, e);
        break;
      }
      case SplitBehavior::merged_with_next: {
        std::vector<std::pair<size_t, size_t>> acc;
        bool previous_match = false;
        for (auto it = segs.rbegin(); it != segs.rend(); ++it) {
          if (it->match && !previous_match && !acc.empty()) {
            acc.back().first = it->b;
          } else {
            acc.emplace_back(it->b, it->e);
          }
          previous_match = it->match;
        }
        for (auto it = acc.rbegin(); it != acc.rend(); ++it) emit(it->first, it->second);
        break;
      }
    }
  }

  // Runs the pre-tokenizer steps on one text segment; the pieces end up in s.pieces.
  void pre_tokenize_text(std::string_view text, Scratch &s) const {
    auto &pieces = s.pieces;
    pieces.clear();
    pieces.push_back(text);
    for (const CompiledStep &c : steps) {
      s.next.clear();
      for (std::string_view piece : pieces) {
        if (c.step.kind == PreTokenizerStep::Kind::split) {
          split_piece(c, piece, s, s.next, c.step.behavior, c.step.invert);
        } else {
          if (c.step.add_prefix_space && (piece.empty() || piece[0] != ' ')) {
            std::string prefixed;
            prefixed.reserve(piece.size() + 1);
            prefixed.push_back(' ');
            prefixed.append(piece);
            s.storage.push_back(std::move(prefixed));
            piece = s.storage.back();
          }
          if (c.step.use_regex) {
            split_piece(c, piece, s, s.next, SplitBehavior::isolated, false);
          } else if (!piece.empty()) {
            s.next.push_back(piece);
          }
        }
      }
      std::swap(pieces, s.next);
    }
  }

  void encode_text(std::string_view text, Scratch &s, std::vector<int32_t> &out, bool use_cache) const {
    pre_tokenize_text(text, s);
    for (std::string_view piece : s.pieces) {
      if (piece.size() == 1 && byte_ids[static_cast<uint8_t>(piece[0])] >= 0) {
        out.push_back(byte_ids[static_cast<uint8_t>(piece[0])]);
        continue;
      }
      const bool cacheable = use_cache && piece.size() <= WordCache::kMaxPieceBytes;
      if (cacheable && cache.get(piece, out)) continue;
      const size_t before = out.size();
      encode_piece(piece, s, out);
      if (cacheable) cache.put(piece, out.data() + before, out.size() - before);
    }
  }

  void encode_piece(std::string_view piece, Scratch &s, std::vector<int32_t> &out) const {
    if (ignore_merges) {
      auto it = bytes_to_id.find(std::string(piece));
      if (it != bytes_to_id.end()) {
        out.push_back(it->second);
        return;
      }
    }
    bpe_merge(piece, byte_ids, merges, unk_id, s.bpe, out);
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer &&) noexcept = default;
Tokenizer &Tokenizer::operator=(Tokenizer &&) noexcept = default;
Tokenizer::~Tokenizer() = default;

// ---- tokenizer.json ------------------------------------------------------------------------

namespace {

SplitBehavior parse_behavior(const json &j, const std::string &origin) {
  const std::string b = j.is_string() ? j.get<std::string>() : std::string("<not a string>");
  if (b == "Isolated") return SplitBehavior::isolated;
  if (b == "Removed") return SplitBehavior::removed;
  if (b == "MergedWithPrevious") return SplitBehavior::merged_with_previous;
  if (b == "MergedWithNext") return SplitBehavior::merged_with_next;
  if (b == "Contiguous") return SplitBehavior::contiguous;
  fail(Status::format, "{}: pre_tokenizer Split has unknown behavior '{}'", origin, b);
}

std::string escape_regex_literal(const std::string &s) {
  std::string out;
  for (char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

void parse_pre_tokenizer(const json &j, const std::string &origin, std::vector<PreTokenizerStep> &out) {
  if (j.is_null()) return;
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const json &p : j.at("pretokenizers")) parse_pre_tokenizer(p, origin, out);
  } else if (type == "Split") {
    const json &pat = j.at("pattern");
    std::string pattern;
    if (pat.contains("Regex")) {
      pattern = pat.at("Regex").get<std::string>();
    } else if (pat.contains("String")) {
      pattern = escape_regex_literal(pat.at("String").get<std::string>());
    } else {
      fail(Status::format, "{}: pre_tokenizer Split pattern has neither Regex nor String: {}", origin, pat.dump());
    }
    out.push_back(split_step(std::move(pattern), parse_behavior(j.at("behavior"), origin), j.value("invert", false)));
  } else if (type == "ByteLevel") {
    out.push_back(byte_level_step(j.value("add_prefix_space", false), j.value("use_regex", true)));
  } else {
    fail(Status::unsupported, "{}: pre_tokenizer type '{}' is not supported (supported: Sequence, Split, ByteLevel)",
         origin, type);
  }
}

void check_normalizer(const json &j, const std::string &origin) {
  if (j.is_null()) return;
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const json &n : j.at("normalizers")) check_normalizer(n, origin);
    return;
  }
  fail(Status::unsupported, "{}: normalizer type '{}' is not supported (only none or an empty Sequence)", origin, type);
}

void check_decoder(const json &j, const std::string &origin) {
  if (j.is_null()) return;
  const std::string type = j.value("type", "");
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    for (const json &d : j.at("decoders")) check_decoder(d, origin);
    return;
  }
  fail(Status::unsupported, "{}: decoder type '{}' is not supported (only ByteLevel)", origin, type);
}

// TemplateProcessing "single": special ids before and after $A.
void parse_post_processor(const json &j, const std::string &origin, std::vector<int32_t> &prefix,
                          std::vector<int32_t> &suffix) {
  if (j.is_null()) return;
  const std::string type = j.value("type", "");
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    for (const json &p : j.at("processors")) parse_post_processor(p, origin, prefix, suffix);
    return;
  }
  if (type != "TemplateProcessing") {
    fail(Status::unsupported, "{}: post_processor type '{}' is not supported (ByteLevel, TemplateProcessing, Sequence)",
         origin, type);
  }
  const json &specials = j.at("special_tokens");
  bool seen_a = false;
  for (const json &piece : j.at("single")) {
    if (piece.contains("Sequence")) {
      seen_a = true;
    } else if (piece.contains("SpecialToken")) {
      const std::string name = piece["SpecialToken"].at("id").get<std::string>();
      if (!specials.contains(name)) {
        fail(Status::format, "{}: post_processor template names special token '{}' not in special_tokens", origin, name);
      }
      for (const json &id : specials[name].at("ids")) (seen_a ? suffix : prefix).push_back(json_token_id(id, origin, "post_processor id"));
    }
  }
}

std::string token_content(const json &j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content")) return j["content"].get<std::string>();
  return {};
}

}  // namespace

Tokenizer Tokenizer::from_json_file(const std::string &path) {
  Tokenizer t = from_json_text(read_file(path), path);
  // tokenizer_config.json beside it: add_bos_token / add_eos_token (transformers semantics).
  const std::filesystem::path cfg_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (std::filesystem::exists(cfg_path, ec)) {
    const json cfg = json::parse(read_file(cfg_path.string()), nullptr, false);
    if (cfg.is_discarded()) fail(Status::format, "{}: not valid JSON", cfg_path.string());
    Impl &m = *t.impl_;
    auto id_of = [&](const char *key) -> std::optional<int32_t> {
      if (!cfg.contains(key)) return std::nullopt;
      const std::string content = token_content(cfg[key]);
      if (content.empty()) return std::nullopt;
      auto it = m.spelling_to_id.find(content);
      if (it == m.spelling_to_id.end()) {
        fail(Status::format, "{}: {} '{}' is not a token of {}", cfg_path.string(), key, content, path);
      }
      return it->second;
    };
    if (auto b = id_of("bos_token")) m.bos = b;
    if (auto e = id_of("eos_token")) m.eos = e;
    const bool has_bos_flag = cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean();
    const bool has_eos_flag = cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean();
    if (has_bos_flag || has_eos_flag) {
      m.special_prefix.clear();
      m.special_suffix.clear();
      if (has_bos_flag && cfg["add_bos_token"].get<bool>() && m.bos) m.special_prefix.push_back(*m.bos);
      if (has_eos_flag && cfg["add_eos_token"].get<bool>() && m.eos) m.special_suffix.push_back(*m.eos);
    }
  }
  return t;
}

Tokenizer Tokenizer::from_json_text(std::string_view json_text, const std::string &origin) {
  const json j = json::parse(json_text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) fail(Status::format, "{}: not a valid JSON object", origin);
  auto m = std::make_unique<Impl>();
  m->origin = origin;
  m->kind = "tokenizer.json";
  try {
    if (!j.contains("model")) fail(Status::format, "{}: no \"model\" section", origin);
    const json &model = j["model"];
    const std::string type = model.value("type", "BPE");
    if (type != "BPE") fail(Status::unsupported, "{}: model type '{}' is not supported (only BPE)", origin, type);
    if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"].get<double>() != 0.0) {
      fail(Status::unsupported, "{}: BPE dropout is not supported", origin);
    }
    for (const char *key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (model.contains(key) && !model[key].is_null() && !model[key].get<std::string>().empty()) {
        fail(Status::unsupported, "{}: BPE {} is not supported", origin, key);
      }
    }
    if (model.value("byte_fallback", false)) fail(Status::unsupported, "{}: BPE byte_fallback is not supported", origin);
    m->ignore_merges = model.value("ignore_merges", false);
    check_normalizer(j.value("normalizer", json()), origin);
    check_decoder(j.value("decoder", json()), origin);

    std::vector<PreTokenizerStep> steps;
    parse_pre_tokenizer(j.value("pre_tokenizer", json()), origin, steps);
    if (std::none_of(steps.begin(), steps.end(),
                     [](const PreTokenizerStep &s) { return s.kind == PreTokenizerStep::Kind::byte_level; })) {
      fail(Status::unsupported, "{}: only byte-level BPE is supported, but the pre_tokenizer has no ByteLevel step",
           origin);
    }
    m->compile_steps(steps);

    const json &vocab = model.at("vocab");
    if (!vocab.is_object()) fail(Status::format, "{}: model.vocab is not an object", origin);
    m->spelling_to_id.reserve(vocab.size() * 2);
    std::string bytes;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      const int32_t id = json_token_id(it.value(), origin, "vocab id");
      const std::string &spelling = it.key();
      if (!byte_level_to_bytes(spelling, bytes)) bytes = spelling;
      m->set_id(id, bytes, 1);
      m->spelling_to_id.emplace(spelling, id);
      if (m->ignore_merges) m->bytes_to_id.emplace(bytes, id);
    }
    if (model.contains("unk_token") && model["unk_token"].is_string()) {
      auto it = m->spelling_to_id.find(model["unk_token"].get<std::string>());
      if (it == m->spelling_to_id.end()) fail(Status::format, "{}: unk_token is not in the vocab", origin);
      m->unk_id = it->second;
    }

    const json &merges = model.at("merges");
    m->merges.reserve(merges.size());
    int32_t rank = 0;
    for (const json &mj : merges) {
      std::string a, b;
      if (mj.is_string()) {
        const std::string s = mj.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
          fail(Status::format, "{}: merge {} '{}' is not two tokens separated by one space", origin, rank, s);
        }
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (mj.is_array() && mj.size() == 2 && mj[0].is_string() && mj[1].is_string()) {
        a = mj[0].get<std::string>();
        b = mj[1].get<std::string>();
      } else {
        fail(Status::format, "{}: merge {} is neither \"a b\" nor [\"a\", \"b\"]: {}", origin, rank, mj.dump());
      }
      auto ia = m->spelling_to_id.find(a);
      auto ib = m->spelling_to_id.find(b);
      auto iab = m->spelling_to_id.find(a + b);
      if (ia == m->spelling_to_id.end() || ib == m->spelling_to_id.end()) {
        fail(Status::format, "{}: merge {} '{} {}' uses a token that is not in the vocab", origin, rank, a, b);
      }
      if (iab == m->spelling_to_id.end()) {
        fail(Status::format, "{}: merge {} '{} {}' produces '{}', which is not in the vocab", origin, rank, a, b, a + b);
      }
      m->merges.insert(ia->second, ib->second, rank, iab->second);
      ++rank;
    }
    m->merge_count = static_cast<size_t>(rank);

    for (const json &a : j.value("added_tokens", json::array())) {
      AddedToken t;
      t.id = json_token_id(a.at("id"), origin, "added_tokens id");
      t.content = a.at("content").get<std::string>();
      t.special = a.value("special", false);
      t.lstrip = a.value("lstrip", false);
      t.rstrip = a.value("rstrip", false);
      t.single_word = a.value("single_word", false);
      t.normalized = a.value("normalized", !t.special);
      std::string tb;
      if (!byte_level_to_bytes(t.content, tb)) tb = t.content;
      m->set_id(t.id, tb, t.special ? 2 : 3);
      m->added.push_back(std::move(t));
    }
    m->finish_added();
    m->finish_byte_ids(true);
    parse_post_processor(j.value("post_processor", json()), origin, m->special_prefix, m->special_suffix);
  } catch (const json::exception &e) {
    fail(Status::format, "{}: unexpected tokenizer.json structure: {}", origin, e.what());
  }
  return Tokenizer(std::move(m));
}

// ---- tiktoken -------------------------------------------------------------------------------

namespace {

bool base64_decode(std::string_view in, std::string &out) {
  out.clear();
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    int v;
    if (c >= 'A' && c <= 'Z') v = c - 'A';
    else if (c >= 'a' && c <= 'z') v = c - 'a' + 26;
    else if (c >= '0' && c <= '9') v = c - '0' + 52;
    else if (c == '+' || c == '-') v = 62;
    else if (c == '/' || c == '_') v = 63;
    else if (c == '=') break;
    else return false;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  return true;
}

}  // namespace

Tokenizer Tokenizer::from_tiktoken_ranks(std::vector<std::string> ranks, const std::string &pattern,
                                         std::vector<AddedToken> specials, const std::string &origin) {
  auto m = std::make_unique<Impl>();
  m->origin = origin;
  m->kind = "tiktoken";
  m->ignore_merges = true;  // tiktoken looks a whole piece up before merging
  // tiktoken drops the text between matches: Split(pattern, invert) + Removed keeps only matches.
  m->compile_steps({split_step(pattern, SplitBehavior::removed, true)});
  m->bytes_to_id.reserve(ranks.size() * 2);
  for (size_t id = 0; id < ranks.size(); ++id) {
    if (ranks[id].empty()) continue;
    auto [it, inserted] = m->bytes_to_id.emplace(ranks[id], static_cast<int32_t>(id));
    if (!inserted) fail(Status::format, "{}: ranks {} and {} have the same bytes", origin, it->second, id);
    m->spelling_to_id.emplace(ranks[id], static_cast<int32_t>(id));
    m->set_id(static_cast<int32_t>(id), ranks[id], 1);
  }
  // tiktoken merges the adjacent pair whose concatenation has the lowest rank: every split of a
  // token into two tokens is a merge with the rank of the token.
  m->merges.reserve(ranks.size() * 4);
  for (size_t id = 0; id < ranks.size(); ++id) {
    const std::string &tok = ranks[id];
    for (size_t cut = 1; cut < tok.size(); ++cut) {
      auto l = m->bytes_to_id.find(tok.substr(0, cut));
      if (l == m->bytes_to_id.end()) continue;
      auto r = m->bytes_to_id.find(tok.substr(cut));
      if (r == m->bytes_to_id.end()) continue;
      m->merges.insert(l->second, r->second, static_cast<int32_t>(id), static_cast<int32_t>(id));
    }
  }
  m->merge_count = m->merges.size();
  for (AddedToken &t : specials) {
    if (static_cast<size_t>(t.id) < m->id_kind.size() && m->id_kind[t.id] == 1) {
      fail(Status::format, "{}: special token '{}' id {} collides with a rank", origin, t.content, t.id);
    }
    m->set_id(t.id, t.content, t.special ? 2 : 3);
    m->added.push_back(std::move(t));
  }
  m->finish_added();
  m->finish_byte_ids(false);
  for (int b = 0; b < 256; ++b) {
    if (m->byte_ids[b] < 0) fail(Status::format, "{}: byte 0x{:02x} has no rank (tiktoken needs all 256)", origin, b);
  }
  return Tokenizer(std::move(m));
}

Tokenizer Tokenizer::from_tiktoken_file(const std::string &path, const std::string &pattern,
                                        std::vector<AddedToken> specials) {
  const std::string text = read_file(path);
  std::vector<std::string> ranks;
  std::vector<std::tuple<int64_t, size_t, std::string>> entries;  // rank, line, bytes
  size_t line_no = 0;
  size_t pos = 0;
  std::string bytes;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string_view line(text.data() + pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const size_t sp = line.find(' ');
    if (sp == std::string_view::npos) fail(Status::format, "{}: line {}: expected '<base64> <rank>'", path, line_no);
    int64_t rank = -1;
    const std::string_view rs = line.substr(sp + 1);
    auto [p, ec] = std::from_chars(rs.data(), rs.data() + rs.size(), rank);
    if (ec != std::errc() || p != rs.data() + rs.size() || rank < 0 || rank > (1 << 24)) {
      fail(Status::format, "{}: line {}: bad rank '{}'", path, line_no, rs);
    }
    if (!base64_decode(line.substr(0, sp), bytes) || bytes.empty()) {
      fail(Status::format, "{}: line {}: bad base64 token '{}'", path, line_no, line.substr(0, sp));
    }
    entries.emplace_back(rank, line_no, bytes);
  }
  if (entries.empty()) fail(Status::format, "{}: no ranks in tiktoken file", path);
  // Rank files are dense (rank = line index, give or take a few gaps): a rank far beyond the
  // number of entries is a damaged file, not a reason to allocate a huge table.
  int64_t max_rank = 0;
  for (const auto &[rank, line, b] : entries) max_rank = std::max(max_rank, rank);
  const int64_t limit = 2 * static_cast<int64_t>(entries.size()) + 65536;
  if (max_rank >= limit) {
    fail(Status::format, "{}: rank {} but only {} entries: ranks must be dense (below {})", path, max_rank,
         entries.size(), limit);
  }
  ranks.resize(static_cast<size_t>(max_rank) + 1);
  for (auto &[rank, line, b] : entries) {
    if (!ranks[rank].empty()) fail(Status::format, "{}: line {}: rank {} appears twice", path, line, rank);
    ranks[rank] = std::move(b);
  }
  return from_tiktoken_ranks(std::move(ranks), pattern, std::move(specials), path);
}

Tokenizer Tokenizer::from_file(const std::string &path, const std::string &tiktoken_pattern) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(Status::not_found, "{}: cannot open tokenizer file: {}", path, std::strerror(errno));
  if (format::is_gguf_file(path)) return from_gguf_file(path);
  char c = 0;
  while (in.get(c) && (c == ' ' || c == '\n' || c == '\r' || c == '\t')) {
  }
  if (c == '{') return from_json_file(path);
  // tiktoken rank file; specials from tokenizer_config.json "added_tokens_decoder" if present.
  std::vector<AddedToken> specials;
  std::optional<std::string> bos_name, eos_name;
  const std::filesystem::path cfg_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (std::filesystem::exists(cfg_path, ec)) {
    const json cfg = json::parse(read_file(cfg_path.string()), nullptr, false);
    if (cfg.is_discarded()) fail(Status::format, "{}: not valid JSON", cfg_path.string());
    if (cfg.contains("added_tokens_decoder") && cfg["added_tokens_decoder"].is_object()) {
      for (auto it = cfg["added_tokens_decoder"].begin(); it != cfg["added_tokens_decoder"].end(); ++it) {
        AddedToken t;
        t.id = std::stoi(it.key());
        t.content = it.value().value("content", "");
        t.special = it.value().value("special", true);
        t.lstrip = it.value().value("lstrip", false);
        t.rstrip = it.value().value("rstrip", false);
        t.single_word = it.value().value("single_word", false);
        t.normalized = false;
        specials.push_back(std::move(t));
      }
    }
    if (cfg.contains("bos_token")) bos_name = token_content(cfg["bos_token"]);
    if (cfg.contains("eos_token")) eos_name = token_content(cfg["eos_token"]);
  }
  Tokenizer t = from_tiktoken_file(path, tiktoken_pattern, std::move(specials));
  if (bos_name) t.impl_->bos = t.token_to_id(*bos_name);
  if (eos_name) t.impl_->eos = t.token_to_id(*eos_name);
  return t;
}

// ---- GGUF -----------------------------------------------------------------------------------

Tokenizer Tokenizer::from_gguf_vocab(const GgufVocab &vocab, const std::string &origin) {
  auto m = std::make_unique<Impl>();
  m->origin = origin;
  m->kind = "gguf";
  if (!vocab.token_types.empty() && vocab.token_types.size() != vocab.tokens.size()) {
    fail(Status::format, "{}: tokenizer.ggml.token_type has {} entries but tokenizer.ggml.tokens has {}", origin,
         vocab.token_types.size(), vocab.tokens.size());
  }
  m->ignore_merges = vocab.pre == "llama3" || vocab.pre == "llama-bpe";
  m->compile_steps(pre_tokenizer_for_gguf_pre(vocab.pre, origin));
  m->spelling_to_id.reserve(vocab.tokens.size() * 2);
  std::string bytes;
  for (size_t i = 0; i < vocab.tokens.size(); ++i) {
    const std::string &spelling = vocab.tokens[i];
    const int32_t type = vocab.token_types.empty() ? 1 : vocab.token_types[i];
    const auto id = static_cast<int32_t>(i);
    if (!byte_level_to_bytes(spelling, bytes)) bytes = spelling;
    if (type == 3 || type == 4) {
      AddedToken t;
      t.id = id;
      t.content = spelling;
      t.special = type == 3;
      t.normalized = false;
      m->set_id(id, spelling, t.special ? 2 : 3);
      if (!spelling.empty()) m->added.push_back(std::move(t));
    } else {
      m->set_id(id, bytes, type == 5 ? 0 : 1);
    }
    m->spelling_to_id.emplace(spelling, id);
    if (m->ignore_merges && type != 5) m->bytes_to_id.emplace(bytes, id);
  }
  m->merges.reserve(vocab.merges.size());
  for (size_t r = 0; r < vocab.merges.size(); ++r) {
    const std::string &s = vocab.merges[r];
    const size_t sp = s.find(' ');
    if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
      fail(Status::format, "{}: tokenizer.ggml.merges[{}] '{}' is not two tokens separated by one space", origin, r, s);
    }
    const std::string a = s.substr(0, sp);
    const std::string b = s.substr(sp + 1);
    auto ia = m->spelling_to_id.find(a);
    auto ib = m->spelling_to_id.find(b);
    auto iab = m->spelling_to_id.find(a + b);
    if (ia == m->spelling_to_id.end() || ib == m->spelling_to_id.end() || iab == m->spelling_to_id.end()) {
      fail(Status::format, "{}: tokenizer.ggml.merges[{}] '{}' uses or produces a token not in tokenizer.ggml.tokens",
           origin, r, s);
    }
    m->merges.insert(ia->second, ib->second, static_cast<int32_t>(r), iab->second);
  }
  m->merge_count = vocab.merges.size();
  m->finish_added();
  m->finish_byte_ids(true);
  auto check_id = [&](std::optional<int32_t> id, const char *what) {
    if (id && (*id < 0 || static_cast<size_t>(*id) >= vocab.tokens.size())) {
      fail(Status::format, "{}: {} {} is outside the {} tokens", origin, what, *id, vocab.tokens.size());
    }
    return id;
  };
  m->bos = check_id(vocab.bos_id, "tokenizer.ggml.bos_token_id");
  m->eos = check_id(vocab.eos_id, "tokenizer.ggml.eos_token_id");
  if (vocab.add_bos && m->bos) m->special_prefix.push_back(*m->bos);
  if (vocab.add_eos && m->eos) m->special_suffix.push_back(*m->eos);
  return Tokenizer(std::move(m));
}

// ---- encode / decode ------------------------------------------------------------------------

void Tokenizer::encode_append(std::string_view text, std::vector<int32_t> &out, const EncodeOptions &options) const {
  const Impl &m = *impl_;
  const size_t bad = utf8_first_invalid(text);
  if (bad != text.size()) {
    fail(Status::invalid_argument, "tokenizer {}: input text is not valid UTF-8 at byte offset {} (byte 0x{:02x})",
         m.origin, bad, static_cast<uint8_t>(text[bad]));
  }
  if (options.add_special) out.insert(out.end(), m.special_prefix.begin(), m.special_prefix.end());
  Impl::Scratch scratch;
  m.split_added(
      text, m.trie_raw, options.match_special,
      [&](std::string_view piece) {
        // The normalizer is the identity (checked at load), so normalized tokens match here.
        m.split_added(
            piece, m.trie_normalized, options.match_special,
            [&](std::string_view p) { m.encode_text(p, scratch, out, options.use_cache); },
            [&](int32_t id) { out.push_back(id); });
      },
      [&](int32_t id) { out.push_back(id); });
  if (options.add_special) out.insert(out.end(), m.special_suffix.begin(), m.special_suffix.end());
}

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view text, const EncodeOptions &options) const {
  const Impl &m = *impl_;
  const size_t bad = utf8_first_invalid(text);
  if (bad != text.size()) {
    fail(Status::invalid_argument, "tokenizer {}: input text is not valid UTF-8 at byte offset {}", m.origin, bad);
  }
  std::vector<std::string> out;
  Impl::Scratch scratch;
  auto on_token = [&](int32_t id) {
    for (const AddedToken &t : m.added) {
      if (t.id == id) {
        out.push_back(t.content);
        break;
      }
    }
  };
  m.split_added(
      text, m.trie_raw, options.match_special,
      [&](std::string_view piece) {
        m.split_added(
            piece, m.trie_normalized, options.match_special,
            [&](std::string_view p) {
              m.pre_tokenize_text(p, scratch);
              for (std::string_view q : scratch.pieces) out.emplace_back(q);
            },
            on_token);
      },
      on_token);
  return out;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, const EncodeOptions &options) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  encode_append(text, out, options);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  const Impl &m = *impl_;
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= m.id_kind.size() || m.id_kind[id] == 0) continue;  // as HF: skipped
    if (skip_special && m.id_kind[id] == 2) continue;
    bytes += m.id_bytes[id];
  }
  std::string out;
  out.reserve(bytes.size());
  utf8_append_lossy(out, bytes);
  return out;
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  const Impl &m = *impl_;
  if (id < 0 || static_cast<size_t>(id) >= m.id_kind.size() || m.id_kind[id] == 0) {
    fail(Status::invalid_argument, "tokenizer {}: token id {} is not in the vocabulary ({} ids)", m.origin, id,
         m.id_kind.size());
  }
  return m.id_bytes[id];
}

size_t Tokenizer::vocab_size() const noexcept { return impl_->id_kind.size(); }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  auto it = impl_->spelling_to_id.find(std::string(token));
  if (it == impl_->spelling_to_id.end()) return std::nullopt;
  return it->second;
}

bool Tokenizer::is_special(int32_t id) const noexcept {
  return id >= 0 && static_cast<size_t>(id) < impl_->id_kind.size() && impl_->id_kind[id] == 2;
}

const std::vector<AddedToken> &Tokenizer::added_tokens() const noexcept { return impl_->added; }
std::optional<int32_t> Tokenizer::bos_id() const noexcept { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const noexcept { return impl_->eos; }

std::string Tokenizer::describe() const {
  const Impl &m = *impl_;
  return fmt::format("{} BPE from {}: {} ids, {} merges, {} added tokens, {} pre-tokenizer steps", m.kind, m.origin,
                     m.id_kind.size(), m.merge_count, m.added.size(), m.steps.size());
}

// ---- streaming decode -----------------------------------------------------------------------

StreamDecoder::StreamDecoder(const Tokenizer &tokenizer, bool skip_special)
    : impl_(tokenizer.impl_.get()), skip_special_(skip_special) {}

std::string StreamDecoder::push(int32_t id) {
  const Tokenizer::Impl &m = *impl_;
  if (id < 0 || static_cast<size_t>(id) >= m.id_kind.size() || m.id_kind[id] == 0) return {};
  if (skip_special_ && m.id_kind[id] == 2) return {};
  pending_ += m.id_bytes[id];
  std::string out;
  const size_t held = utf8_append_lossy(out, pending_, /*hold_incomplete_tail=*/true);
  pending_.erase(0, pending_.size() - held);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out;
  utf8_append_lossy(out, pending_);
  pending_.clear();
  return out;
}

}  // namespace ep::tokenizer
