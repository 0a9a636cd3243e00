// DeepSeek-V4 on the CPU backend against the transformers oracle (tests/oracle/deepseek_v4.py):
// teacher-forced logits of two tiny seeded models, from the GGUF the oracle wrote and from a
// safetensors checkpoint rebuilt here with the exact names, shapes and contents (fingerprints)
// of what transformers' save_pretrained() wrote; prefill + decode equals full recompute; the
// tensor name map is fail-closed. The goldens live in tests/data/deepseek_v4 and are required.
#include "support/catch.hpp"

#include "backend/cpu_backend.hpp"
#include "backend/dequant.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "format/gguf.hpp"
#include "format/gguf_writer.hpp"
#include "format/safetensors.hpp"
#include "model/deepseek_v4.hpp"
#include "model/weight_catalog.hpp"
#include "support/deepseek_v4_golden.hpp"

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace fs = std::filesystem;
using nlohmann::json;
using ep::model::DeepseekV4Model;

using namespace deepseek_v4test;

TEST_CASE("deepseek_v4: the GGUF config is what the oracle ran", "[model][deepseek_v4]") {
  for (const char *name : kConfigs) {
    const Golden g = load_golden(name);
    const json &c = g.meta.at("config");
    const ep::model::DeepseekV4Config cfg = ep::model::DeepseekV4Config::from_gguf(ep::format::GgufSet::open(g.gguf));
    INFO(name << ": " << cfg.summary());
    CHECK(cfg.vocab == c.at("vocab").get<int64_t>());
    CHECK(cfg.hidden == c.at("hidden").get<int64_t>());
    CHECK(cfg.n_layers == c.at("layers").get<int64_t>());
    CHECK(cfg.n_heads == c.at("heads").get<int64_t>());
    CHECK(cfg.head_dim == c.at("head_dim").get<int64_t>());
    CHECK(cfg.rope_dim == c.at("rope_dim").get<int64_t>());
    CHECK(cfg.sliding_window == c.at("window").get<int64_t>());
    CHECK(cfg.hc_sinkhorn_iters == c.at("sinkhorn").get<int64_t>());
    CHECK(cfg.n_hash_layers == c.at("n_hash").get<int64_t>());
    CHECK(cfg.swiglu_limit[0] == c.at("swiglu_limit").get<float>());
    for (int64_t il = 0; il < cfg.n_layers; ++il) {
      CHECK(cfg.compress_ratio[static_cast<size_t>(il)] == c.at("ratios")[static_cast<size_t>(il)].get<int32_t>());
      const std::string lt = c.at("layer_types")[static_cast<size_t>(il)].get<std::string>();
      const ep::model::AttnKind want = lt == "sliding_attention" ? ep::model::AttnKind::sliding
                                       : lt == "compressed_sparse_attention" ? ep::model::AttnKind::csa
                                                                              : ep::model::AttnKind::hca;
      CHECK(cfg.attn_kind[static_cast<size_t>(il)] == want);
    }
    // the same config from the transformers config.json
    const ep::model::DeepseekV4Config hf =
        ep::model::DeepseekV4Config::from_hf_json(g.meta.at("hf_config_json").dump(), std::string(name) + "/config.json");
    CHECK(hf.summary() == cfg.summary());
    CHECK(hf.yarn_factor == cfg.yarn_factor);
    CHECK(hf.compress_rope_theta == cfg.compress_rope_theta);
    CHECK(hf.rms_eps == cfg.rms_eps);
    CHECK(hf.routed_scale == cfg.routed_scale);
    // RoPE inverse frequencies (main: plain; compress: YaRN, attention factor 1) as transformers had them
    for (const bool comp : {false, true}) {
      ep::backend::RopeParams p;
      p.n_dims = static_cast<int32_t>(cfg.rope_dim);
      p.dim_offset = static_cast<int32_t>(cfg.head_dim - cfg.rope_dim);
      p.theta = comp ? cfg.compress_rope_theta : cfg.rope_theta;
      if (comp) {
        p.yarn_factor = cfg.yarn_factor;
        p.yarn_original_max_positions = cfg.yarn_original_max_positions;
        p.yarn_beta_fast = cfg.yarn_beta_fast;
        p.yarn_beta_slow = cfg.yarn_beta_slow;
      }
      const std::vector<float> inv = ep::backend::rope_inv_freq(p, static_cast<int32_t>(cfg.head_dim));
      const json &ref = g.meta.at("rope").at(comp ? "compress" : "main");
      REQUIRE(inv.size() == ref.at("inv_freq").size());
      for (size_t i = 0; i < inv.size(); ++i) {
        const double r = ref.at("inv_freq")[i].get<double>();
        CHECK(std::fabs(inv[i] - r) <= 2e-6 * std::fabs(r));
      }
      CHECK(ref.at("attention_scaling").get<double>() == 1.0);
    }
  }
}

TEST_CASE("deepseek_v4: GGUF logits match transformers", "[model][deepseek_v4]") {
  ep::backend::CpuBackend cpu;
  for (const char *name : kConfigs) {
    const Golden g = load_golden(name);
    auto model = DeepseekV4Model::open(g.gguf, cpu);
    const Diff d = compare(run_full(*model, g.tokens), g.logits);
    std::printf("deepseek_v4 %s GGUF: max|dlogit| %.3g, max|logit| %.4g, ratio %.3g (limit 1e-4)\n", name, d.max_abs_diff,
                d.max_abs_ref, d.rel());
    INFO(name << ": max |dlogit| " << d.max_abs_diff << " of max |logit| " << d.max_abs_ref);
    CHECK(d.rel() <= 1e-4);
  }
}

TEST_CASE("deepseek_v4: safetensors logits match transformers", "[model][deepseek_v4]") {
  ep::backend::CpuBackend cpu;
  for (const char *name : kConfigs) {
    const Golden g = load_golden(name);
    const fs::path dir = scratch_dir(name);
    write_checkpoint(g, dir);
    auto model = DeepseekV4Model::open(dir.string(), cpu);
    const Diff d = compare(run_full(*model, g.tokens), g.logits);
    std::printf("deepseek_v4 %s safetensors: max|dlogit| %.3g, max|logit| %.4g, ratio %.3g (limit 1e-4)\n", name,
                d.max_abs_diff, d.max_abs_ref, d.rel());
    INFO(name << ": max |dlogit| " << d.max_abs_diff << " of max |logit| " << d.max_abs_ref);
    CHECK(d.rel() <= 1e-4);
    fs::remove_all(dir);
  }
}

TEST_CASE("deepseek_v4: prefill + decode equals full recompute", "[model][deepseek_v4]") {
  ep::backend::CpuBackend cpu;
  for (const char *name : kConfigs) {
    const Golden g = load_golden(name);
    auto model = DeepseekV4Model::open(g.gguf, cpu);
    const std::vector<float> full = run_full(*model, g.tokens);
    const int64_t V = model->config().vocab, S = g.n_tokens;
    // prefill 37 tokens, then decode one at a time
    {
      ep::model::DeepseekV4State st = model->new_state();
      std::vector<float> got(full.size());
      model->forward(g.tokens.data(), 37, st, got.data());
      for (int64_t t = 37; t < S; ++t) model->forward(g.tokens.data() + t, 1, st, got.data() + t * V);
      const Diff d = compare(got, full);
      std::printf("deepseek_v4 %s prefill 37 + decode: max|dlogit| vs full %.3g\n", name, d.max_abs_diff);
      CHECK(d.max_abs_diff <= 1e-5 * d.max_abs_ref);
    }
    // uneven chunks that cut compressor windows in the middle
    {
      ep::model::DeepseekV4State st = model->new_state();
      std::vector<float> got(full.size());
      const int64_t cuts[] = {0, 3, 4, 13, 30, 31, S};
      for (size_t i = 0; i + 1 < std::size(cuts); ++i)
        model->forward(g.tokens.data() + cuts[i], cuts[i + 1] - cuts[i], st, got.data() + cuts[i] * V);
      const Diff d = compare(got, full);
      CHECK(d.max_abs_diff <= 1e-5 * d.max_abs_ref);
    }
  }
}

TEST_CASE("deepseek_v4: the safetensors name map is fail-closed", "[model][deepseek_v4]") {
  ep::backend::CpuBackend cpu;
  const Golden g = load_golden("deepseek_v4_b");
  SECTION("an unmapped tensor is an error naming it") {
    const fs::path dir = scratch_dir("extra");
    write_checkpoint(g, dir, "", "model.layers.0.attn.bogus.weight");
    try {
      (void)DeepseekV4Model::open(dir.string(), cpu);
      FAIL("an unmapped tensor was accepted");
    } catch (const ep::Error &e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find("model.layers.0.attn.bogus.weight") != std::string::npos);
      CHECK(std::string(e.what()).find("unmapped") != std::string::npos);
    }
    fs::remove_all(dir);
  }
  SECTION("a missing tensor is an error naming it") {
    const fs::path dir = scratch_dir("missing");
    write_checkpoint(g, dir, "model.layers.1.attn.indexer.wq_b.weight");
    try {
      (void)DeepseekV4Model::open(dir.string(), cpu);
      FAIL("a missing tensor was accepted");
    } catch (const ep::Error &e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find("blk.1.indexer.attn_q_b.weight") != std::string::npos);
      CHECK(std::string(e.what()).find("missing") != std::string::npos);
    }
    fs::remove_all(dir);
  }
  SECTION("a mis-shaped tensor is an error naming it") {
    json meta = g.meta;
    meta["hf_config_json"]["q_lora_rank"] = meta["hf_config_json"]["q_lora_rank"].get<int>() + 8;
    Golden h = g;
    h.meta = meta;
    const fs::path dir = scratch_dir("shape");
    write_checkpoint(h, dir);
    try {
      (void)DeepseekV4Model::open(dir.string(), cpu);
      FAIL("a mis-shaped tensor was accepted");
    } catch (const ep::Error &e) {
      INFO(e.what());
      CHECK(e.status() == ep::Status::shape);
      CHECK(std::string(e.what()).find("blk.0.attn_q_a.weight") != std::string::npos);
    }
    fs::remove_all(dir);
  }
}

namespace {
/// Copies a GGUF, dropping tensor @p drop and adding f32 [4] tensors @p extra (comma-separated;
/// either may be ""), with metadata values replaced from @p meta and keys @p drop_keys left out.
void copy_gguf(const std::string &from, const std::string &to, const std::string &drop, const std::string &extra,
               const std::vector<std::pair<std::string, ep::format::GgufValue>> &meta = {},
               const std::vector<std::string> &drop_keys = {}) {
  const ep::format::GgufFile src = ep::format::GgufFile::open(from);
  ep::format::GgufWriter w;
  for (const auto &kv : src.metadata()) {
    const std::string &key = kv.first;
    if (key == "general.alignment") continue;
    if (std::find(drop_keys.begin(), drop_keys.end(), key) != drop_keys.end()) continue;
    auto it = std::find_if(meta.begin(), meta.end(), [&](const auto &m) { return m.first == key; });
    w.add(key, it == meta.end() ? kv.second : it->second);
  }
  for (const auto &m : meta)
    if (!src.find(m.first)) w.add(m.first, m.second);
  std::vector<const ep::format::GgufTensorInfo *> kept;
  for (const auto &t : src.tensors()) {
    if (t.name == drop) continue;
    std::vector<uint64_t> ne(t.ne.begin(), t.ne.begin() + t.n_dims);
    w.add_tensor(t.name, t.type, ne);
    kept.push_back(&t);
  }
  for (size_t p = 0; p < extra.size();) {
    size_t q = extra.find(',', p);
    if (q == std::string::npos) q = extra.size();
    w.add_tensor(extra.substr(p, q - p), ep::format::GgmlType::f32, {4});
    p = q + 1;
  }
  w.write(to, 1, [&](size_t i, uint64_t off, std::span<uint8_t> out) {
    if (i < kept.size())
      src.source().read(kept[i]->file_offset + off, out.data(), out.size());
    else
      std::fill(out.begin(), out.end(), uint8_t{0});
  });
}
}  // namespace

TEST_CASE("deepseek_v4: the GGUF name map is fail-closed", "[model][deepseek_v4]") {
  ep::backend::CpuBackend cpu;
  const Golden g = load_golden("deepseek_v4_b");
  const fs::path dir = scratch_dir("gguf");
  const std::string extra = (dir / "extra.gguf").string(), missing = (dir / "missing.gguf").string();
  copy_gguf(g.gguf, extra, "", "blk.0.bogus.weight");
  copy_gguf(g.gguf, missing, "blk.0.attn_sinks.weight", "");
  // the copy itself is faithful: it loads when nothing is changed
  const std::string same = (dir / "same.gguf").string();
  copy_gguf(g.gguf, same, "", "");
  CHECK_NOTHROW(DeepseekV4Model::open(same, cpu));
  try {
    (void)DeepseekV4Model::open(extra, cpu);
    FAIL("an unexpected tensor was accepted");
  } catch (const ep::Error &e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find("unexpected [blk.0.bogus.weight") != std::string::npos);
  }
  try {
    (void)DeepseekV4Model::open(missing, cpu);
    FAIL("a missing tensor was accepted");
  } catch (const ep::Error &e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find("missing [blk.0.attn_sinks.weight]") != std::string::npos);
  }
  fs::remove_all(dir);
}

TEST_CASE("deepseek_v4: MTP layers in a GGUF are skipped", "[model][deepseek_v4]") {
  ep::backend::CpuBackend cpu;
  const Golden g = load_golden("deepseek_v4_b");
  const fs::path dir = scratch_dir("mtp");
  const std::string path = (dir / "mtp.gguf").string();
  copy_gguf(g.gguf, path, "", "blk.2.nextn.eh_proj.weight,blk.2.attn_norm.weight",
            {{"deepseek4.block_count", ep::format::GgufValue::make_u32(3)},
             {"deepseek4.nextn_predict_layers", ep::format::GgufValue::make_u32(1)}});
  auto model = DeepseekV4Model::open(path, cpu);
  CHECK(model->config().n_layers == 2);
  CHECK(model->config().n_mtp_layers == 1);
  const Diff d = compare(run_full(*model, g.tokens), g.logits);
  CHECK(d.rel() <= 1e-4);
  fs::remove_all(dir);
}

namespace {
struct CapturedLog {
  std::vector<std::string> info;
};
void capture_log(ep_log_level level, const char *message, void *payload) {
  if (level == EP_LOG_INFO) static_cast<CapturedLog *>(payload)->info.emplace_back(message);
}
}  // namespace

TEST_CASE("deepseek_v4: metadata with one legal value is defaulted when missing, refused when different",
          "[model][deepseek_v4]") {
  ep::backend::CpuBackend cpu;
  const Golden g = load_golden("deepseek_v4_a");
  const fs::path dir = scratch_dir("defaults");
  const std::string a = "deepseek4.";
  // ds4 accepts files without these: they have one value for DeepSeek-V4 (the scaling type is
  // YaRN when a scaling factor is given)
  const std::vector<std::string> left_out = {a + "expert_gating_func", a + "attention.head_count_kv",
                                             a + "attention.value_length", a + "rope.scaling.type"};
  for (const std::string &k : left_out) REQUIRE(ep::format::GgufFile::open(g.gguf).find(k) != nullptr);
  const std::string bare = (dir / "bare.gguf").string();
  copy_gguf(g.gguf, bare, "", "", {}, left_out);
  CapturedLog log;
  ep::log::configure(EP_LOG_INFO, capture_log, &log);
  std::unique_ptr<DeepseekV4Model> model;
  try {
    model = DeepseekV4Model::open(bare, cpu);
  } catch (...) {
    ep::log::configure(EP_LOG_WARN, nullptr, nullptr);
    throw;
  }
  ep::log::configure(EP_LOG_WARN, nullptr, nullptr);
  const std::vector<float> got = run_full(*model, g.tokens);
  const std::vector<float> want = run_full(*DeepseekV4Model::open(g.gguf, cpu), g.tokens);
  REQUIRE(got.size() == want.size());
  CHECK(std::memcmp(got.data(), want.data(), got.size() * 4) == 0);  // the same model, bit for bit
  std::string defaulted;
  for (const std::string &line : log.info)
    if (line.find("metadata missing") != std::string::npos) defaulted = line;
  INFO(defaulted);
  CHECK(defaulted.find(bare) != std::string::npos);
  for (const std::string &k : left_out) CHECK(defaulted.find(k) != std::string::npos);
  CHECK(defaulted.find("expert_gating_func = 4 (sqrt-softplus)") != std::string::npos);
  // the YaRN default matters: without a scaling factor either, the file opens unscaled and differs
  const std::string unscaled = (dir / "unscaled.gguf").string();
  copy_gguf(g.gguf, unscaled, "", "", {}, {a + "rope.scaling.type", a + "rope.scaling.factor"});
  const std::vector<float> plain = run_full(*DeepseekV4Model::open(unscaled, cpu), g.tokens);
  CHECK(std::memcmp(plain.data(), want.data(), plain.size() * 4) != 0);

  // present with another value: refused naming the key, the value and the file
  struct Wrong {
    std::string key;
    ep::format::GgufValue value;
    std::string said;
  };
  const std::vector<Wrong> wrong = {
      {a + "expert_gating_func", ep::format::GgufValue::make_u32(2), a + "expert_gating_func is 2, DeepSeek-V4 allows only 4"},
      {a + "attention.head_count_kv", ep::format::GgufValue::make_u32(2), a + "attention.head_count_kv is 2"},
      {a + "attention.value_length", ep::format::GgufValue::make_u32(7), a + "attention.value_length is 7"},
      {a + "expert_group_count", ep::format::GgufValue::make_u32(8), a + "expert_group_count is 8"},
      {a + "rope.scaling.type", ep::format::GgufValue::make_string("linear"), a + "rope.scaling.type is \"linear\", DeepSeek-V4 allows only \"yarn\""},
  };
  for (const Wrong &w : wrong) {
    const std::string path = (dir / "wrong.gguf").string();
    copy_gguf(g.gguf, path, "", "", {{w.key, w.value}});
    try {
      (void)DeepseekV4Model::open(path, cpu);
      FAIL(w.key << " = " << w.value.to_string() << " was accepted");
    } catch (const ep::Error &e) {
      INFO(e.what());
      CHECK(e.status() == ep::Status::unsupported);
      CHECK(std::string(e.what()).find(path) != std::string::npos);
      CHECK(std::string(e.what()).find(w.said) != std::string::npos);
    }
  }
  fs::remove_all(dir);
}
