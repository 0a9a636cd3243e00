// A PCRE2 regular expression (UTF + UCP, JIT-compiled where the platform supports it) used by
// the Split pre-tokenizers. Immutable after construction; matching is thread-safe (each call
// uses its own match data).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ep::tokenizer {

/// Rewrites a pattern written for Oniguruma / Rust regex into PCRE2 with the same meaning:
/// `\s` and `\S` become explicit Unicode White_Space classes. Throws Status::unsupported for
/// `\S` inside a character class.
std::string translate_pattern(std::string_view pattern, std::string_view origin);

/// Reusable PCRE2 match data for one thread (RAII); any Regex can use it.
class RegexScratch {
 public:
  RegexScratch();
  ~RegexScratch();
  RegexScratch(const RegexScratch &) = delete;
  RegexScratch &operator=(const RegexScratch &) = delete;
  void *data() const noexcept { return data_; }

 private:
  void *data_;
};

class Regex {
 public:
  /// Compiles @p pattern; throws ep::Error (Status::format) naming @p origin and the error offset.
  Regex(std::string pattern, std::string_view origin);
  ~Regex();
  Regex(const Regex &) = delete;
  Regex &operator=(const Regex &) = delete;
  Regex(Regex &&) noexcept;
  Regex &operator=(Regex &&) noexcept;

  /// All non-overlapping matches [begin, end) of the pattern in @p subject, searched as a whole
  /// string of its own (look-arounds do not see outside it). Empty matches are reported, and
  /// the search then moves on by one character (as Oniguruma's find_iter does).
  /// @p subject must be valid UTF-8 (not re-checked).
  void find_all(std::string_view subject, std::vector<std::pair<size_t, size_t>> &out) const;
  /// The same, reusing @p scratch's match data (no allocation per call).
  void find_all(std::string_view subject, std::vector<std::pair<size_t, size_t>> &out, RegexScratch &scratch) const;

  const std::string &pattern() const noexcept { return pattern_; }
  bool jit() const noexcept { return jit_; }

 private:
  struct Impl;
  std::string pattern_;
  std::unique_ptr<Impl> impl_;
  bool jit_ = false;
};

}  // namespace ep::tokenizer
