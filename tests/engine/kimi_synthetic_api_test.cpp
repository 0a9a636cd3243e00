// The synthetic Kimi writer (testkit/kimi_gguf) end to end through the C API: a tiny
// seeded Kimi-K3 GGUF written as a 3-shard set, packed on first use (pack layer 0 = block 1),
// generated from with a cache of top_k experts (evictions) exactly like the resident reference,
// its own Kimi-K3 chat tokenizer; reproducible bytes per seed; the Kimi-Linear variant; and the
// K3-shaped preset's sizes (real dims: 896 latent experts of 3584 × 3072, Q2_K / Q3_K); a
// checkpoint's tiktoken tokenizer beside a GGUF without one, and the chat template by architecture.
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

#include "format/gguf.hpp"
#include "kimi_capi_support.hpp"
#include "testkit/kimi_gguf.hpp"

#include <expertpack/expertpack.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using ep::testkit::KimiSyntheticSpec;
using kimicapi::open_model;
using kimitest::slurp;

std::vector<int32_t> generate(ep_model *m, const std::vector<int32_t> &prompt, uint32_t n, float temperature) {
  return kimicapi::generate(m, prompt, n, temperature, 7);
}

std::vector<float> score(ep_model *m, const std::vector<int32_t> &tokens, size_t vocab) {
  return kimicapi::score_all(m, tokens, vocab);
}

}  // namespace

TEST_CASE("kimi synthetic: a tiny K3 in 3 shards is packed and generates through the C API", "[model][kimi][synthetic]") {
  ep::test::TempDir dir;
  KimiSyntheticSpec spec = KimiSyntheticSpec::tiny(6);
  spec.seed = 11;
  spec.shards = 3;
  const std::string first = ep::testkit::write_kimi_synthetic_gguf(spec, dir.str() + "/k3-tiny.gguf");
  CHECK(first == ep::format::split_path(dir.str() + "/k3-tiny", 1, 3));
  for (uint32_t k = 1; k <= 3; ++k) CHECK(fs::exists(ep::format::split_path(dir.str() + "/k3-tiny", k, 3)));
  const std::string packs = dir.str() + "/packs";

  ep_model *big = open_model(first, packs, 0, 0);
  ep_model_properties p;
  ep_model_properties_init(&p);
  REQUIRE(ep_model_info(&p, big) == EP_OK);
  CHECK(std::string(p.architecture) == "kimi-k3");
  CHECK(p.num_layers == 6);
  CHECK(p.hidden_size == 256);
  CHECK(p.num_experts == 32);
  CHECK(p.experts_per_token == 4);
  CHECK(p.vocab_size == 512);
  ep_pack *pack = nullptr;
  REQUIRE(ep_pack_open(&pack, ep_model_pack_path(big), nullptr) == EP_OK);
  ep_pack_properties pp;
  ep_pack_properties_init(&pp);
  REQUIRE(ep_pack_info(&pp, pack) == EP_OK);
  CHECK(pp.first_layer == 1);
  CHECK(pp.num_layers == 5);
  ep_pack_close(pack);
  const uint64_t slot = kimicapi::store_stats(big).slot_bytes;
  const std::vector<int32_t> prompt = {5, 80, 81, 300, 17, 42};
  const std::vector<float> logits = score(big, prompt, 512);
  bool finite = true;
  float lo = logits[0], hi = logits[0];
  for (float v : logits) {
    finite = finite && std::isfinite(v);
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  CHECK(finite);
  CHECK(hi - lo > 1e-3f);  // not a constant output
  ep_model_close(big);

  // A cache of top_k slots evicts, and changes nothing; neither does reading the experts from
  // the source (resident).
  ep_model *small = open_model(first, packs, slot * 4, 0);
  const std::vector<int32_t> greedy = generate(small, prompt, 10, 0.0f);
  const std::vector<int32_t> sampled = generate(small, prompt, 10, 0.8f);
  CHECK(kimicapi::store_stats(small).cache_evictions > 0);
  ep_model *resident = open_model(first, packs, 0, 1);
  CHECK(generate(resident, prompt, 10, 0.0f) == greedy);
  CHECK(generate(resident, prompt, 10, 0.8f) == sampled);
  CHECK(score(resident, prompt, 512) == logits);

  // The model's own tokenizer: byte-level with Kimi-K3's chat markers; chat generation runs.
  ep_tokenizer *tok = nullptr;
  REQUIRE(ep_tokenizer_open_model(&tok, small) == EP_OK);
  ep_tokenizer_properties tp;
  ep_tokenizer_properties_init(&tp);
  REQUIRE(ep_tokenizer_info(&tp, tok) == EP_OK);
  CHECK(tp.chat_template == EP_CHAT_TEMPLATE_KIMI_K3);
  CHECK(tp.vocab_size == 512);
  int32_t eom = -1;
  REQUIRE(ep_tokenizer_token_id(&eom, tok, "<|end_of_msg|>") == EP_OK);
  CHECK(tp.end_of_turn_id == eom);
  CHECK(kimicapi::chat(small, tok, "Hello Kimi", 6).prompt_tokens > 10);  // one token per byte plus the markers
  ep_tokenizer_close(tok);
  ep_model_close(resident);
  ep_model_close(small);
}

TEST_CASE("kimi synthetic: bytes are a function of the seed; one file equals the shard set", "[model][kimi][synthetic]") {
  ep::test::TempDir dir;
  KimiSyntheticSpec spec = KimiSyntheticSpec::tiny(5);
  spec.seed = 3;
  const std::string a = ep::testkit::write_kimi_synthetic_gguf(spec, dir.str() + "/a.gguf");
  const std::string b = ep::testkit::write_kimi_synthetic_gguf(spec, dir.str() + "/b.gguf");
  CHECK(slurp(a) == slurp(b));
  CHECK(fs::file_size(a) > ep::testkit::kimi_synthetic_tensor_bytes(spec));
  spec.seed = 4;
  const std::string c = ep::testkit::write_kimi_synthetic_gguf(spec, dir.str() + "/c.gguf");
  CHECK(slurp(a) != slurp(c));
  spec.seed = 3;
  spec.shards = 2;
  const std::string split = ep::testkit::write_kimi_synthetic_gguf(spec, dir.str() + "/split.gguf");
  const std::vector<int32_t> tokens = {1, 2, 3, 258, 259, 100, 7};
  ep_model *one = open_model(a, dir.str() + "/packs", 0, 0);
  ep_model *two = open_model(split, dir.str() + "/packs", 0, 0);
  CHECK(score(one, tokens, 512) == score(two, tokens, 512));
  ep_model_close(two);
  ep_model_close(one);
}

TEST_CASE("kimi synthetic: the Kimi-Linear variant, MXFP4 experts and zipf routing", "[model][kimi][synthetic]") {
  ep::test::TempDir dir;
  KimiSyntheticSpec spec = KimiSyntheticSpec::tiny(4);
  spec.k3 = false;
  spec.expert_gate_up = spec.expert_down = ep::format::GgmlType::mxfp4;
  spec.router_zipf = 1.0;
  const std::string path = ep::testkit::write_kimi_synthetic_gguf(spec, dir.str() + "/linear.gguf");
  ep_model *m = open_model(path, dir.str() + "/packs", 0, 0);
  ep_model_properties p;
  ep_model_properties_init(&p);
  REQUIRE(ep_model_info(&p, m) == EP_OK);
  CHECK(std::string(p.architecture) == "kimi-linear");
  const std::vector<int32_t> out = generate(m, {9, 8, 7}, 5, 0.0f);
  CHECK(out.size() == 5);
  ep_model_close(m);
  // The K3 features are flags of the file: the K3 file has the K3 tensors, this one has none.
  const ep::format::GgufFile f = ep::format::GgufFile::open(path);
  CHECK(f.find_tensor("blk.1.ssm_g_a.weight") != nullptr);
  CHECK(f.find_tensor("blk.1.ssm_g.weight") == nullptr);
  CHECK(f.find_tensor("blk.1.attn_res_score.weight") == nullptr);
  CHECK(f.find("kimi-linear.activation.situ_beta") == nullptr);
}

TEST_CASE("kimi synthetic: the K3-shaped preset has Kimi-K3's published sizes", "[model][kimi][synthetic]") {
  const KimiSyntheticSpec s = KimiSyntheticSpec::k3_shaped(93);
  CHECK(s.n_layers() == 93);
  CHECK(std::count(s.mla_layers.begin(), s.mla_layers.end(), true) == 24);
  CHECK(s.mla_layers[3]);
  CHECK(s.mla_layers[91]);
  CHECK(s.mla_layers[92]);
  CHECK(!s.mla_layers[90]);
  CHECK(s.hidden == 7168);
  CHECK(s.n_experts == 896);
  CHECK(s.n_experts_used == 16);
  CHECK(s.latent() == 3584);
  CHECK(s.moe_ff == 3072);
  CHECK(s.vocab == 163840);
  // Q2_K gate/up (84 bytes per 256) and Q3_K down (110 bytes per 256) per MoE layer:
  const uint64_t per_expert = 2 * (3584ull * 3072 / 256 * 84) + 3072ull * 3584 / 256 * 110;
  CHECK(ep::testkit::kimi_synthetic_expert_layer_bytes(s) == 896 * per_expert);
  // 92 MoE layers ≈ 0.98 TB of routed experts (the published Q2_K GGUF's ~1 TB).
  const double tb = 92.0 * static_cast<double>(ep::testkit::kimi_synthetic_expert_layer_bytes(s)) / 1e12;
  CHECK(tb > 0.9);
  CHECK(tb < 1.1);
}

namespace {

std::string base64(const std::string &in) {
  static const char *k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = (uint32_t(uint8_t(in[i])) << 16) | (uint32_t(uint8_t(in[i + 1])) << 8) | uint8_t(in[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += k[(v >> s) & 63];
  }
  if (i + 1 == in.size()) {
    const uint32_t v = uint32_t(uint8_t(in[i])) << 16;
    out += k[(v >> 18) & 63];
    out += k[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    const uint32_t v = (uint32_t(uint8_t(in[i])) << 16) | (uint32_t(uint8_t(in[i + 1])) << 8);
    out += k[(v >> 18) & 63];
    out += k[(v >> 12) & 63];
    out += k[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

/// A Kimi-style tiktoken checkpoint tokenizer in @p dir: ranks 0..255 the bytes, 256 "he",
/// 257 "ll", 258 "hell", 259 "hello"; tokenizer_config.json specials from id 300 ([BOS],
/// <|end_of_msg|>, and with @p chat_markers K3's <|open|> <|sep|> <|close|>).
void write_tiktoken(const std::string &dir, bool chat_markers) {
  std::ofstream f(dir + "/tiktoken.model", std::ios::binary);
  int rank = 0;
  for (int b = 0; b < 256; ++b) f << base64(std::string(1, static_cast<char>(b))) << " " << rank++ << "\n";
  for (const char *m : {"he", "ll", "hell", "hello"}) f << base64(m) << " " << rank++ << "\n";
  nlohmann::json specials = {{"300", {{"content", "[BOS]"}, {"special", true}}},
                             {"301", {{"content", "<|end_of_msg|>"}, {"special", true}}}};
  if (chat_markers) {
    specials["302"] = {{"content", "<|open|>"}, {"special", true}};
    specials["303"] = {{"content", "<|sep|>"}, {"special", true}};
    specials["304"] = {{"content", "<|close|>"}, {"special", true}};
  }
  std::ofstream(dir + "/tokenizer_config.json")
      << nlohmann::json{{"added_tokens_decoder", specials}, {"bos_token", "[BOS]"}, {"eos_token", "<|end_of_msg|>"}}.dump();
}

}  // namespace

TEST_CASE("kimi synthetic: the checkpoint's tiktoken tokenizer beside a GGUF without one", "[model][kimi][tokenizer]") {
  ep::test::TempDir dir;
  KimiSyntheticSpec spec = KimiSyntheticSpec::tiny(4);
  spec.chat_tokenizer = false;
  const std::string path = ep::testkit::write_kimi_synthetic_gguf(spec, dir.str() + "/k3.gguf");
  ep_model *m = open_model(path, dir.str() + "/packs", 0, 0);
  ep_tokenizer *tok = nullptr;
  CHECK(ep_tokenizer_open_model(&tok, m) == EP_ERR_NOT_FOUND);
  CHECK(std::string(ep_last_error()).find("tiktoken.model") != std::string::npos);

  write_tiktoken(dir.str(), true);
  REQUIRE(ep_tokenizer_open_model(&tok, m) == EP_OK);
  ep_tokenizer_properties tp;
  ep_tokenizer_properties_init(&tp);
  REQUIRE(ep_tokenizer_info(&tp, tok) == EP_OK);
  CHECK(tp.vocab_size == 305);
  CHECK(tp.chat_template == EP_CHAT_TEMPLATE_KIMI_K3);
  CHECK(tp.bos_id == 300);
  CHECK(tp.end_of_turn_id == 301);
  int32_t ids[8] = {};
  size_t n = 0;
  REQUIRE(ep_tokenize(ids, 8, &n, tok, "hello he", 8, 0) == EP_OK);
  REQUIRE(n == 3);
  CHECK(ids[0] == 259);
  CHECK(ids[1] == ' ');
  CHECK(ids[2] == 256);
  kimicapi::chat(m, tok, "hello", 4);
  ep_tokenizer_close(tok);

  // Without the markers in the tokenizer, the model's architecture (kimi-k3) picks the template.
  write_tiktoken(dir.str(), false);
  REQUIRE(ep_tokenizer_open_model(&tok, m) == EP_OK);
  ep_tokenizer_properties_init(&tp);
  REQUIRE(ep_tokenizer_info(&tp, tok) == EP_OK);
  CHECK(tp.chat_template == EP_CHAT_TEMPLATE_KIMI_K3);
  CHECK(tp.end_of_turn_id == 301);
  ep_tokenizer_close(tok);
  ep_model_close(m);

  // Kimi-Linear has another chat format: no template is assumed for it.
  spec.k3 = false;
  const std::string linear = ep::testkit::write_kimi_synthetic_gguf(spec, dir.str() + "/linear.gguf");
  ep_model *ml = open_model(linear, dir.str() + "/packs", 0, 0);
  REQUIRE(ep_tokenizer_open_model(&tok, ml) == EP_OK);
  ep_tokenizer_properties_init(&tp);
  REQUIRE(ep_tokenizer_info(&tp, tok) == EP_OK);
  CHECK(tp.chat_template == EP_CHAT_TEMPLATE_NONE);
  ep_tokenizer_close(tok);
  ep_model_close(ml);
}
