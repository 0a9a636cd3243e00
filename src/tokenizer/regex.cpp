#include "tokenizer/regex.hpp"

#include "core/error.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace ep::tokenizer {

struct Regex::Impl {
  pcre2_code *code = nullptr;
  ~Impl() {
    if (code != nullptr) pcre2_code_free(code);
  }
};

namespace {


std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof buffer) < 0) return "unknown PCRE2 error " + std::to_string(code);
  return reinterpret_cast<const char *>(buffer);
}

// Unicode White_Space, which is what \s means in Oniguruma (HF tokenizers) and in Rust's regex
// (tiktoken). PCRE2's \s with UCP also matches U+180E MONGOLIAN VOWEL SEPARATOR (it is in
// PCRE2's \h list), so \s and \S are rewritten to this explicit set.
constexpr std::string_view kWhiteSpaceMembers =
    "\\t-\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}";

}  // namespace

std::string translate_pattern(std::string_view pattern, std::string_view origin) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  size_t class_start = 0;  // index in `pattern` just after '[' or '[^'
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      if (e == 's') {
        if (in_class) {
          out += kWhiteSpaceMembers;
        } else {
          out += '[';
          out += kWhiteSpaceMembers;
          out += ']';
        }
      } else if (e == 'S') {
        if (in_class) {
          fail(Status::unsupported, "{}: regex /{}/: \\S inside a character class is not supported", origin, pattern);
        }
        out += "[^";
        out += kWhiteSpaceMembers;
        out += ']';
      } else if (e == 'Q') {
        const size_t end = pattern.find("\\E", i + 2);
        const size_t stop = end == std::string_view::npos ? pattern.size() : end + 2;
        out.append(pattern.substr(i, stop - i));
        i = stop - 1;
        continue;
      } else {
        out += c;
        out += e;
      }
      ++i;
      continue;
    }
    if (!in_class) {
      if (c == '[') {
        in_class = true;
        out += c;
        size_t j = i + 1;
        if (j < pattern.size() && pattern[j] == '^') {
          out += '^';
          ++j;
        }
        if (j < pattern.size() && pattern[j] == ']') {  // a leading ']' is literal
          out += ']';
          ++j;
        }
        class_start = j;
        i = j - 1;
        continue;
      }
      out += c;
      continue;
    }
    if (c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {  // POSIX class [:alpha:]
      const size_t end = pattern.find(":]", i + 2);
      if (end != std::string_view::npos) {
        out.append(pattern.substr(i, end + 2 - i));
        i = end + 1;
        continue;
      }
    }
    if (c == ']' && i >= class_start) in_class = false;
    out += c;
  }
  return out;
}

Regex::Regex(std::string pattern, std::string_view origin) : pattern_(std::move(pattern)), impl_(std::make_unique<Impl>()) {
  const std::string translated = translate_pattern(pattern_, origin);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                              PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (impl_->code == nullptr) {
    fail(Status::format, "{}: cannot compile regex /{}/ at pattern offset {}: {}", origin, pattern_, error_offset,
         pcre2_message(error_code));
  }
  jit_ = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() = default;
Regex::Regex(Regex &&) noexcept = default;
Regex &Regex::operator=(Regex &&) noexcept = default;

RegexScratch::RegexScratch() : data_(pcre2_match_data_create(16, nullptr)) {
  if (data_ == nullptr) fail(Status::out_of_memory, "pcre2_match_data_create failed");
}

RegexScratch::~RegexScratch() { pcre2_match_data_free(static_cast<pcre2_match_data *>(data_)); }

void Regex::find_all(std::string_view subject, std::vector<std::pair<size_t, size_t>> &out) const {
  RegexScratch scratch;
  find_all(subject, out, scratch);
}

void Regex::find_all(std::string_view subject, std::vector<std::pair<size_t, size_t>> &out,
                     RegexScratch &scratch) const {
  out.clear();
  if (subject.empty()) return;
  struct {
    pcre2_match_data *data;
  } md{static_cast<pcre2_match_data *>(scratch.data())};
  const auto *s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t start = 0;
  bool last_was_empty_at = false;
  size_t last_end = 0;
  while (start <= subject.size()) {
    const int rc = pcre2_match(impl_->code, s, subject.size(), start, PCRE2_NO_UTF_CHECK, md.data, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      fail(Status::internal, "regex /{}/: pcre2_match failed at subject offset {}: {}", pattern_, start,
           pcre2_message(rc));
    }
    const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md.data);
    const size_t b = ov[0];
    const size_t e = ov[1];
    if (b == e) {
      // An empty match: report it unless it touches the previous match, then step one character.
      if (!(last_was_empty_at && b == last_end) && !(b == last_end && !out.empty() && out.back().second == b)) {
        out.emplace_back(b, e);
      }
      if (b >= subject.size()) break;
      size_t next = b + 1;
      while (next < subject.size() && (static_cast<uint8_t>(subject[next]) & 0xC0) == 0x80) ++next;
      start = next;
      last_was_empty_at = true;
      last_end = e;
      continue;
    }
    out.emplace_back(b, e);
    start = e;
    last_end = e;
    last_was_empty_at = false;
  }
}

}  // namespace ep::tokenizer
