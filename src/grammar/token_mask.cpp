#include "grammar/token_mask.hpp"

#include "core/error.hpp"
#include "tokenizer/tokenizer.hpp"

#include <algorithm>
#include <numeric>

namespace ep::grammar {

Vocabulary::Vocabulary(std::vector<std::string> bytes, std::vector<bool> special) : bytes_(std::move(bytes)), special_(std::move(special)) {
  if (special_.size() != bytes_.size())
    fail(Status::invalid_argument, "Vocabulary: {} special flags for {} tokens", special_.size(), bytes_.size());
  // The text tokens sorted by their bytes: the trie is then built in preorder, a path at a time.
  std::vector<int32_t> order;
  for (size_t id = 0; id < bytes_.size(); ++id)
    if (!special_[id] && !bytes_[id].empty()) order.push_back(static_cast<int32_t>(id));
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return bytes_[static_cast<size_t>(a)] < bytes_[static_cast<size_t>(b)]; });
  byte_.push_back(0);
  depth_.push_back(0);
  end_.push_back(0);
  ids_begin_.push_back(0);
  ids_end_.push_back(0);
  std::vector<uint32_t> path = {0};  // the nodes of the previous token's bytes, root first
  std::string_view prev;
  for (int32_t id : order) {
    const std::string_view t = bytes_[static_cast<size_t>(id)];
    size_t common = 0;
    while (common < prev.size() && common < t.size() && prev[common] == t[common]) ++common;
    while (path.size() > common + 1) {
      end_[path.back()] = static_cast<uint32_t>(byte_.size());
      path.pop_back();
    }
    for (size_t k = common; k < t.size(); ++k) {
      path.push_back(static_cast<uint32_t>(byte_.size()));
      byte_.push_back(static_cast<uint8_t>(t[k]));
      depth_.push_back(static_cast<uint32_t>(k + 1));
      end_.push_back(0);
      ids_begin_.push_back(0);
      ids_end_.push_back(0);
    }
    const uint32_t node = path.back();
    if (ids_end_[node] == 0) ids_begin_[node] = ids_end_[node] = static_cast<uint32_t>(ids_.size());
    ids_.push_back(id);
    ids_end_[node] = static_cast<uint32_t>(ids_.size());
    max_depth_ = std::max<uint32_t>(max_depth_, static_cast<uint32_t>(t.size()));
    prev = t;
  }
  while (!path.empty()) {
    end_[path.back()] = static_cast<uint32_t>(byte_.size());
    path.pop_back();
  }
}

std::shared_ptr<const Vocabulary> Vocabulary::from_tokenizer(const tokenizer::Tokenizer &t) {
  const size_t n = t.vocab_size();
  std::vector<std::string> bytes(n);
  std::vector<bool> special(n, false);
  for (size_t id = 0; id < n; ++id) {
    const auto i = static_cast<int32_t>(id);
    special[id] = t.is_special(i);
    try {
      bytes[id] = std::string(t.token_bytes(i));
    } catch (const Error &) {
      // an id the vocabulary skips: no bytes, never allowed
    }
  }
  return std::make_shared<const Vocabulary>(std::move(bytes), std::move(special));
}

TokenGrammar::TokenGrammar(JsonGrammar grammar, std::shared_ptr<const Vocabulary> vocabulary, std::vector<int32_t> end_tokens)
    : grammar_(std::move(grammar)), vocab_(std::move(vocabulary)), end_(std::move(end_tokens)) {
  if (!vocab_) fail(Status::invalid_argument, "TokenGrammar: no vocabulary");
  if (end_.empty()) fail(Status::invalid_argument, "TokenGrammar: no end token (the tokenizer has neither EOS nor an end-of-turn token)");
  for (int32_t e : end_)
    if (e < 0 || static_cast<size_t>(e) >= vocab_->size())
      fail(Status::invalid_argument, "TokenGrammar: end token {} is outside the vocabulary 0..{}", e, vocab_->size() - 1);
}

bool TokenGrammar::is_end(int32_t token) const { return std::find(end_.begin(), end_.end(), token) != end_.end(); }

std::vector<uint32_t> TokenGrammar::compute_mask(const JsonAutomaton &state) const {
  const Vocabulary &v = *vocab_;
  std::vector<uint32_t> mask(mask_words(), 0);
  auto set = [&](int32_t id) { mask[static_cast<size_t>(id) / 32] |= uint32_t{1} << (id % 32); };
  if (state.complete())
    for (int32_t e : end_) set(e);
  if (state.dead()) return mask;
  // states[d]: the state after the d bytes of the path to the node being visited's parent.
  std::vector<JsonAutomaton> states(v.max_depth_ + 1, state);
  const uint32_t n = static_cast<uint32_t>(v.byte_.size());
  for (uint32_t i = 1; i < n;) {
    const uint32_t d = v.depth_[i];
    if (!states[d - 1].advance(v.byte_[i], states[d])) {
      i = v.end_[i];  // no token below this prefix
      continue;
    }
    for (uint32_t k = v.ids_begin_[i]; k < v.ids_end_[i]; ++k) set(v.ids_[k]);
    ++i;
  }
  return mask;
}

std::shared_ptr<const std::vector<uint32_t>> TokenGrammar::mask(const JsonAutomaton &state) const {
  std::string key;
  state.key(key);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (const auto it = cache_.find(key); it != cache_.end()) return it->second;
  }
  auto m = std::make_shared<const std::vector<uint32_t>>(compute_mask(state));
  std::lock_guard<std::mutex> lock(mu_);
  if (cache_.size() >= kMaskCacheEntries) cache_.clear();
  cache_.emplace(std::move(key), m);
  return m;
}

Matcher::Matcher(std::shared_ptr<const TokenGrammar> grammar) : grammar_(std::move(grammar)), state_(grammar_->json()) {}

std::shared_ptr<const std::vector<uint32_t>> Matcher::allowed() const {
  if (!ended_) return grammar_->mask(state_);
  if (!end_mask_) {
    auto m = std::make_shared<std::vector<uint32_t>>(grammar_->mask_words(), 0);
    for (int32_t e : grammar_->end_tokens()) (*m)[static_cast<size_t>(e) / 32] |= uint32_t{1} << (e % 32);
    end_mask_ = std::move(m);
  }
  return end_mask_;
}

void Matcher::accept(int32_t token) {
  const Vocabulary &v = grammar_->vocabulary();
  if (grammar_->is_end(token)) {
    if (!ended_ && !state_.complete())
      fail(Status::invalid_argument, "grammar: end token {} before the JSON value is complete", token);
    ended_ = true;
    return;
  }
  if (ended_) fail(Status::invalid_argument, "grammar: token {} after the end token (only end tokens may follow)", token);
  if (token < 0 || static_cast<size_t>(token) >= v.size())
    fail(Status::invalid_argument, "grammar: token {} is outside the vocabulary 0..{}", token, v.size() - 1);
  if (v.special(token)) fail(Status::invalid_argument, "grammar: special token {} is not JSON text", token);
  const std::string &bytes = v.bytes(token);
  JsonAutomaton next = state_;
  if (bytes.empty() || !next.feed(bytes))
    fail(Status::invalid_argument, "grammar: token {} ({:?}) does not continue the JSON value here", token, bytes);
  state_ = std::move(next);
}

}  // namespace ep::grammar
