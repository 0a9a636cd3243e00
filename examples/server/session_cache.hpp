// The prefix cache: the model's state after token prefixes, kept across requests so that a
// request whose prompt starts with a kept prefix (the next turn of an agent's conversation,
// another user's request with the same system prompt) continues from a copy of it and runs only
// the rest.
//
// Prompts are cut into blocks of a fixed token count (the scheduler's prefill chunk), and a
// prefix of whole blocks is known by a hash chained over its blocks (block i's hash covers block
// i's tokens and block i − 1's hash, so it names the whole prefix). A kept state sits at a block
// boundary only: the scheduler prefills every prompt in chunks aligned to the blocks, with or
// without the cache, so a request continued from a kept state computes exactly what it would
// have from the start. (Neither model's state can be cut back: DeepSeek-V4's sliding window and
// compressor rows and Kimi's linear-attention state only move forward, so a state is kept as it
// passes the boundary.)
//
// The engine's state of a sequence is one object, not paged: a kept state is a whole session
// (ep_session_fork) that costs its ep_session_state_bytes(), and two kept prefixes of one prompt
// cost both. So the cache keeps few, chosen states: where a prompt parts from one seen before
// (the end of a shared system prompt: the chains of recent prompts are remembered, hashes only)
// and the last boundary before where the conversation's next turn will part from this prompt
// (JobRequest::snapshot_at). The least recently used states go first when the byte budget is
// reached. Nobody appends to a kept state: a request gets its own fork. Used by the scheduler
// thread only.
//
// A kept state is a session of the model, so it counts against the model's KV budget
// (ep_model_state_bytes at its length) like a running request's: the scheduler lets the cache
// keep a state only in memory no running request may need (offer's kv_free_bytes), and drops
// kept states, least recently used first, to admit a request (evict_oldest).
#pragma once

#include "handles.hpp"

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace ep_server {

class PrefixCache {
 public:
  /// @p block_tokens tokens per block (>= 1); @p budget_bytes of kept state at most (0: off).
  PrefixCache(size_t block_tokens, uint64_t budget_bytes);

  bool enabled() const { return budget_bytes_ > 0; }
  size_t block_tokens() const { return block_; }

  struct Stats {
    size_t entries = 0;
    uint64_t bytes = 0, budget_bytes = 0;
    uint64_t hits = 0, misses = 0;  ///< requests that continued a kept state / found none
    uint64_t hit_tokens = 0;        ///< prompt tokens those requests did not run
    uint64_t inserts = 0, evictions = 0;
    uint64_t rejected = 0;          ///< states larger than the whole budget, not kept
    uint64_t kv_full = 0;           ///< states not kept because the KV budget had no room beside the running requests
    uint64_t fork_failures = 0;     ///< forks (to keep a state or to continue one) the model refused: out of memory
  };
  const Stats &stats() const { return stats_; }

  /// A fork of a kept state.
  struct Fork {
    SessionPtr session;  ///< null: no kept state is a prefix of the prompt
    size_t length = 0;   ///< tokens it holds (whole blocks)
  };
  /// The longest kept prefix of @p prompt, forked, with its sampler's draw counter at 0 (as a
  /// new session's); an empty Fork when none is or the fork fails. @p count: a request's lookup
  /// (hits and misses count), not a recomputation's.
  Fork fork_longest_prefix(std::span<const int32_t> prompt, bool count = true);
  /// Remembers the block chain of @p prompt, and returns the block boundaries (ascending, above
  /// @p from) at which the scheduler should offer the prompt's state: where it parts from a prompt
  /// seen before, and the last boundary at or before @p snapshot_at.
  std::vector<size_t> plan(std::span<const int32_t> prompt, size_t from, size_t snapshot_at);
  /// Offers the state of @p session, which holds exactly @p tokens (a whole number of blocks):
  /// a fork of it is kept unless an entry holds them already or it alone exceeds the budget;
  /// least recently used entries make room, in the cache's budget and in the model's KV budget,
  /// where the fork counts @p kv_bytes (ep_model_state_bytes at its length) and @p kv_free_bytes
  /// are neither counted by a session nor held for a running request (with the dropped entries'
  /// counts added, they must cover @p kv_bytes, else nothing is kept).
  void offer(std::span<const int32_t> tokens, const ep_session *session, uint64_t kv_bytes, uint64_t kv_free_bytes);
  /// Drops the least recently used entry (its memory goes back to the model's KV budget); false
  /// when there is none.
  bool evict_oldest();

 private:
  /// The chained hashes of @p tokens' whole blocks: [i] names tokens [0, (i + 1) · block).
  std::vector<uint64_t> chain(std::span<const int32_t> tokens) const;
  bool seen(uint64_t hash) const { return seen_now_.contains(hash) || seen_before_.contains(hash); }

  struct Entry {
    std::vector<int32_t> tokens;  // checked on a hit: a hash names the prefix, the tokens prove it
    SessionPtr session;
    uint64_t bytes = 0;     // ep_session_state_bytes: what the cache's budget counts
    uint64_t kv_bytes = 0;  // ep_model_state_bytes at its length: what the model's KV budget counts
    std::list<uint64_t>::iterator lru;
  };
  size_t block_;
  uint64_t budget_bytes_;
  std::unordered_map<uint64_t, Entry> entries_;  // by the chained hash of their tokens
  std::list<uint64_t> lru_;                       // most recently used first
  // Block hashes of recent prompts, in two generations: when the newer holds kSeenGeneration,
  // the older is dropped and the newer takes its place.
  std::unordered_set<uint64_t> seen_now_, seen_before_;
  Stats stats_;
};

}  // namespace ep_server
