// DeepSeek-V4 on the CPU backend against the transformers oracle (tests/oracle/deepseek_v4.py):
// teacher-forced logits of two tiny seeded models, from the GGUF the oracle wrote and from a
// safetensors checkpoint rebuilt here with the exact names, shapes and contents (fingerprints)
// of what transformers' save_pretrained() wrote; prefill + decode equals full recompute; the
// tensor name map is fail-closed. The goldens live in tests/data/deepseek_v4 and are required.
#include "support/catch.hpp"

#include "backend/cpu_backend.hpp"
#include "backend/dequant.hpp"
#include "core/error.hpp"
#include "format/gguf.hpp"
#include "format/gguf_writer.hpp"
#include "format/safetensors.hpp"
#include "model/deepseek_v4.hpp"
#include "model/weight_catalog.hpp"

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

namespace {

const char *const kConfigs[] = {"dsv4_a", "dsv4_b"};

std::string data_dir() { return std::string(EP_TEST_DATA_DIR) + "/deepseek_v4"; }

std::string slurp(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE(f.good());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Golden {
  std::string name;
  json meta;
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // [S][V]
  int64_t n_tokens = 0, vocab = 0;
  std::string gguf;
};

Golden load_golden(const std::string &name) {
  Golden g;
  g.name = name;
  const std::string base = data_dir() + "/" + name;
  INFO("golden files " << base << ".{json,logits.f32,gguf} must exist (tests/oracle/deepseek_v4.py writes them)");
  REQUIRE(fs::exists(base + ".json"));
  REQUIRE(fs::exists(base + ".logits.f32"));
  REQUIRE(fs::exists(base + ".gguf"));
  g.meta = json::parse(slurp(base + ".json"));
  for (const auto &t : g.meta.at("tokens")) g.tokens.push_back(t.get<int32_t>());
  g.n_tokens = g.meta.at("logits_shape")[0].get<int64_t>();
  g.vocab = g.meta.at("logits_shape")[1].get<int64_t>();
  REQUIRE(static_cast<int64_t>(g.tokens.size()) == g.n_tokens);
  const std::string raw = slurp(base + ".logits.f32");
  REQUIRE(raw.size() == static_cast<size_t>(g.n_tokens * g.vocab * 4));
  g.logits.resize(static_cast<size_t>(g.n_tokens * g.vocab));
  std::memcpy(g.logits.data(), raw.data(), raw.size());
  g.gguf = base + ".gguf";
  return g;
}

struct Diff {
  double max_abs_diff = 0, max_abs_ref = 0;
  double rel() const { return max_abs_diff / max_abs_ref; }
};

Diff compare(const std::vector<float> &got, const std::vector<float> &ref) {
  REQUIRE(got.size() == ref.size());
  Diff d;
  for (size_t i = 0; i < ref.size(); ++i) {
    REQUIRE(std::isfinite(got[i]));
    d.max_abs_diff = std::max(d.max_abs_diff, std::fabs(static_cast<double>(got[i]) - ref[i]));
    d.max_abs_ref = std::max(d.max_abs_ref, std::fabs(static_cast<double>(ref[i])));
  }
  return d;
}

std::vector<float> run_full(DeepseekV4Model &m, const std::vector<int32_t> &tokens) {
  ep::model::DeepseekV4State st = m.new_state();
  std::vector<float> logits(tokens.size() * static_cast<size_t>(m.config().vocab));
  m.forward(tokens.data(), static_cast<int64_t>(tokens.size()), st, logits.data());
  CHECK(st.n_past == static_cast<int64_t>(tokens.size()));
  return logits;
}

fs::path scratch_dir(const std::string &tag) {
  static int counter = 0;
  fs::path p = fs::temp_directory_path() / ("ep_dsv4_" + tag + "_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

/// Rebuilds the checkpoint transformers' save_pretrained() wrote (names, shapes, dtypes from the
/// oracle's manifest) from the GGUF, checks each tensor's fingerprint against the manifest, and
/// writes config.json + model.safetensors into @p dir. @p drop / @p extra edit the tensor list.
void write_checkpoint(const Golden &g, const fs::path &dir, const std::string &drop = "", const std::string &extra = "") {
  const ep::format::GgufFile gguf = ep::format::GgufFile::open(g.gguf);
  REQUIRE(g.meta.contains("saved_tensors"));
  std::vector<ep::format::StWriteTensor> infos;
  std::vector<std::vector<uint8_t>> data;
  for (const json &t : g.meta["saved_tensors"]) {
    const std::string name = t.at("name").get<std::string>();
    if (name == drop) continue;
    int64_t expert = -1;
    const std::string src = ep::model::dsv4_gguf_name(name, &expert);
    INFO("checkpoint tensor " << name << " -> " << src);
    REQUIRE(!src.empty());
    const ep::format::GgufTensorInfo *info = gguf.find_tensor(src);
    REQUIRE(info != nullptr);
    std::vector<uint8_t> raw = gguf.source().read_vector(info->file_offset, static_cast<size_t>(info->nbytes));
    std::vector<uint64_t> shape;
    for (const auto &s : t.at("shape")) shape.push_back(s.get<uint64_t>());
    uint64_t n = 1;
    for (uint64_t s : shape) n *= s;
    const std::string dtype = t.at("dtype").get<std::string>();
    std::vector<uint8_t> bytes;
    std::vector<double> values;
    if (dtype == "int64") {
      REQUIRE(info->type == ep::format::GgmlType::i32);
      REQUIRE(raw.size() == n * 4);
      bytes.resize(n * 8);
      for (uint64_t i = 0; i < n; ++i) {
        int32_t v32;
        std::memcpy(&v32, raw.data() + 4 * i, 4);
        const int64_t v = v32;
        std::memcpy(bytes.data() + 8 * i, &v, 8);
        values.push_back(static_cast<double>(v));
      }
      infos.push_back({name, ep::format::StDtype::i64, shape});
    } else {
      REQUIRE(dtype == "float32");
      const uint64_t total = info->ne[0] * info->ne[1] * info->ne[2] * info->ne[3];
      std::vector<float> f(total);
      ep::backend::dequantize_row(info->type, raw.data(), f.data(), static_cast<int64_t>(total));
      uint64_t first = 0;
      if (expert >= 0) first = static_cast<uint64_t>(expert) * info->ne[0] * info->ne[1];
      REQUIRE(first + n <= total);
      bytes.resize(n * 4);
      std::memcpy(bytes.data(), f.data() + first, n * 4);
      for (uint64_t i = 0; i < n; ++i) values.push_back(f[first + i]);
      infos.push_back({name, ep::format::StDtype::f32, shape});
    }
    // fingerprint: (Σx, Σx·w_i) with w_i = (i mod 251 + 1) / 251, as the oracle computed it
    double s0 = 0, s1 = 0, sa = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      s0 += values[i];
      s1 += values[i] * (static_cast<double>(i % 251) + 1) / 251.0;
      sa += std::fabs(values[i]);
    }
    const double f0 = t.at("fp")[0].get<double>(), f1 = t.at("fp")[1].get<double>();
    CHECK(std::fabs(s0 - f0) <= 1e-9 * sa + 1e-12);
    CHECK(std::fabs(s1 - f1) <= 1e-9 * sa + 1e-12);
    data.push_back(std::move(bytes));
  }
  if (!extra.empty()) {
    infos.push_back({extra, ep::format::StDtype::f32, {4}});
    data.push_back(std::vector<uint8_t>(16, 0));
  }
  ep::format::write_safetensors((dir / "model.safetensors").string(), infos,
                                [&](size_t i, uint64_t off, std::span<uint8_t> out) {
                                  std::memcpy(out.data(), data[i].data() + off, out.size());
                                });
  std::ofstream(dir / "config.json") << g.meta.at("hf_config_json").dump(1);
}

}  // namespace

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
  const Golden g = load_golden("dsv4_b");
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
/// either may be ""), with metadata values replaced from @p meta.
void copy_gguf(const std::string &from, const std::string &to, const std::string &drop, const std::string &extra,
               const std::vector<std::pair<std::string, ep::format::GgufValue>> &meta = {}) {
  const ep::format::GgufFile src = ep::format::GgufFile::open(from);
  ep::format::GgufWriter w;
  for (const auto &kv : src.metadata()) {
    const std::string &key = kv.first;
    if (key == "general.alignment") continue;
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
  const Golden g = load_golden("dsv4_b");
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
  const Golden g = load_golden("dsv4_b");
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
