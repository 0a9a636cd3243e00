#include "testkit/chat_vocab.hpp"

#include "core/error.hpp"
#include "tokenizer/utf8.hpp"

#include <initializer_list>
#include <string>
#include <utility>

namespace ep::testkit {

using tokenizer::GgufVocab;

namespace {

constexpr int32_t kControl = 3, kUserDefined = 4, kUnused = 5, kNormal = 1;

/// bos, eos, the 256 bytes, then @p specials ({text, type}), then [PAD{i}] up to @p vocab_size.
GgufVocab byte_level_vocab(int64_t vocab_size, const char *bos, const char *eos,
                           std::initializer_list<std::pair<const char *, int32_t>> specials) {
  if (vocab_size < kSyntheticChatVocabMin)
    fail(Status::invalid_argument, "synthetic chat vocabulary: {} ids asked, at least {} needed", vocab_size, kSyntheticChatVocabMin);
  GgufVocab v;
  auto add = [&](std::string t, int32_t type) {
    v.tokens.push_back(std::move(t));
    v.token_types.push_back(type);
  };
  add(bos, kControl);
  add(eos, kControl);
  for (int b = 0; b < 256; ++b) add(tokenizer::bytes_to_byte_level(std::string(1, static_cast<char>(b))), kNormal);
  for (const auto &[text, type] : specials) add(text, type);
  for (int64_t i = static_cast<int64_t>(v.tokens.size()); i < vocab_size; ++i) add("[PAD" + std::to_string(i) + "]", kUnused);
  v.bos_id = 0;
  v.eos_id = 1;
  return v;
}

}  // namespace

GgufVocab synthetic_chat_vocab(int64_t vocab_size) {
  GgufVocab v = byte_level_vocab(vocab_size, "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
                                 {{"<｜User｜>", kControl}, {"<｜Assistant｜>", kControl}, {"<think>", kUserDefined},
                                  {"</think>", kUserDefined}});
  v.pre = "deepseek-v3";
  v.add_bos = true;
  return v;
}

GgufVocab synthetic_kimi_chat_vocab(int64_t vocab_size) {
  GgufVocab v = byte_level_vocab(vocab_size, "[BOS]", "<|end_of_msg|>",
                                 {{"<|open|>", kControl}, {"<|sep|>", kControl}, {"<|close|>", kControl}, {"[EOS]", kControl}});
  v.pre = "kimi-k2";
  v.add_bos = false;
  return v;
}

}  // namespace ep::testkit
