// GGUF tokenizer metadata -> GgufVocab (see Tokenizer::from_gguf_vocab / from_gguf_file).
#pragma once

#include "tokenizer/tokenizer.hpp"

namespace ep::format {
class GgufFile;
class GgufWriter;
}

namespace ep::tokenizer {

/// Reads tokenizer.ggml.{model,tokens,merges,token_type,pre,bos_token_id,eos_token_id,
/// add_bos_token,add_eos_token} from a parsed GGUF. Throws Status::not_found when tokens or
/// model are missing and Status::unsupported unless the model is "gpt2".
GgufVocab gguf_vocab_from_file(const format::GgufFile &file);

/// Adds a vocabulary's tokenizer.ggml.* keys (model "gpt2") to a GGUF being written.
void add_gguf_vocab_keys(format::GgufWriter &writer, const GgufVocab &vocab);

}  // namespace ep::tokenizer
