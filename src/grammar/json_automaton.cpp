#include "grammar/json_automaton.hpp"

#include <algorithm>

namespace ep::grammar {

namespace {

enum ObjectPhase : uint8_t { o_open, o_key, o_colon, o_value, o_after, o_comma };
enum ArrayPhase : uint8_t { a_open, a_value, a_after };
enum NumberPhase : uint8_t { n_start, n_minus, n_zero, n_int, n_dot, n_frac, n_e, n_esign, n_exp };

constexpr std::string_view kWords[3] = {"true", "false", "null"};

bool is_ws(uint8_t b) { return b == ' ' || b == '\t' || b == '\n' || b == '\r'; }
bool is_digit(uint8_t b) { return b >= '0' && b <= '9'; }
int hex_value(uint8_t b) {
  if (b >= '0' && b <= '9') return b - '0';
  if (b >= 'a' && b <= 'f') return b - 'a' + 10;
  if (b >= 'A' && b <= 'F') return b - 'A' + 10;
  return -1;
}

// One byte of a JSON string's body: 0 refused, 1 taken, 2 the closing quote.
int lex_string(Frame &f, uint8_t b) {
  if (f.cont) {
    if (b < f.cont_lo || b > f.cont_hi) return 0;
    --f.cont;
    f.cont_lo = f.cont ? 0x80 : 0;
    f.cont_hi = f.cont ? 0xBF : 0;
    return 1;
  }
  if (f.esc == 1) {
    if (f.surrogate == 1) {  // a high surrogate was read: only \u of a low one may follow
      if (b != 'u') return 0;
      f.esc = 2;
      f.surrogate = 2;
      return 1;
    }
    switch (b) {
      case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't': f.esc = 0; return 1;
      case 'u': f.esc = 2; return 1;
      default: return 0;
    }
  }
  if (f.esc == 2) {
    const int v = hex_value(b);
    if (v < 0) return 0;
    if (f.surrogate == 2) {  // the low surrogate: DC00..DFFF
      if (f.hexn == 0 && v != 0xD) return 0;
      if (f.hexn == 1 && v < 0xC) return 0;
    } else if (f.hexn == 1 && f.hex0 == 0xD && v >= 0xC) {
      return 0;  // a low surrogate without a high one
    }
    if (f.hexn == 0) f.hex0 = static_cast<uint8_t>(v);
    // hex0 = 0xD and v in 8..B: a high surrogate (remember it in hex0's spare bits)
    if (f.hexn == 1 && f.surrogate == 0 && f.hex0 == 0xD && v >= 8) f.hex0 = 0x1D;
    if (++f.hexn == 4) {
      const bool high = f.hex0 == 0x1D;
      f.esc = f.hexn = f.hex0 = 0;
      f.surrogate = high ? 1 : 0;
    }
    return 1;
  }
  if (f.surrogate == 1) {
    if (b != '\\') return 0;
    f.esc = 1;
    return 1;
  }
  if (b == '"') return 2;
  if (b == '\\') {
    f.esc = 1;
    return 1;
  }
  if (b < 0x20) return 0;
  if (b < 0x80) return 1;
  uint8_t cont = 0, lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) cont = 1;
  else if (b == 0xE0) cont = 2, lo = 0xA0;
  else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) cont = 2;
  else if (b == 0xED) cont = 2, hi = 0x9F;
  else if (b == 0xF0) cont = 3, lo = 0x90;
  else if (b >= 0xF1 && b <= 0xF3) cont = 3;
  else if (b == 0xF4) cont = 3, hi = 0x8F;
  else return 0;
  f.cont = cont;
  f.cont_lo = lo;
  f.cont_hi = hi;
  return 1;
}

bool number_accepting(const Frame &f) { return f.phase == n_zero || f.phase == n_int || f.phase == n_frac || f.phase == n_exp; }

// One byte of a number: 1 taken, 0 not part of it (it ends before, if it may), -1 refused.
int lex_number(Frame &f, uint8_t b) {
  const bool digit = is_digit(b);
  // Room for the bytes a fraction or an exponent needs at least; digits stop at the limit.
  const bool room = f.pos + 3 < kMaxNumberBytes;
  uint8_t next = 0;
  switch (f.phase) {
    case n_start:
      if (b == '-') next = n_minus;
      else if (b == '0') next = n_zero;
      else if (digit) next = n_int;
      else return -1;
      break;
    case n_minus:
      if (b == '0') next = n_zero;
      else if (digit) next = n_int;
      else return -1;
      break;
    case n_zero:
    case n_int:
      if (digit && f.phase == n_int && f.pos < kMaxNumberBytes) next = n_int;
      else if (b == '.' && !f.integer_only && room) next = n_dot;
      else if ((b == 'e' || b == 'E') && !f.integer_only && room) next = n_e;
      else return 0;
      break;
    case n_dot:
      if (!digit) return -1;
      next = n_frac;
      break;
    case n_frac:
      if (digit && f.pos < kMaxNumberBytes) next = n_frac;
      else if ((b == 'e' || b == 'E') && room) next = n_e;
      else return 0;
      break;
    case n_e:
      if (b == '+' || b == '-') next = n_esign;
      else if (digit) next = n_exp;
      else return -1;
      break;
    case n_esign:
      if (!digit) return -1;
      next = n_exp;
      break;
    case n_exp:
      if (digit && f.pos < kMaxNumberBytes) next = n_exp;
      else return 0;
      break;
    default: return -1;
  }
  f.phase = next;
  ++f.pos;
  return 1;
}

bool literal_accepting(const JsonGrammar &g, const Frame &f) {
  return f.lo < f.hi && g.node(f.node).literals[static_cast<size_t>(f.lo)].size() == f.pos;
}

}  // namespace

JsonAutomaton::JsonAutomaton(const JsonGrammar &grammar) : g_(&grammar) {
  stacks_.resize(1);
  Frame f;
  f.kind = Frame::value;
  f.node = grammar.root();
  stacks_[0].frames.push_back(f);
  n_ = 1;
}

bool JsonAutomaton::complete() const {
  for (size_t i = 0; i < n_; ++i) {
    const std::vector<Frame> &fr = stacks_[i].frames;
    if (fr.empty()) return true;
    if (fr.size() == 1) {
      const Frame &f = fr[0];
      if (f.kind == Frame::number && number_accepting(f)) return true;
      if (f.kind == Frame::literal && literal_accepting(*g_, f)) return true;
    }
  }
  return false;
}

void JsonAutomaton::key(std::string &out) const {
  out.clear();
  for (size_t i = 0; i < n_; ++i) {
    const Stack &s = stacks_[i];
    out.push_back(static_cast<char>(s.ws));
    out.push_back(static_cast<char>(s.frames.size()));
    for (const Frame &f : s.frames) {
      const uint8_t small[10] = {f.kind, f.phase, f.esc, f.hexn, f.hex0, f.surrogate, f.cont, f.cont_lo, f.cont_hi, f.integer_only};
      out.append(reinterpret_cast<const char *>(small), sizeof small);
      const int32_t ints[3] = {f.node, f.lo, f.hi};
      out.append(reinterpret_cast<const char *>(ints), sizeof ints);
      const uint32_t uints[2] = {f.pos, f.count};
      out.append(reinterpret_cast<const char *>(uints), sizeof uints);
      out.append(reinterpret_cast<const char *>(&f.used), sizeof f.used);
    }
  }
}

size_t JsonAutomaton::add_copy(size_t i) {
  if (n_ < stacks_.size()) {
    stacks_[n_] = stacks_[i];
  } else {
    Stack copy = stacks_[i];
    stacks_.push_back(std::move(copy));
  }
  stacks_[n_].alive = true;
  return n_++;
}

void JsonAutomaton::compact() {
  size_t w = 0;
  for (size_t r = 0; r < n_; ++r) {
    if (!stacks_[r].alive) continue;
    bool twin = false;
    for (size_t k = 0; k < w && !twin; ++k) twin = stacks_[k].same(stacks_[r]);
    if (twin) continue;
    if (w != r) std::swap(stacks_[w], stacks_[r]);
    ++w;
  }
  n_ = w;
}

bool JsonAutomaton::advance(uint8_t byte, JsonAutomaton &out) const {
  out.g_ = g_;
  out.n_ = 0;
  for (size_t i = 0; i < n_; ++i) {
    const size_t j = out.n_;
    if (j < out.stacks_.size())
      out.stacks_[j] = stacks_[i];
    else
      out.stacks_.push_back(stacks_[i]);
    out.stacks_[j].alive = true;
    out.n_ = j + 1;
    // apply() may add forks after j; each stack's result is in its alive flag.
    if (!out.apply(j, byte)) out.stacks_[j].alive = false;
  }
  out.compact();
  return out.n_ > 0;
}

bool JsonAutomaton::feed(std::string_view bytes) {
  JsonAutomaton next(*this);
  for (char c : bytes) {
    if (!advance(static_cast<uint8_t>(c), next)) {
      n_ = 0;
      return false;
    }
    std::swap(stacks_, next.stacks_);
    std::swap(n_, next.n_);
  }
  return true;
}

bool JsonAutomaton::push_value(Stack &s, int32_t node) {
  if (s.frames.size() >= kMaxDepth) return false;
  Frame f;
  f.kind = Frame::value;
  f.node = node;
  s.frames.push_back(f);
  return true;
}

void JsonAutomaton::value_done(Stack &s) {
  s.frames.pop_back();
  if (s.frames.empty()) return;
  Frame &p = s.frames.back();
  if (p.kind == Frame::object) {
    if (p.lo >= 0) p.used |= uint64_t{1} << p.lo;
    p.lo = 0;
    p.phase = o_after;
  } else if (p.kind == Frame::array) {
    ++p.count;
    p.phase = a_after;
  }
}

bool JsonAutomaton::start_leaf(Stack &s, int32_t leaf, uint8_t b) {
  const Node &n = g_->node(leaf);
  Frame &f = s.frames.back();
  f = Frame{};
  f.node = leaf;
  if (!n.literals.empty()) {
    f.kind = Frame::literal;
    int32_t lo = -1, hi = -1;
    for (size_t k = 0; k < n.literals.size(); ++k) {
      if (static_cast<uint8_t>(n.literals[k][0]) != b) continue;
      if (lo < 0) lo = static_cast<int32_t>(k);
      hi = static_cast<int32_t>(k) + 1;
    }
    if (lo < 0) return false;
    f.lo = lo;
    f.hi = hi;
    f.pos = 1;
    if (hi - lo == 1 && n.literals[static_cast<size_t>(lo)].size() == 1) value_done(s);
    return true;
  }
  switch (b) {
    case '{':
      if (!(n.types & kObject)) return false;
      f.kind = Frame::object;
      f.phase = o_open;
      return true;
    case '[':
      if (!(n.types & kArray)) return false;
      f.kind = Frame::array;
      f.phase = a_open;
      return true;
    case '"':
      if (!(n.types & kString)) return false;
      f.kind = Frame::string;
      return true;
    case 't':
    case 'f':
    case 'n': {
      if (!(n.types & (b == 'n' ? kNull : kBoolean))) return false;
      f.kind = Frame::word;
      f.lo = b == 't' ? 0 : b == 'f' ? 1 : 2;
      f.pos = 1;
      return true;
    }
    default:
      if (!(b == '-' || is_digit(b)) || !(n.types & (kNumber | kInteger))) return false;
      f.kind = Frame::number;
      f.integer_only = (n.types & kNumber) ? 0 : 1;
      return lex_number(f, b) == 1;
  }
}

bool JsonAutomaton::apply(size_t i, uint8_t b) {
  const bool ws = is_ws(b);
  if (!ws) stacks_[i].ws = 0;
  auto take_ws = [&] {
    Stack &s = stacks_[i];
    if (s.ws >= kMaxWhitespace) return false;
    ++s.ws;
    return true;
  };
  for (;;) {
    Stack &s = stacks_[i];
    if (s.frames.empty()) return false;  // the value is complete: nothing may follow
    Frame &f = s.frames.back();
    switch (f.kind) {
      case Frame::value: {
        if (ws) return take_ws();
        const std::vector<int32_t> &leaves = g_->leaves(f.node);
        for (size_t k = 1; k < leaves.size(); ++k) {
          const size_t j = add_copy(i);
          if (!start_leaf(stacks_[j], leaves[k], b)) stacks_[j].alive = false;
        }
        return start_leaf(stacks_[i], leaves[0], b);
      }
      case Frame::object: {
        const Node &n = g_->node(f.node);
        const uint64_t all = n.properties.size() == 64 ? ~uint64_t{0} : (uint64_t{1} << n.properties.size()) - 1;
        const bool more = n.additional || (f.used & all) != all;
        const bool required_done = (f.used & g_->required_mask(f.node)) == g_->required_mask(f.node);
        if (ws) return f.phase != o_key && f.phase != o_value && take_ws();
        switch (f.phase) {
          case o_open:
          case o_comma:
            if (b == '}' && f.phase == o_open) {
              if (!required_done) return false;
              value_done(s);
              return true;
            }
            if (b != '"' || !more || s.frames.size() >= kMaxDepth) return false;
            f.phase = o_key;
            {
              Frame k;
              k.kind = Frame::key;
              k.node = f.node;
              k.lo = 0;
              k.hi = static_cast<int32_t>(n.properties.size());
              s.frames.push_back(k);
            }
            return true;
          case o_colon:
            if (b != ':') return false;
            {
              const int32_t child = f.lo >= 0 ? n.properties[static_cast<size_t>(f.lo)].node : g_->any();
              f.phase = o_value;
              return push_value(s, child);
            }
          case o_after:
            if (b == ',') {
              if (!more) return false;
              f.phase = o_comma;
              return true;
            }
            if (b == '}' && required_done) {
              value_done(s);
              return true;
            }
            return false;
          default: return false;
        }
      }
      case Frame::array: {
        const Node &n = g_->node(f.node);
        if (ws) return f.phase != a_value && take_ws();
        if (f.phase == a_open || f.phase == a_after) {
          if (b == ']' && f.count >= n.min_items) {
            value_done(s);
            return true;
          }
          if (f.phase == a_after) {
            if (b != ',' || f.count >= n.max_items) return false;
            f.phase = a_value;
            return push_value(s, n.items);
          }
          if (n.max_items == 0) return false;
          f.phase = a_value;
          if (!push_value(s, n.items)) return false;
          continue;  // the byte starts the first item
        }
        return false;
      }
      case Frame::string: {
        const int r = lex_string(f, b);
        if (r == 2) value_done(s);
        return r != 0;
      }
      case Frame::key: {
        const Node &n = g_->node(f.node);
        Frame &obj = s.frames[s.frames.size() - 2];
        const int r = lex_string(f, b);
        if (r == 0) return false;
        if (r == 2) {
          int32_t prop = -1;
          if (f.lo < f.hi && n.properties[static_cast<size_t>(f.lo)].key.size() == f.pos) {
            if (obj.used >> f.lo & 1) return false;  // written already
            prop = f.lo;
          } else if (!n.additional) {
            return false;
          }
          s.frames.pop_back();
          Frame &o = s.frames.back();
          o.lo = prop;
          o.phase = o_colon;
          return true;
        }
        // Narrow the names this key can still become to those with b at pos.
        int32_t lo = -1, hi = -1;
        bool unused = false;
        for (int32_t k = f.lo; k < f.hi; ++k) {
          const std::string &name = n.properties[static_cast<size_t>(k)].key;
          if (name.size() <= f.pos || static_cast<uint8_t>(name[f.pos]) != b) continue;
          if (lo < 0) lo = k;
          hi = k + 1;
          unused = unused || !(obj.used >> k & 1);
        }
        if (!n.additional && !unused) return false;
        if (lo < 0) lo = hi = 0;
        f.lo = lo;
        f.hi = hi;
        ++f.pos;
        return true;
      }
      case Frame::number: {
        const int r = lex_number(f, b);
        if (r == 1) return true;
        if (r < 0 || !number_accepting(f)) return false;
        value_done(s);
        continue;  // the byte belongs to what follows the number
      }
      case Frame::literal: {
        const std::vector<std::string> &lits = g_->node(f.node).literals;
        int32_t lo = -1, hi = -1;
        for (int32_t k = f.lo; k < f.hi; ++k) {
          const std::string &t = lits[static_cast<size_t>(k)];
          if (t.size() <= f.pos || static_cast<uint8_t>(t[f.pos]) != b) continue;
          if (lo < 0) lo = k;
          hi = k + 1;
        }
        if (lo < 0) {
          if (!literal_accepting(*g_, f)) return false;
          value_done(s);
          continue;
        }
        f.lo = lo;
        f.hi = hi;
        ++f.pos;
        // Done as soon as no longer text can follow (a number literal may go on: 1 / 12).
        if (hi - lo == 1 && lits[static_cast<size_t>(lo)].size() == f.pos) value_done(s);
        return true;
      }
      case Frame::word: {
        const std::string_view w = kWords[f.lo];
        if (static_cast<uint8_t>(w[f.pos]) != b) return false;
        if (++f.pos == w.size()) value_done(s);
        return true;
      }
      default: return false;
    }
  }
}

}  // namespace ep::grammar
