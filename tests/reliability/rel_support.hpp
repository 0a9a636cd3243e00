// Shared by the reliability tests: a small seeded synthetic DeepSeek-V4 model written in code,
// opened through the C API with its Expert Pack in a scratch directory, and greedy generation /
// scoring helpers that return everything a comparison needs.
#pragma once

#include "support/catch.hpp"
#include "support/temp_dir.hpp"
#include "testkit/deepseek_v4_gguf.hpp"

#include <expertpack/expertpack.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace ep::rel {

/// A small model (4 layers, 8 experts, top-2) written to @p path; 1 MiB or so.
inline std::string write_small_model(const std::string &path, uint64_t seed = 11) {
  testkit::DeepseekV4SyntheticSpec spec;
  spec.seed = seed;
  testkit::write_deepseek_v4_synthetic_gguf(spec, path);
  return path;
}

/// The smallest model that still exercises every part (2 layers: sliding and CSA; 4 experts,
/// top-2): for loops of many open/close cycles.
inline std::string write_tiny_model(const std::string &path, uint64_t seed = 12) {
  testkit::DeepseekV4SyntheticSpec spec;
  spec.seed = seed;
  spec.vocab = 64;
  spec.hidden = 64;
  spec.n_heads = 2;
  spec.head_dim = 32;
  spec.rope_dim = 8;
  spec.q_lora_rank = 32;
  spec.o_groups = 2;
  spec.o_lora_rank = 16;
  spec.n_experts = 4;
  spec.moe_ff = 32;
  spec.index_n_heads = 2;
  spec.index_head_dim = 16;
  spec.index_topk = 2;
  spec.sliding_window = 8;
  spec.compress_ratios = {0, 4};
  testkit::write_deepseek_v4_synthetic_gguf(spec, path);
  return path;
}

struct ModelHandle {
  ep_model *model = nullptr;
  ModelHandle() = default;
  ModelHandle(const ModelHandle &) = delete;
  ModelHandle &operator=(const ModelHandle &) = delete;
  ~ModelHandle() { ep_model_close(model); }
};

/// Options with the pack placed in @p pack_dir and the cache budget given (0 = every expert).
inline ep_model_options options_in(const std::string &pack_dir, uint64_t cache_bytes = 0, int pack_build = 1) {
  ep_model_options o;
  ep_model_options_init(&o);
  o.device = EP_DEVICE_CPU;
  o.pack_dir = pack_dir.c_str();
  o.cache_budget_bytes = cache_bytes;
  o.pack_build = pack_build;
  o.direct_io = 0;  // tmpfs and overlay file systems reject O_DIRECT; the reader falls back anyway
  return o;
}
/// The options keep a pointer to @p pack_dir: a temporary would dangle.
ep_model_options options_in(std::string &&pack_dir, uint64_t cache_bytes = 0, int pack_build = 1) = delete;

struct Tokens {
  std::vector<int32_t> ids;
};

inline int collect_token(int32_t token, uint32_t, void *payload) {
  static_cast<Tokens *>(payload)->ids.push_back(token);
  return 0;
}

/// Greedy generation of @p n tokens after @p prompt on a fresh session; EP_OK or the status.
inline ep_status generate(ep_model *m, const std::vector<int32_t> &prompt, uint32_t n, std::vector<int32_t> &out,
                          float temperature = 0.0f, uint64_t seed = 0) {
  out.clear();
  ep_session *s = nullptr;
  ep_status st = ep_session_open(&s, m);
  if (st != EP_OK) return st;
  ep_generate_options g;
  ep_generate_options_init(&g);
  g.max_new_tokens = n;
  g.temperature = temperature;
  g.seed = seed;
  Tokens t;
  st = ep_generate(nullptr, s, prompt.data(), prompt.size(), &g, collect_token, &t);
  ep_session_close(s);
  out = std::move(t.ids);
  return st;
}

/// Full logits of @p tokens (teacher-forced) on a fresh session.
inline ep_status score(ep_model *m, const std::vector<int32_t> &tokens, uint32_t vocab, std::vector<float> &out) {
  out.assign(tokens.size() * vocab, 0.0f);
  ep_session *s = nullptr;
  ep_status st = ep_session_open(&s, m);
  if (st != EP_OK) return st;
  st = ep_score(s, tokens.data(), tokens.size(), 0, nullptr, out.data());
  ep_session_close(s);
  return st;
}

inline bool same_bits(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace ep::rel
