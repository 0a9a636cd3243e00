// Checkpoints as users download them (testkit/official_checkpoint.hpp), on the CPU backend:
// DeepSeek-V4's release (FP8 dense + block scales, FP4 experts, MTP tensors, shards), Kimi-K3's
// (compressed-tensors MXFP4 experts, BF16 dense, AttnRes pairs, padded A_log) and Kimi-Linear as
// transformers saves it. Each gives logits bit-identical to a GGUF holding the same values in
// the types that hold them exactly; Kimi-Linear also matches transformers' golden logits, and its
// names and shapes are exactly those save_pretrained() wrote. The pack builder packs the FP4
// experts as MXFP4 byte for byte. Broken checkpoints fail naming the file and tensor.
#include "support/catch.hpp"

#include "backend/cpu_backend.hpp"
#include "core/error.hpp"
#include "support/deepseek_v4_golden.hpp"
#include "format/byte_source.hpp"
#include "format/gguf.hpp"
#include "format/pack_file.hpp"
#include "format/safetensors.hpp"
#include "support/kimi_golden.hpp"
#include "model/deepseek_v4.hpp"
#include "model/kimi.hpp"
#include "model/weight_catalog.hpp"
#include "pack/builder.hpp"
#include "pack/sources.hpp"
#include "pack/validate.hpp"
#include "testkit/deepseek_v4_gguf.hpp"
#include "testkit/kimi_gguf.hpp"
#include "testkit/official_checkpoint.hpp"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

fs::path scratch(const std::string &tag) {
  static int counter = 0;
  fs::path p = fs::temp_directory_path() / ("ep_official_" + tag + "_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

std::vector<int32_t> tokens_for(int64_t vocab, int64_t n) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back(static_cast<int32_t>((i * 37 + 11) % vocab));
  return t;
}

template <class Model, class State>
std::vector<float> logits_of(Model &m, const std::vector<int32_t> &tokens) {
  State st = m.new_state();
  std::vector<float> out(tokens.size() * static_cast<size_t>(m.config().vocab));
  m.forward(tokens.data(), static_cast<int64_t>(tokens.size()), st, out.data());
  return out;
}

bool bit_equal(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

std::string error_of(const std::function<void()> &f) {
  try {
    f();
  } catch (const ep::Error &e) {
    return e.what();
  }
  return "";
}

/// The DeepSeek-V4 official checkpoint and its reference give the same logits, bit for bit.
void check_deepseek_v4(const std::string &gguf, const ep::testkit::OfficialCheckpointOptions &opt, const fs::path &dir) {
  const std::string ref = (dir / "reference.gguf").string();
  ep::testkit::write_deepseek_v4_official(gguf, (dir / "ckpt").string(), ref, opt);
  ep::backend::CpuBackend cpu;
  auto a = ep::model::DeepseekV4Model::open((dir / "ckpt").string(), cpu);
  auto b = ep::model::DeepseekV4Model::open(ref, cpu);
  CHECK(a->config().summary() == b->config().summary());
  const std::vector<int32_t> tokens = tokens_for(a->config().vocab, 40);
  const auto la = logits_of<ep::model::DeepseekV4Model, ep::model::DeepseekV4State>(*a, tokens);
  const auto lb = logits_of<ep::model::DeepseekV4Model, ep::model::DeepseekV4State>(*b, tokens);
  double max_abs = 0;
  for (float v : la) max_abs = std::max(max_abs, static_cast<double>(std::fabs(v)));
  CHECK(max_abs > 0.1);
  CHECK(bit_equal(la, lb));
}

}  // namespace

TEST_CASE("official: DeepSeek-V4's release layout gives the logits of its exact GGUF, bit for bit", "[model][official]") {
  SECTION("the oracle model, 128 x 128 FP8 blocks, 3 shards") {
    const fs::path dir = scratch("ds4a");
    ep::testkit::OfficialCheckpointOptions opt;
    opt.shards = 3;
    check_deepseek_v4(deepseek_v4test::data_dir() + "/deepseek_v4_a.gguf", opt, dir);
    fs::remove_all(dir);
  }
  SECTION("a synthetic model, 32 x 64 FP8 blocks from config.json, one file") {
    const fs::path dir = scratch("ds4s");
    ep::testkit::DeepseekV4SyntheticSpec spec;
    spec.seed = 21;
    spec.dense = ep::format::GgmlType::q8_0;
    ep::testkit::write_deepseek_v4_synthetic_gguf(spec, (dir / "src.gguf").string());
    ep::testkit::OfficialCheckpointOptions opt;
    opt.shards = 1;
    opt.fp8_block_rows = 32;
    opt.fp8_block_cols = 64;
    check_deepseek_v4((dir / "src.gguf").string(), opt, dir);
    fs::remove_all(dir);
  }
}

TEST_CASE("official: the FP4 experts of DeepSeek-V4's release pack as MXFP4, byte for byte", "[model][official][pack]") {
  const fs::path dir = scratch("ds4pack");
  const std::string ref = (dir / "reference.gguf").string();
  ep::testkit::OfficialCheckpointOptions opt;
  opt.shards = 2;
  ep::testkit::write_deepseek_v4_official(deepseek_v4test::data_dir() + "/deepseek_v4_a.gguf", (dir / "ckpt").string(), ref, opt);
  const ep::pack::BuildResult r = ep::pack::build_pack(std::vector<std::string>{(dir / "ckpt").string()}, (dir / "x.epk").string());
  const auto pack = ep::format::PackFile::open(r.pack_path, ep::format::ValidationLevel::full);
  const ep::format::GgufFile g = ep::format::GgufFile::open(ref);
  const char *roles[3] = {"gate", "up", "down"};
  for (uint32_t l = 0; l < pack->num_layers(); ++l)
    for (uint32_t e = 0; e < pack->num_experts(); ++e)
      for (uint32_t k = 0; k < 3; ++k) {
        const ep::format::RoleEntry &re = pack->entry(l, e, static_cast<ep::format::Role>(k));
        REQUIRE(re.type == ep::format::GgmlType::mxfp4);
        REQUIRE(re.source_layout == ep::format::SourceLayout::fp4_e8m0);
        const ep::format::GgufTensorInfo *t = g.find_tensor(fmt::format("blk.{}.ffn_{}_exps.weight", l + pack->first_layer(), roles[k]));
        REQUIRE(t);
        const uint64_t per = t->nbytes / t->ne[2];
        REQUIRE(re.nbytes == per);
        std::vector<uint8_t> want(per), got(per);
        g.source().read(t->file_offset + e * per, want.data(), per);
        ep::format::FileSource(r.pack_path).read(re.file_offset, got.data(), per);
        REQUIRE(want == got);
      }
  ep::pack::ValidateOptions vo;
  vo.full = true;
  vo.check_sources = true;
  const ep::pack::ValidateReport rep = ep::pack::validate_pack(r.pack_path, vo);
  CHECK(rep.sources_checked);
  // a scale byte changed in the source (size and mtime kept) is found by re-hashing the source
  {
    const ep::format::SafetensorsSet set = ep::format::SafetensorsSet::open((dir / "ckpt").string());
    const auto loc = set.find("layers.1.ffn.experts.2.w3.scale");
    REQUIRE(loc);
    const auto mtime = fs::last_write_time(loc->file->path());
    std::fstream f(loc->file->path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(loc->info->file_offset + 3));
    const char c = 0x11;
    f.write(&c, 1);
    f.close();
    fs::last_write_time(loc->file->path(), mtime);
    const std::string why = error_of([&] { ep::pack::validate_pack(r.pack_path, vo); });
    CHECK(why.find("source slice changed") != std::string::npos);
    CHECK(why.find("layers.1.ffn.experts.2.w3.weight") != std::string::npos);
  }
  fs::remove_all(dir);
}

TEST_CASE("official: Kimi-K3's release layout gives the logits of its exact GGUF, bit for bit", "[model][official]") {
  const fs::path dir = scratch("k3");
  const std::string ref = (dir / "reference.gguf").string();
  ep::testkit::OfficialCheckpointOptions opt;
  opt.shards = 3;
  const kimitest::Golden k3 = kimitest::load_golden("k3_a", "kimi_k3");
  ep::testkit::write_kimi_checkpoint(k3.gguf, ep::testkit::KimiCheckpointLayout::k3_official, (dir / "ckpt").string(), ref, opt);
  ep::backend::CpuBackend cpu;
  auto a = ep::model::KimiModel::open((dir / "ckpt").string(), cpu);
  auto b = ep::model::KimiModel::open(ref, cpu);
  CHECK(a->config().summary() == b->config().summary());
  CHECK(a->config().arch == "kimi-k3");
  const auto la = logits_of<ep::model::KimiModel, ep::model::KimiState>(*a, k3.tokens);
  const auto lb = logits_of<ep::model::KimiModel, ep::model::KimiState>(*b, k3.tokens);
  CHECK(bit_equal(la, lb));
  // with the dense matrices kept in F32 (the GGUF's values), the layout's semantics (AttnRes
  // norm ⊙ proj, A_log, g_proj by layer kind, kv_b_proj, the latent experts) match the K3
  // reference's logits on the GGUF. BF16 rounding alone moves a tiny random MoE's routing, so
  // only the exact reference GGUF is compared above.
  {
    const fs::path d32 = dir / "f32";
    ep::testkit::OfficialCheckpointOptions o32 = opt;
    o32.k3_f32 = true;
    ep::testkit::write_kimi_checkpoint(k3.gguf, ep::testkit::KimiCheckpointLayout::k3_official, (d32 / "ckpt").string(),
                                       (d32 / "reference.gguf").string(), o32);
    auto m = ep::model::KimiModel::open((d32 / "ckpt").string(), cpu);
    const ep::test::Diff d = ep::test::compare(logits_of<ep::model::KimiModel, ep::model::KimiState>(*m, k3.tokens), k3.logits);
    std::printf("kimi-k3 official layout (f32 dense) vs kimi_k3_ref: max|dlogit| %.3g of max|logit| %.4g (limit 1e-4)\n",
                d.max_abs_diff, d.max_abs_ref);
    CHECK(d.rel() <= 1e-4);
  }
  // its experts pack as MXFP4 from the compressed-tensors weight_packed / weight_scale pairs
  const ep::pack::BuildResult r = ep::pack::build_pack(std::vector<std::string>{(dir / "ckpt").string()}, (dir / "k3.epk").string());
  const auto pack = ep::format::PackFile::open(r.pack_path, ep::format::ValidationLevel::full);
  CHECK(pack->first_layer() == 1);
  const ep::format::RoleEntry &re = pack->entry(0, 1, ep::format::Role::down);
  CHECK(re.type == ep::format::GgmlType::mxfp4);
  CHECK(re.source_layout == ep::format::SourceLayout::fp4_e8m0);
  CHECK(std::string(re.source_tensor) == "language_model.model.layers.1.block_sparse_moe.experts.1.w2.weight_packed");
  fs::remove_all(dir);
}

TEST_CASE("official: Kimi-Linear as transformers saves it matches transformers", "[model][official]") {
  for (const char *name : {"kimi_a", "kimi_b"}) {
    const kimitest::Golden g = kimitest::load_golden(name);
    const fs::path dir = scratch(name);
    const std::string ref = (dir / "reference.gguf").string();
    ep::testkit::OfficialCheckpointOptions opt;
    opt.shards = 2;
    ep::testkit::write_kimi_checkpoint(g.gguf, ep::testkit::KimiCheckpointLayout::transformers, (dir / "ckpt").string(), ref, opt);
    // exactly the names and shapes save_pretrained() wrote
    {
      const ep::format::SafetensorsSet set = ep::format::SafetensorsSet::open((dir / "ckpt").string());
      std::map<std::string, std::vector<uint64_t>> ours, theirs;
      for (const auto &f : set.files())
        for (const auto &t : f.tensors()) ours[t.name] = t.shape;
      for (const json &t : g.meta.at("saved_tensors")) theirs[t.at("name").get<std::string>()] = t.at("shape").get<std::vector<uint64_t>>();
      CHECK(ours == theirs);
    }
    ep::backend::CpuBackend cpu;
    auto a = ep::model::KimiModel::open((dir / "ckpt").string(), cpu);
    auto b = ep::model::KimiModel::open(ref, cpu);
    CHECK(a->config().arch == "kimi-linear");
    CHECK(a->config().summary() == ep::model::KimiConfig::from_gguf(ep::format::GgufSet::open(g.gguf)).summary());
    // transformers' own config.json reads the same
    CHECK(ep::model::KimiConfig::from_hf_json(g.meta.at("hf_config_json").dump(), "config.json").summary() == a->config().summary());
    const auto la = logits_of<ep::model::KimiModel, ep::model::KimiState>(*a, g.tokens);
    const auto lb = logits_of<ep::model::KimiModel, ep::model::KimiState>(*b, g.tokens);
    CHECK(bit_equal(la, lb));
    const ep::test::Diff d = ep::test::compare(la, g.logits);
    std::printf("kimi-linear %s safetensors vs transformers: max|dlogit| %.3g of max|logit| %.4g (limit 1e-4)\n", name,
                d.max_abs_diff, d.max_abs_ref);
    CHECK(d.rel() <= 1e-4);
    fs::remove_all(dir);
  }
}

TEST_CASE("official: broken checkpoints fail naming the file, the tensor and the offset", "[model][official][hostile]") {
  const fs::path dir = scratch("bad");
  const std::string ckpt = (dir / "ckpt").string(), ref = (dir / "reference.gguf").string();
  ep::testkit::OfficialCheckpointOptions opt;
  opt.shards = 2;
  ep::testkit::write_deepseek_v4_official(deepseek_v4test::data_dir() + "/deepseek_v4_a.gguf", ckpt, ref, opt);
  ep::backend::CpuBackend cpu;
  const fs::path shard1 = fs::path(ckpt) / "model-00001-of-00002.safetensors", shard2 = fs::path(ckpt) / "model-00002-of-00002.safetensors";
  SECTION("a truncated shard") {
    fs::resize_file(shard2, fs::file_size(shard2) - 100);
    const std::string why = error_of([&] { (void)ep::model::DeepseekV4Model::open(ckpt, cpu); });
    CHECK(why.find(shard2.string()) != std::string::npos);
    CHECK(why.find("truncated file: tensor '") != std::string::npos);
  }
  SECTION("a block scale of the wrong shape") {
    // rewrite the shard holding the first non-square FP8 block scale with its shape transposed
    std::string changed;
    fs::path where;
    for (const fs::path &shard : {shard1, shard2}) {
      const ep::format::SafetensorsFile f = ep::format::SafetensorsFile::open(shard.string());
      std::vector<ep::format::StWriteTensor> ts;
      std::vector<std::vector<uint8_t>> bytes;
      for (const auto &t : f.tensors()) {
        ep::format::StWriteTensor w{t.name, t.dtype, t.shape};
        if (changed.empty() && t.name.find(".attn.w") != std::string::npos && t.name.substr(t.name.size() - 6) == ".scale" &&
            t.shape.size() == 2 && t.shape[0] != t.shape[1]) {
          w.shape = {t.shape[1], t.shape[0]};
          changed = t.name;
          where = shard;
        }
        ts.push_back(w);
        bytes.push_back(f.source().read_vector(t.file_offset, static_cast<size_t>(t.nbytes)));
      }
      if (changed.empty()) continue;
      const fs::path tmp = dir / "x.safetensors";
      ep::format::write_safetensors(tmp.string(), ts, [&](size_t i, uint64_t off, std::span<uint8_t> out) {
        std::memcpy(out.data(), bytes[i].data() + off, out.size());
      });
      fs::rename(tmp, shard);
      break;
    }
    REQUIRE(!changed.empty());
    const std::string why = error_of([&] { (void)ep::model::DeepseekV4Model::open(ckpt, cpu); });
    INFO(why);
    CHECK(why.find(changed) != std::string::npos);
    CHECK(why.find("scale shape does not match") != std::string::npos);
    CHECK(why.find(where.string()) != std::string::npos);
    CHECK(why.find("at offset") != std::string::npos);
  }
  SECTION("an FP4 expert whose scales are missing") {
    const ep::format::SafetensorsFile f = ep::format::SafetensorsFile::open(shard2.string());
    std::vector<ep::format::StWriteTensor> ts;
    std::vector<std::vector<uint8_t>> bytes;
    std::string dropped;
    for (const auto &t : f.tensors()) {
      if (dropped.empty() && t.name.find(".ffn.experts.") != std::string::npos && t.name.substr(t.name.size() - 6) == ".scale" &&
          f.find(t.name.substr(0, t.name.size() - 6) + ".weight")) {
        dropped = t.name;
        continue;
      }
      ts.push_back({t.name, t.dtype, t.shape});
      bytes.push_back(f.source().read_vector(t.file_offset, static_cast<size_t>(t.nbytes)));
    }
    REQUIRE(!dropped.empty());
    const fs::path tmp = dir / "x.safetensors";
    ep::format::write_safetensors(tmp.string(), ts, [&](size_t i, uint64_t off, std::span<uint8_t> out) {
      std::memcpy(out.data(), bytes[i].data() + off, out.size());
    });
    fs::rename(tmp, shard2);
    // the index still lists it: the set refuses; without the index the loader and the planner do
    fs::remove(fs::path(ckpt) / "model.safetensors.index.json");
    const std::string one = shard2.string();
    const std::string why_model = error_of([&] { (void)ep::model::WeightCatalog::from_deepseek_v4_safetensors(one).finish(); });
    INFO(why_model);
    const std::string weight = dropped.substr(0, dropped.size() - 6) + ".weight";
    CHECK(why_model.find(weight) != std::string::npos);
    CHECK(why_model.find("packed FP4 needs") != std::string::npos);
    const std::string why_pack = error_of([&] { (void)ep::pack::plan_sources(std::vector<std::string>{one}); });
    CHECK(why_pack.find(weight) != std::string::npos);
    CHECK(why_pack.find("unsupported dtype") != std::string::npos);
  }
  fs::remove_all(dir);
}

TEST_CASE("official: a config.json field of the wrong type fails naming the field", "[model][official][hostile]") {
  const kimitest::Golden g = kimitest::load_golden("kimi_a");
  const json kimi = g.meta.at("hf_config_json");
  for (const auto &[key, bad] : std::vector<std::pair<std::string, json>>{
           {"model_type", 5}, {"hidden_act", json::array()}, {"norm_topk_prob", "yes"}, {"mla_use_output_gate", 1}}) {
    json c = kimi;
    c[key] = bad;
    const std::string why = error_of([&] { (void)ep::model::KimiConfig::from_hf_json(c.dump(), "config.json"); });
    INFO(key << ": " << why);
    CHECK(why.find("config.json") != std::string::npos);
    CHECK(why.find(key) != std::string::npos);
  }
  const fs::path dir = scratch("badcfg");
  ep::testkit::write_deepseek_v4_official(deepseek_v4test::data_dir() + "/deepseek_v4_a.gguf", (dir / "ckpt").string(),
                                          (dir / "reference.gguf").string(), {});
  std::ifstream in(dir / "ckpt" / "config.json");
  const json ds = json::parse(in);
  for (const auto &[key, bad] : std::vector<std::pair<std::string, json>>{{"scoring_func", 3}, {"rope_scaling", json{{"type", 1.5}}}}) {
    json c = ds;
    c.erase("rope_parameters");
    c[key] = bad;
    const std::string why = error_of([&] { (void)ep::model::DeepseekV4Config::from_hf_json(c.dump(), "config.json"); });
    INFO(key << ": " << why);
    CHECK(why.find("config.json") != std::string::npos);
    CHECK(why.find(key == "rope_scaling" ? "type" : key) != std::string::npos);
  }
  fs::remove_all(dir);
}
