// Tokenizer from a GGUF file's tokenizer.ggml.* metadata (llama.cpp "gpt2" BPE vocabularies).
#include "core/error.hpp"
#include "format/gguf.hpp"
#include "format/gguf_writer.hpp"
#include "tokenizer/gguf_vocab.hpp"
#include "tokenizer/utf8.hpp"

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

void add_gguf_vocab_keys(format::GgufWriter &w, const GgufVocab &v) {
  using format::GgufType;
  using format::GgufValue;
  std::vector<GgufValue> tokens, merges, types;
  for (const std::string &t : v.tokens) tokens.push_back(GgufValue::make_string(t));
  for (const std::string &m : v.merges) merges.push_back(GgufValue::make_string(m));
  for (int32_t t : v.token_types) types.push_back(GgufValue::make_i32(t));
  w.add("tokenizer.ggml.model", GgufValue::make_string("gpt2"));
  w.add("tokenizer.ggml.pre", GgufValue::make_string(v.pre));
  w.add("tokenizer.ggml.tokens", GgufValue::make_array(GgufType::string, tokens));
  if (!merges.empty()) w.add("tokenizer.ggml.merges", GgufValue::make_array(GgufType::string, merges));
  if (!types.empty()) w.add("tokenizer.ggml.token_type", GgufValue::make_array(GgufType::i32, types));
  if (v.bos_id) w.add("tokenizer.ggml.bos_token_id", GgufValue::make_u32(static_cast<uint32_t>(*v.bos_id)));
  if (v.eos_id) w.add("tokenizer.ggml.eos_token_id", GgufValue::make_u32(static_cast<uint32_t>(*v.eos_id)));
  w.add("tokenizer.ggml.add_bos_token", GgufValue::make_bool(v.add_bos));
  w.add("tokenizer.ggml.add_eos_token", GgufValue::make_bool(v.add_eos));
}

}  // namespace ep::tokenizer
