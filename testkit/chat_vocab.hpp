// Byte-level chat vocabularies for synthetic models: the tokenizer.ggml.* the synthetic GGUF
// writers (deepseek_v4_gguf, kimi_gguf) embed, so a synthetic model chats without a tokenizer file.
#pragma once

#include "tokenizer/tokenizer.hpp"

#include <cstdint>

namespace ep::testkit {

/// A small byte-level chat vocabulary for synthetic models, @p vocab_size ids (>= 262):
/// 0 `<｜begin▁of▁sentence｜>` (BOS, control), 1 `<｜end▁of▁sentence｜>` (EOS, control),
/// 2..257 the 256 bytes (byte-level strings, no merges), 258 `<｜User｜>`, 259 `<｜Assistant｜>`
/// (control), 260 `<think>`, 261 `</think>` (user-defined: they stay in decoded text), and
/// `[PAD{i}]` holes (unused) up to @p vocab_size. Pre-tokenizer "deepseek-v3", add_bos true: it
/// renders and tokenizes DeepSeek-V4 chats like the real tokenizer, one token per byte.
tokenizer::GgufVocab synthetic_chat_vocab(int64_t vocab_size);
inline constexpr int64_t kSyntheticChatVocabMin = 262;

/// The Kimi-K3 counterpart for synthetic Kimi models, @p vocab_size ids (>= 262): 0 `[BOS]`
/// (BOS, control), 1 `<|end_of_msg|>` (EOS and end of turn, control), 2..257 the 256 bytes,
/// 258 `<|open|>`, 259 `<|sep|>`, 260 `<|close|>` (control: the K3 chat template's markers),
/// 261 `[EOS]` (control), then `[PAD{i}]` holes. Pre-tokenizer "kimi-k2" (Kimi's split pattern),
/// add_bos false: it renders and tokenizes Kimi-K3 chats (chat template detected from the
/// markers), one token per byte.
tokenizer::GgufVocab synthetic_kimi_chat_vocab(int64_t vocab_size);

}  // namespace ep::testkit
