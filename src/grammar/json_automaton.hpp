// A byte-level pushdown automaton for the JSON texts a JsonGrammar admits: objects, arrays,
// strings (escapes, \u surrogate pairs, UTF-8 checked byte by byte), numbers, literals, const /
// enum texts, with whitespace bounded between tokens. Where the grammar is ambiguous (anyOf) the
// state is a set of stacks, one per alternative still alive.
#pragma once

#include "grammar/json_schema.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ep::grammar {

/// The most whitespace bytes in a row between two JSON tokens (one newline and an indentation).
inline constexpr uint8_t kMaxWhitespace = 16;
/// The most frames on one stack (about half as many nesting levels).
inline constexpr size_t kMaxDepth = 64;
/// Numbers longer than this many bytes end (no more digits).
inline constexpr uint32_t kMaxNumberBytes = 32;

/// One element of a stack. The fields a kind does not use stay zero (states compare bytewise).
struct Frame {
  enum Kind : uint8_t { value, object, array, string, key, number, literal, word };
  uint8_t kind = value;
  uint8_t phase = 0;
  // The string lexer (string, key): escape (0 none, 1 after '\', 2 in \u's hex digits), hex
  // digits read, the first hex digit, a high surrogate's \u read (1) or being read (2),
  // continuation bytes still due and the range of the next one.
  uint8_t esc = 0, hexn = 0, hex0 = 0, surrogate = 0, cont = 0, cont_lo = 0, cont_hi = 0;
  uint8_t integer_only = 0;  ///< number: digits only
  int32_t node = -1;
  int32_t lo = 0, hi = 0;    ///< key / literal: candidate range; object: the property being read (-1: an additional one)
  uint32_t pos = 0;          ///< key / literal / word: bytes matched; number: bytes
  uint32_t count = 0;        ///< array: items
  uint64_t used = 0;         ///< object: properties written (bit = index into Node::properties)
  bool operator==(const Frame &) const = default;
};

struct Stack {
  std::vector<Frame> frames;  ///< empty: the top-level value is complete
  uint8_t ws = 0;             ///< whitespace bytes in a row
  bool alive = true;          ///< scratch during a step
  bool same(const Stack &o) const { return ws == o.ws && frames == o.frames; }
};

/// The automaton's state. Copyable; advance() writes into a caller-kept state so that walking a
/// vocabulary reuses memory.
class JsonAutomaton {
 public:
  /// The start state of @p grammar (kept by reference: it must outlive the automaton).
  explicit JsonAutomaton(const JsonGrammar &grammar);

  /// The state after @p byte, written to @p out (which must be of the same grammar); false when
  /// no alternative accepts it (@p out is then meaningless).
  bool advance(uint8_t byte, JsonAutomaton &out) const;
  /// Feeds @p bytes in place; false (and the state dead) at the first refused byte.
  bool feed(std::string_view bytes);
  /// True when the bytes so far are one complete value of the grammar (nothing may follow but the end).
  bool complete() const;
  /// True when a byte was refused (feed()) — no continuation exists.
  bool dead() const { return n_ == 0; }
  /// A key that identifies the state (equal states, equal keys): for caches.
  void key(std::string &out) const;

 private:
  bool apply(size_t i, uint8_t b);
  bool start_leaf(Stack &s, int32_t leaf, uint8_t b);
  void value_done(Stack &s);
  bool push_value(Stack &s, int32_t node);
  size_t add_copy(size_t i);
  void compact();

  const JsonGrammar *g_;
  std::vector<Stack> stacks_;  // [0, n_) live
  size_t n_ = 0;
};

}  // namespace ep::grammar
