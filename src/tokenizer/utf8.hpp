// UTF-8 helpers for the tokenizer: validation, lossy decoding (the same replacement policy as
// Rust's String::from_utf8_lossy, which HF `tokenizers` uses when decoding), the GPT-2
// byte-to-unicode table, and Unicode White_Space.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ep::tokenizer {

/// The byte offset of the first invalid UTF-8 sequence in @p text, or text.size() when the
/// whole string is valid (no overlongs, no surrogates, nothing above U+10FFFF).
size_t utf8_first_invalid(std::string_view text) noexcept;

/// Length in bytes of the valid UTF-8 sequence starting at text[pos] (1..4), or 0 when the
/// bytes at pos do not start a complete valid sequence.
size_t utf8_sequence_length(std::string_view text, size_t pos) noexcept;

/// Appends @p bytes to @p out, replacing every maximal ill-formed subsequence by U+FFFD (the
/// Unicode "substitution of maximal subparts" policy, as String::from_utf8_lossy does).
/// When @p hold_incomplete_tail is true, a trailing sequence that is a valid but incomplete
/// prefix of a character is not emitted: its length is returned so the caller keeps it.
size_t utf8_append_lossy(std::string &out, std::string_view bytes, bool hold_incomplete_tail = false);

/// Decodes one code point at text[pos] (text must be valid there); advances pos.
char32_t utf8_next(std::string_view text, size_t &pos) noexcept;

/// Appends the UTF-8 encoding of @p cp.
void utf8_append(std::string &out, char32_t cp);

/// True for the Unicode White_Space property (what Rust's char::is_whitespace tests).
bool is_unicode_whitespace(char32_t cp) noexcept;

/// GPT-2's reversible byte -> code point table (bytes_to_unicode in the original encoder.py).
const std::array<char32_t, 256> &byte_to_unicode() noexcept;

/// The byte a code point of the GPT-2 table stands for, or -1 when it is not in the table.
int unicode_to_byte(char32_t cp) noexcept;

/// Maps a byte-level token string ("Ġhello") back to raw bytes (" hello"). Returns false and
/// leaves @p out unspecified when a character is outside the byte table.
bool byte_level_to_bytes(std::string_view token, std::string &out);

/// Maps raw bytes to their byte-level string form.
std::string bytes_to_byte_level(std::string_view bytes);

}  // namespace ep::tokenizer
