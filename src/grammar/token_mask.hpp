// A JSON grammar over a tokenizer's vocabulary: which tokens may come next. The vocabulary's
// byte strings form a trie (built once per tokenizer); the mask of a state is the set of tokens
// whose every byte the automaton accepts, found by walking the trie and pruning a subtree at its
// first refused byte. Special tokens are never allowed, except the end tokens once the value is
// complete.
#pragma once

#include "grammar/json_automaton.hpp"
#include "grammar/json_schema.hpp"

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace ep::tokenizer {
class Tokenizer;
}

namespace ep::grammar {

/// The tokens' bytes as a trie in preorder: node i's subtree is [i, end[i]).
class Vocabulary {
 public:
  /// @p bytes[id] is token id's text (empty: never allowed); @p special[id] marks control tokens
  /// (never allowed as text).
  Vocabulary(std::vector<std::string> bytes, std::vector<bool> special);
  /// Every id of @p t: its raw bytes and whether it is special.
  static std::shared_ptr<const Vocabulary> from_tokenizer(const tokenizer::Tokenizer &t);

  size_t size() const noexcept { return bytes_.size(); }
  const std::string &bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  bool special(int32_t id) const { return special_[static_cast<size_t>(id)]; }
  size_t trie_nodes() const noexcept { return byte_.size(); }

 private:
  friend class TokenGrammar;
  std::vector<std::string> bytes_;
  std::vector<bool> special_;
  // The trie (node 0 is the root, no byte): per node its byte, depth, subtree end, and the range of
  // ids_ whose bytes end there.
  std::vector<uint8_t> byte_;
  std::vector<uint32_t> depth_, end_, ids_begin_, ids_end_;
  std::vector<int32_t> ids_;
  uint32_t max_depth_ = 0;
};

/// A JsonGrammar bound to a vocabulary and its end tokens; immutable and shareable (its cache of
/// masks by state is locked inside).
class TokenGrammar {
 public:
  TokenGrammar(JsonGrammar grammar, std::shared_ptr<const Vocabulary> vocabulary, std::vector<int32_t> end_tokens);

  const JsonGrammar &json() const noexcept { return grammar_; }
  const Vocabulary &vocabulary() const noexcept { return *vocab_; }
  const std::vector<int32_t> &end_tokens() const noexcept { return end_; }
  bool is_end(int32_t token) const;
  /// Words of a mask: one bit per token of the vocabulary (bit t % 32 of word t / 32).
  size_t mask_words() const noexcept { return (vocab_->size() + 31) / 32; }

  /// The mask of @p state: tokens whose bytes it accepts, and the end tokens when it is complete.
  /// From the cache when this state was seen before.
  std::shared_ptr<const std::vector<uint32_t>> mask(const JsonAutomaton &state) const;
  /// The same, computed without the cache (the trie walk).
  std::vector<uint32_t> compute_mask(const JsonAutomaton &state) const;

 private:
  JsonGrammar grammar_;
  std::shared_ptr<const Vocabulary> vocab_;
  std::vector<int32_t> end_;
  mutable std::mutex mu_;
  mutable std::unordered_map<std::string, std::shared_ptr<const std::vector<uint32_t>>> cache_;
};

/// The most masks a TokenGrammar keeps (16 KiB each for a 128K vocabulary); a full cache starts over.
inline constexpr size_t kMaskCacheEntries = 256;

/// One generation's position in a TokenGrammar. Not thread-safe.
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const TokenGrammar> grammar);

  /// The tokens allowed next (TokenGrammar::mask_words() words). After an end token: the end tokens.
  std::shared_ptr<const std::vector<uint32_t>> allowed() const;
  /// Takes @p token: Status::invalid_argument naming it when the grammar does not allow it here.
  void accept(int32_t token);
  /// True when the text so far is one complete value.
  bool complete() const { return state_.complete(); }
  /// True once an end token was accepted.
  bool ended() const { return ended_; }
  const TokenGrammar &grammar() const { return *grammar_; }
  /// The state (for tests).
  const JsonAutomaton &state() const { return state_; }

 private:
  std::shared_ptr<const TokenGrammar> grammar_;
  JsonAutomaton state_;
  bool ended_ = false;
  mutable std::shared_ptr<const std::vector<uint32_t>> end_mask_;  // made on first use after the end
};

}  // namespace ep::grammar
