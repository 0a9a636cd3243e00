// Byte-level BPE tokenizers: HF tokenizer.json, tiktoken rank files and GGUF vocabularies.
//
// Encoding follows HF `tokenizers` exactly for the features supported here (see
// docs/tokenizer.md): added tokens are split out first (leftmost-longest, non-normalized ones
// before normalized ones), then each remaining piece goes through the pre-tokenizer steps
// (Split with a PCRE2 regex, ByteLevel), then BPE by merge rank. Decoding maps ids to bytes and
// replaces invalid UTF-8 the way String::from_utf8_lossy does. A Tokenizer is immutable after
// loading; encode() and decode() may be called from many threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ep::tokenizer {

/// A token matched in the raw text before pre-tokenization (HF "added token").
struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

/// How a Split pre-tokenizer treats the pieces its pattern matches (HF SplitDelimiterBehavior).
enum class SplitBehavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

/// One pre-tokenizer step. A Split step splits every piece by a regex; a ByteLevel step
/// optionally prepends a space and optionally splits with the GPT-2 regex.
struct PreTokenizerStep {
  enum class Kind { split, byte_level };
  Kind kind = Kind::split;
  std::string pattern;  ///< Split: PCRE2 pattern
  SplitBehavior behavior = SplitBehavior::isolated;
  bool invert = false;
  bool add_prefix_space = false;  ///< ByteLevel
  bool use_regex = false;         ///< ByteLevel: split with the GPT-2 pattern
};

/// The GPT-2 split pattern (ByteLevel use_regex=true).
extern const char *const kGpt2Pattern;
/// The three Split patterns of DeepSeek-V3/V4 (tokenizer.json; llama.cpp pre "deepseek-v3").
std::vector<PreTokenizerStep> deepseek_v3_pre_tokenizer();
/// tiktoken's cl100k_base split pattern.
extern const char *const kCl100kPattern;
/// Kimi's (tokenization_kimi.py) split pattern, with its character-class intersections
/// `[A&&[^\p{Han}]]` rewritten for PCRE2 as `(?:(?!\p{Han})[A])`.
extern const char *const kKimiPattern;
/// The pre-tokenizer steps for a llama.cpp `tokenizer.ggml.pre` name; throws
/// Status::unsupported for names not known here.
std::vector<PreTokenizerStep> pre_tokenizer_for_gguf_pre(std::string_view pre, std::string_view origin);

/// The GGUF metadata a BPE vocabulary is built from (tokenizer.ggml.*), as plain vectors so
/// that the GGUF reader can fill it.
struct GgufVocab {
  std::vector<std::string> tokens;      ///< tokenizer.ggml.tokens (byte-level strings)
  std::vector<std::string> merges;      ///< tokenizer.ggml.merges ("a b")
  std::vector<int32_t> token_types;     ///< tokenizer.ggml.token_type (1 normal, 3 control, 4 user-defined, 5 unused, 6 byte)
  std::string pre;                      ///< tokenizer.ggml.pre ("deepseek-v3", "joyai-llm", "gpt2", ...)
  std::optional<int32_t> bos_id;        ///< tokenizer.ggml.bos_token_id
  std::optional<int32_t> eos_id;        ///< tokenizer.ggml.eos_token_id
  bool add_bos = false;                 ///< tokenizer.ggml.add_bos_token
  bool add_eos = false;                 ///< tokenizer.ggml.add_eos_token
};

/// Options of Tokenizer::encode().
struct EncodeOptions {
  /// Add BOS/EOS as the tokenizer's post-processor or tokenizer_config.json say (HF
  /// add_special_tokens=True). Off by default.
  bool add_special = false;
  /// Match special added tokens in the text (HF default). When false they are tokenized as
  /// ordinary text (HF encode_special_tokens=True); non-special added tokens still match.
  bool match_special = true;
  /// Look pieces up in (and add them to) the tokenizer's word cache. Results are identical
  /// either way; off only for measuring the uncached speed.
  bool use_cache = true;
};

class Tokenizer {
 public:
  /// Loads a HF tokenizer.json. A tokenizer_config.json beside it, if present, supplies
  /// add_bos_token/add_eos_token and bos/eos for EncodeOptions::add_special.
  static Tokenizer from_json_file(const std::string &path);
  /// Parses tokenizer.json text; @p origin names it in errors.
  static Tokenizer from_json_text(std::string_view json_text, const std::string &origin);
  /// Loads a tiktoken rank file (one "<base64 token> <rank>" per line). @p pattern is the split
  /// regex (PCRE2 syntax); @p specials are matched before splitting (leftmost-longest).
  static Tokenizer from_tiktoken_file(const std::string &path, const std::string &pattern,
                                      std::vector<AddedToken> specials = {});
  /// Builds from in-memory ranks: ranks[i] is the byte string of rank/id i (empty = hole).
  static Tokenizer from_tiktoken_ranks(std::vector<std::string> ranks, const std::string &pattern,
                                       std::vector<AddedToken> specials, const std::string &origin);
  /// Builds from GGUF tokenizer metadata (model "gpt2"). @p origin names the file in errors.
  static Tokenizer from_gguf_vocab(const GgufVocab &vocab, const std::string &origin);
  /// Opens a GGUF file (the first shard of a split set holds the metadata) and builds from its
  /// tokenizer.ggml.* keys; Status::unsupported unless tokenizer.ggml.model is "gpt2".
  static Tokenizer from_gguf_file(const std::string &path);
  /// Dispatches on the file: GGUF (magic "GGUF"), tokenizer.json (starts with '{') or a tiktoken rank file (then
  /// @p tiktoken_pattern is used, kKimiPattern by default, and specials come from a
  /// tokenizer_config.json "added_tokens_decoder" beside it when present).
  static Tokenizer from_file(const std::string &path, const std::string &tiktoken_pattern = kKimiPattern);

  Tokenizer(Tokenizer &&) noexcept;
  Tokenizer &operator=(Tokenizer &&) noexcept;
  ~Tokenizer();

  /// Token ids of @p text. Throws ep::Error(Status::invalid_argument) when @p text is not
  /// valid UTF-8 (HF cannot be given such input; we refuse it rather than guess).
  std::vector<int32_t> encode(std::string_view text, const EncodeOptions &options = {}) const;
  /// Appends the ids of @p text to @p out (same rules as encode()).
  void encode_append(std::string_view text, std::vector<int32_t> &out, const EncodeOptions &options = {}) const;

  /// The pieces BPE runs on, in order: added tokens (as their content) and the pre-tokenizer's
  /// splits of the text between them (raw bytes, before the byte-level mapping). For tests and
  /// debugging.
  std::vector<std::string> pre_tokenize(std::string_view text, const EncodeOptions &options = {}) const;

  /// Text of @p ids: token bytes concatenated, invalid UTF-8 replaced by U+FFFD per maximal
  /// ill-formed subsequence. Ids outside the vocabulary are skipped, as HF does.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  /// The raw bytes of one token (no UTF-8 repair). Throws for unknown ids.
  std::string_view token_bytes(int32_t id) const;

  /// One more than the largest id (the embedding rows the ids index).
  size_t vocab_size() const noexcept;
  /// The id of a token given in its vocabulary spelling (byte-level string for tokenizer.json
  /// and GGUF, raw bytes for tiktoken, content for added tokens).
  std::optional<int32_t> token_to_id(std::string_view token) const;
  /// True for special added tokens (control tokens).
  bool is_special(int32_t id) const noexcept;
  const std::vector<AddedToken> &added_tokens() const noexcept;
  std::optional<int32_t> bos_id() const noexcept;
  std::optional<int32_t> eos_id() const noexcept;
  /// What was loaded, for messages ("tokenizer.json BPE, 128815 ids, 127741 merges").
  std::string describe() const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend class StreamDecoder;
};

/// Incremental decoding for streaming generation: push ids one at a time and get text that is
/// always valid UTF-8; bytes of a character split across tokens are held back until complete.
/// Concatenating every push() result and finish() gives exactly Tokenizer::decode(all ids).
class StreamDecoder {
 public:
  /// @p tokenizer's loaded data must outlive the decoder (moving the Tokenizer is fine).
  explicit StreamDecoder(const Tokenizer &tokenizer, bool skip_special = false);
  /// Text completed by @p id (possibly empty).
  std::string push(int32_t id);
  /// Flushes held-back bytes (an incomplete character becomes U+FFFD) and resets.
  std::string finish();
  /// Bytes currently held back (0..3).
  size_t pending_bytes() const noexcept { return pending_.size(); }

 private:
  const Tokenizer::Impl *impl_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace ep::tokenizer
