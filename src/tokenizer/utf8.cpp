#include "tokenizer/utf8.hpp"

namespace ep::tokenizer {
namespace {

// Valid range of the second byte for a lead byte, and the sequence length (0: invalid lead).
struct LeadInfo {
  uint8_t length;
  uint8_t lo;
  uint8_t hi;
};

LeadInfo lead_info(uint8_t b) noexcept {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// Number of bytes from pos that form a valid prefix of a sequence (>= 1 for a valid lead), and
// the full length the lead byte announces.
size_t valid_prefix(std::string_view s, size_t pos, size_t &full) noexcept {
  const LeadInfo info = lead_info(static_cast<uint8_t>(s[pos]));
  full = info.length;
  if (info.length == 0) return 0;
  if (info.length == 1) return 1;
  size_t n = 1;
  if (pos + 1 >= s.size()) return n;
  const auto b1 = static_cast<uint8_t>(s[pos + 1]);
  if (b1 < info.lo || b1 > info.hi) return n;
  ++n;
  while (n < info.length && pos + n < s.size()) {
    const auto b = static_cast<uint8_t>(s[pos + n]);
    if (b < 0x80 || b > 0xBF) break;
    ++n;
  }
  return n;
}

constexpr std::array<char32_t, 256> make_byte_table() {
  std::array<char32_t, 256> table{};
  std::array<bool, 256> direct{};
  for (int b = '!'; b <= '~'; ++b) direct[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) table[b] = direct[b] ? static_cast<char32_t>(b) : next++;
  return table;
}

constexpr std::array<char32_t, 256> kByteTable = make_byte_table();

constexpr std::array<int16_t, 324> make_reverse_table() {
  std::array<int16_t, 324> rev{};
  for (auto &v : rev) v = -1;
  for (int b = 0; b < 256; ++b) rev[kByteTable[b]] = static_cast<int16_t>(b);
  return rev;
}

constexpr std::array<int16_t, 324> kReverseTable = make_reverse_table();

}  // namespace

size_t utf8_sequence_length(std::string_view text, size_t pos) noexcept {
  size_t full = 0;
  const size_t n = valid_prefix(text, pos, full);
  return (full != 0 && n == full) ? n : 0;
}

size_t utf8_first_invalid(std::string_view text) noexcept {
  size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<uint8_t>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const size_t n = utf8_sequence_length(text, pos);
    if (n == 0) return pos;
    pos += n;
  }
  return text.size();
}

size_t utf8_append_lossy(std::string &out, std::string_view bytes, bool hold_incomplete_tail) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  size_t pos = 0;
  size_t run_start = 0;  // start of a run of valid bytes not yet appended
  while (pos < bytes.size()) {
    if (static_cast<uint8_t>(bytes[pos]) < 0x80) {
      ++pos;
      continue;
    }
    size_t full = 0;
    const size_t n = valid_prefix(bytes, pos, full);
    if (full != 0 && n == full) {
      pos += n;
      continue;
    }
    out.append(bytes.substr(run_start, pos - run_start));
    if (hold_incomplete_tail && full != 0 && pos + n == bytes.size()) {
      return n;  // a valid but incomplete sequence at the end: keep it for later
    }
    out.append(kReplacement);
    pos += (n == 0 ? 1 : n);
    run_start = pos;
  }
  out.append(bytes.substr(run_start, pos - run_start));
  return 0;
}

char32_t utf8_next(std::string_view text, size_t &pos) noexcept {
  const auto b0 = static_cast<uint8_t>(text[pos]);
  if (b0 < 0x80) {
    ++pos;
    return b0;
  }
  const size_t n = utf8_sequence_length(text, pos);
  if (n == 0) {
    ++pos;
    return 0xFFFD;
  }
  char32_t cp = b0 & (0x7F >> n);
  for (size_t i = 1; i < n; ++i) cp = (cp << 6) | (static_cast<uint8_t>(text[pos + i]) & 0x3F);
  pos += n;
  return cp;
}

void utf8_append(std::string &out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_unicode_whitespace(char32_t cp) noexcept {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0x85: case 0xA0:
    case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

const std::array<char32_t, 256> &byte_to_unicode() noexcept { return kByteTable; }

int unicode_to_byte(char32_t cp) noexcept {
  return cp < kReverseTable.size() ? kReverseTable[cp] : -1;
}

bool byte_level_to_bytes(std::string_view token, std::string &out) {
  out.clear();
  size_t pos = 0;
  while (pos < token.size()) {
    const char32_t cp = utf8_next(token, pos);
    const int b = unicode_to_byte(cp);
    if (b < 0) return false;
    out.push_back(static_cast<char>(b));
  }
  return true;
}

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) utf8_append(out, kByteTable[static_cast<uint8_t>(c)]);
  return out;
}

}  // namespace ep::tokenizer
