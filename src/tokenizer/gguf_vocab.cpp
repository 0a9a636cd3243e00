// Tokenizer from a GGUF file's tokenizer.ggml.* metadata (llama.cpp "gpt2" BPE vocabularies).
#include "core/error.hpp"
#include "format/gguf.hpp"
#include "tokenizer/gguf_vocab.hpp"

#include <cstring>

namespace ep::tokenizer {

GgufVocab gguf_vocab_from_file(const format::GgufFile &file) {
  const std::string &path = file.path();
  auto need = [&](const char *key) -> const format::GgufValue & {
    const format::GgufValue *v = file.find(key);
    if (v == nullptr) fail(Status::not_found, "{}: GGUF has no {} metadata", path, key);
    return *v;
  };
  auto string_array = [&](const char *key) -> const std::vector<std::string> & {
    const format::GgufValue &v = need(key);
    if (v.type != format::GgufType::array || v.elem_type != format::GgufType::string) {
      fail(Status::format, "{}: {} is not an array of strings", path, key);
    }
    return v.strings;
  };
  const format::GgufValue &model = need("tokenizer.ggml.model");
  if (model.type != format::GgufType::string || model.s != "gpt2") {
    fail(Status::unsupported, "{}: tokenizer.ggml.model '{}' is not supported (only byte-level BPE, \"gpt2\")", path,
         model.type == format::GgufType::string ? model.s : std::string("<not a string>"));
  }
  GgufVocab v;
  v.tokens = string_array("tokenizer.ggml.tokens");
  if (file.find("tokenizer.ggml.merges") != nullptr) v.merges = string_array("tokenizer.ggml.merges");
  if (const format::GgufValue *tt = file.find("tokenizer.ggml.token_type")) {
    if (tt->type != format::GgufType::array ||
        (tt->elem_type != format::GgufType::i32 && tt->elem_type != format::GgufType::u32)) {
      fail(Status::format, "{}: tokenizer.ggml.token_type is not an array of i32", path);
    }
    v.token_types.resize(tt->array_size());
    std::memcpy(v.token_types.data(), tt->raw.data(), v.token_types.size() * sizeof(int32_t));
  }
  if (const format::GgufValue *pre = file.find("tokenizer.ggml.pre")) {
    if (pre->type != format::GgufType::string) fail(Status::format, "{}: tokenizer.ggml.pre is not a string", path);
    v.pre = pre->s;
  }
  auto id = [&](const char *key) -> std::optional<int32_t> {
    const format::GgufValue *x = file.find(key);
    if (x == nullptr) return std::nullopt;
    return static_cast<int32_t>(x->as_uint(key));
  };
  auto flag = [&](const char *key) {
    const format::GgufValue *x = file.find(key);
    return x != nullptr && x->type == format::GgufType::boolean && x->u != 0;
  };
  v.bos_id = id("tokenizer.ggml.bos_token_id");
  v.eos_id = id("tokenizer.ggml.eos_token_id");
  v.add_bos = flag("tokenizer.ggml.add_bos_token");
  v.add_eos = flag("tokenizer.ggml.add_eos_token");
  return v;
}

Tokenizer Tokenizer::from_gguf_file(const std::string &path) {
  const format::GgufFile file = format::GgufFile::open(path);
  return from_gguf_vocab(gguf_vocab_from_file(file), path);
}

}  // namespace ep::tokenizer
