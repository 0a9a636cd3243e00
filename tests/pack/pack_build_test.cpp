// Builds packs from synthetic GGUF and safetensors sources and checks, for every
// (layer, expert, role), that the pack bytes equal the source slice, located independently
// from the source's own tensor table, and that inspect's JSON says the same.
#include "core/error.hpp"
#include "format/gguf.hpp"
#include "format/gguf_writer.hpp"
#include "format/pack_file.hpp"
#include "format/safetensors.hpp"
#include "pack/builder.hpp"
#include "pack/manifest.hpp"
#include "support/temp_dir.hpp"
#include "pack/validate.hpp"
#include "support/catch.hpp"
#include "testkit/checkpoint.hpp"

#include <cstring>
#include <filesystem>
#include <fmt/format.h>

using namespace ep;
using format::GgmlType;
using format::Role;
using test::TempDir;

namespace {

struct Expected {
  std::string file;
  std::string tensor;
  uint64_t offset;
  uint64_t nbytes;
  GgmlType type;
  std::array<uint64_t, 2> shape;
};

// Where (model layer, expert, role) lives in a GGUF set, from its tensor table.
Expected expected_gguf(const format::GgufSet &set, uint32_t layer, uint32_t expert, Role role) {
  const std::string name = fmt::format("blk.{}.ffn_{}_exps.weight", layer, format::role_name(role));
  auto loc = set.find_tensor(name);
  REQUIRE(loc);
  const auto &t = *loc->info;
  const uint64_t per = t.nbytes / t.ne[2];
  return {std::filesystem::absolute(loc->file->path()).lexically_normal().string(), name, t.file_offset + expert * per,
          per, t.type, {t.ne[0], t.ne[1]}};
}

// Same for safetensors, fused or per-expert layouts.
Expected expected_st(const format::SafetensorsSet &set, uint32_t layer, uint32_t expert, Role role) {
  const int r = static_cast<int>(role);
  auto abs = [](const std::string &p) { return std::filesystem::absolute(p).lexically_normal().string(); };
  if (auto gu = set.find(fmt::format("model.layers.{}.mlp.experts.gate_up_proj", layer))) {
    const auto &s = gu->info->shape;  // [E, 2F, D]
    const uint64_t F = s[1] / 2, D = s[2];
    if (role != Role::down) {
      const uint64_t half = F * D * 2;
      return {abs(gu->file->path()), gu->info->name, gu->info->file_offset + expert * 2 * half + r * half, half,
              GgmlType::bf16, {D, F}};
    }
    auto dn = set.find(fmt::format("model.layers.{}.mlp.experts.down_proj", layer));
    REQUIRE(dn);
    const uint64_t n = D * F * 2;
    return {abs(dn->file->path()), dn->info->name, dn->info->file_offset + expert * n, n, GgmlType::bf16, {F, D}};
  }
  const char *hf[] = {"gate_proj", "up_proj", "down_proj"};
  const char *w[] = {"w1", "w3", "w2"};
  auto t = set.find(fmt::format("model.layers.{}.mlp.experts.{}.{}.weight", layer, expert, hf[r]));
  if (!t) t = set.find(fmt::format("model.layers.{}.block_sparse_moe.experts.{}.{}.weight", layer, expert, w[r]));
  REQUIRE(t);
  const auto &s = t->info->shape;  // [out, in]
  return {abs(t->file->path()), t->info->name, t->info->file_offset, t->info->nbytes, GgmlType::bf16, {s[1], s[0]}};
}

template <typename Locate>
void check_pack(const std::string &pack_path, uint32_t first_layer, uint32_t layers, uint32_t experts, Locate &&locate) {
  auto pack = format::PackFile::open(pack_path, format::ValidationLevel::full);
  REQUIRE(pack->num_layers() == layers);
  REQUIRE(pack->num_experts() == experts);
  CHECK(pack->first_layer() == first_layer);
  CHECK(pack->alignment() == 4096);
  CHECK(pack->data_start() % 4096 == 0);
  CHECK(pack->object_stride() % 4096 == 0);
  const auto manifest = pack::Manifest::load(pack::manifest_path(pack_path));
  const nlohmann::json j = pack::inspect_json(*pack, &manifest);
  CHECK(j["alignment"] == 4096);
  CHECK(j["data_start"] == pack->data_start());
  CHECK(j["object_stride"] == pack->object_stride());
  CHECK(j["num_layers"] == layers);
  CHECK(j["num_experts"] == experts);
  REQUIRE(j["objects"].size() == static_cast<size_t>(layers) * experts);
  size_t compared = 0;
  for (uint32_t l = 0; l < layers; ++l) {
    for (uint32_t x = 0; x < experts; ++x) {
      const uint64_t obj = pack->object_offset(l, x);
      CHECK(obj == pack->data_start() + (static_cast<uint64_t>(l) * experts + x) * pack->object_stride());
      CHECK(obj % 4096 == 0);
      CHECK(pack->object_bytes(l, x) <= pack->object_stride());
      const nlohmann::json &o = j["objects"][static_cast<size_t>(l) * experts + x];
      CHECK(o["layer"] == l);
      CHECK(o["expert"] == x);
      CHECK(o["offset"] == obj);
      CHECK(o["bytes"] == pack->object_bytes(l, x));
      REQUIRE(o["roles"].size() == 3);
      for (uint32_t r = 0; r < 3; ++r) {
        const Expected want = locate(first_layer + l, x, static_cast<Role>(r));
        const auto &e = pack->entry(l, x, static_cast<Role>(r));
        const nlohmann::json &jr = o["roles"][r];
        INFO("layer " << l << " expert " << x << " role " << r << " tensor " << want.tensor);
        CHECK(e.nbytes == want.nbytes);
        CHECK(e.type == want.type);
        CHECK(e.ne[0] == want.shape[0]);
        CHECK(e.ne[1] == want.shape[1]);
        CHECK(e.source_file == want.file);
        CHECK(e.source_tensor == want.tensor);
        CHECK(e.source_offset == want.offset);
        CHECK(e.file_offset >= obj);
        CHECK(e.offset_in_object % 256 == 0);
        CHECK(jr["role"] == std::string(format::role_name(static_cast<Role>(r))));
        CHECK(jr["ggml_type"] == std::string(format::ggml_type_info(static_cast<uint32_t>(want.type))->name));
        CHECK(jr["shape"] == nlohmann::json({want.shape[0], want.shape[1]}));
        CHECK(jr["offset"] == e.file_offset);
        CHECK(jr["nbytes"] == want.nbytes);
        CHECK(jr["source"]["file"] == want.file);
        CHECK(jr["source"]["tensor"] == want.tensor);
        CHECK(jr["source"]["offset"] == want.offset);
        CHECK(jr["source"]["nbytes"] == want.nbytes);
        // The bytes, read at the absolute offsets the JSON gives.
        const auto got = test::read_range(pack_path, jr["offset"].get<uint64_t>(), want.nbytes);
        const auto src = test::read_range(want.file, want.offset, want.nbytes);
        REQUIRE(got.size() == want.nbytes);
        CHECK(got == src);
        ++compared;
      }
    }
  }
  CHECK(compared == static_cast<size_t>(layers) * experts * 3);
  CHECK_NOTHROW(pack::validate_pack(pack_path, {true, true, true}));
}

}  // namespace

TEST_CASE("pack from DeepSeek-V4-shaped GGUF, single file and 3 shards", "[pack][build][gguf]") {
  for (uint32_t shards : {1u, 3u}) {
    TempDir dir;
    testkit::SyntheticSpec spec;
    spec.arch = "deepseek4";
    spec.num_layers = 4;
    spec.num_experts = 8;
    spec.top_k = 6;
    spec.n_embd = 256;
    spec.n_ff = 128;
    spec.expert_type = spec.down_type = GgmlType::mxfp4;
    spec.seed = 11 + shards;
    spec.n_shards = shards;
    const auto paths = testkit::write_synthetic_gguf(spec, dir / "ds4.gguf");
    REQUIRE(paths.size() == shards);
    const auto r = pack::build_pack(std::vector<std::string>{paths[0]}, dir / "ds4.epk");
    CHECK(r.num_layers == 4);
    CHECK(r.generation == 1);
    CHECK(r.payload_bytes == 4ull * 8 * 3 * (256 / 32 * 17 * 128));
    const auto set = format::GgufSet::open(paths[0]);
    check_pack(dir / "ds4.epk", 0, 4, 8, [&](uint32_t l, uint32_t x, Role role) { return expected_gguf(set, l, x, role); });
    auto pack = format::PackFile::open(dir / "ds4.epk");
    CHECK(pack->top_k() == 6);
    // A rebuild bumps the generation and yields the same identity.
    const auto r2 = pack::build_pack(std::vector<std::string>{paths[0]}, dir / "ds4.epk");
    CHECK(r2.generation == 2);
    auto pack2 = format::PackFile::open(dir / "ds4.epk");
    CHECK(std::memcmp(pack->header().model_identity_sha256, pack2->header().model_identity_sha256, 32) == 0);
    CHECK(std::memcmp(pack->header().source_files_sha256, pack2->header().source_files_sha256, 32) == 0);
  }
}

TEST_CASE("pack from Kimi-K3-shaped GGUF (dense layer 0, K-quants), single file and 3 shards", "[pack][build][gguf]") {
  for (uint32_t shards : {1u, 3u}) {
    TempDir dir;
    testkit::SyntheticSpec spec;
    spec.arch = "kimi-k3";
    spec.num_layers = 4;
    spec.first_moe_layer = 1;
    spec.num_experts = 6;
    spec.top_k = 4;
    spec.n_embd = 512;  // the latent width
    spec.n_ff = 256;
    spec.expert_type = GgmlType::q2_k;
    spec.down_type = GgmlType::q4_k;
    spec.seed = 21 + shards;
    spec.n_shards = shards;
    const auto paths = testkit::write_synthetic_gguf(spec, dir / "k3.gguf");
    pack::build_pack(std::vector<std::string>(paths.begin(), paths.end()), dir / "k3.epk");
    const auto set = format::GgufSet::open(paths[0]);
    check_pack(dir / "k3.epk", 1, 3, 6, [&](uint32_t l, uint32_t x, Role role) { return expected_gguf(set, l, x, role); });
    auto pack = format::PackFile::open(dir / "k3.epk");
    CHECK(pack->entry(0, 0, Role::gate).type == GgmlType::q2_k);
    CHECK(pack->entry(2, 5, Role::down).type == GgmlType::q4_k);
    const auto m = pack::Manifest::load(dir / "k3.epk.json");
    CHECK(m.config["arch"] == "kimi-k3");
    CHECK(m.sources.size() == shards);
  }
}

TEST_CASE("pack from safetensors: fused, per-expert and w1/w2/w3, single and sharded", "[pack][build][safetensors]") {
  const std::pair<testkit::StLayout, uint32_t> cases[] = {{testkit::StLayout::fused, 1},
                                                       {testkit::StLayout::fused, 3},
                                                       {testkit::StLayout::per_expert, 1},
                                                       {testkit::StLayout::per_expert, 3},
                                                       {testkit::StLayout::per_expert_w123, 2}};
  for (const auto &[layout, shards] : cases) {
    TempDir dir;
    testkit::SyntheticSpec spec;
    spec.arch = "kimi-k3";
    spec.num_layers = 3;
    spec.first_moe_layer = 1;
    spec.num_experts = 5;
    spec.n_embd = 64;
    spec.n_ff = 48;
    spec.n_shards = shards;
    spec.seed = 31 + static_cast<uint64_t>(layout) * 10 + shards;
    const std::string src = testkit::write_synthetic_safetensors(spec, dir / "ckpt", layout);
    INFO("layout " << static_cast<int>(layout) << " shards " << shards);
    const std::string config = R"({"model_type": "kimi_k3", "num_experts_per_tok": 3})";
    test::write_file(dir / "ckpt/config.json", std::vector<uint8_t>(config.begin(), config.end()));
    pack::build_pack(std::vector<std::string>{src}, dir / "st.epk");
    CHECK(format::PackFile::open(dir / "st.epk")->top_k() == 3);
    const auto set = format::SafetensorsSet::open(src);
    check_pack(dir / "st.epk", 1, 2, 5, [&](uint32_t l, uint32_t x, Role role) { return expected_st(set, l, x, role); });
  }
}

TEST_CASE("pack from a full-width DeepSeek-V4 layer: 4096x2048 MXFP4 experts", "[pack][build][fullwidth]") {
  TempDir dir;
  testkit::SyntheticSpec spec;
  spec.arch = "deepseek4";
  spec.num_layers = 1;
  spec.num_experts = 3;
  spec.n_embd = 4096;
  spec.n_ff = 2048;
  spec.expert_type = spec.down_type = GgmlType::mxfp4;
  spec.seed = 4096;
  const auto paths = testkit::write_synthetic_gguf(spec, dir / "wide.gguf");
  std::vector<pack::BuildProgress> progress;
  pack::BuildOptions opt;
  opt.chunk_bytes = 1u << 20;
  opt.progress = [&](const pack::BuildProgress &p) { progress.push_back(p); };
  const auto r = pack::build_pack(std::vector<std::string>{paths[0]}, dir / "wide.epk", opt);
  const uint64_t role_bytes = 4096ull / 32 * 17 * 2048;  // 4,456,448
  CHECK(r.payload_bytes == 3 * 3 * role_bytes);
  REQUIRE(progress.size() >= 9);
  CHECK(progress.back().done_bytes == progress.back().total_bytes);
  for (size_t i = 1; i < progress.size(); ++i) CHECK(progress[i].done_bytes > progress[i - 1].done_bytes);
  const auto set = format::GgufSet::open(paths[0]);
  check_pack(dir / "wide.epk", 0, 1, 3, [&](uint32_t l, uint32_t x, Role role) { return expected_gguf(set, l, x, role); });
  auto pack = format::PackFile::open(dir / "wide.epk");
  CHECK(pack->object_bytes(0, 0) == 3 * role_bytes);  // role sizes are multiples of 256: no padding inside
  CHECK(pack->object_stride() == format::align_up(3 * role_bytes, 4096));
}

TEST_CASE("planning rejects sources without experts, with mismatched shapes or unsupported dtypes", "[pack][build]") {
  TempDir dir;
  auto expect = [](auto &&f, Status status, const std::string &needle) {
    try {
      f();
      FAIL("no error");
    } catch (const Error &e) {
      INFO(e.what());
      CHECK(e.status() == status);
      CHECK(std::string(e.what()).find(needle) != std::string::npos);
    }
  };
  {
    format::GgufWriter w;
    w.add("general.architecture", format::GgufValue::make_string("deepseek4"));
    w.add_tensor("token_embd.weight", GgmlType::f32, {8, 8});
    w.write(dir / "dense.gguf", 1, [](size_t, uint64_t, std::span<uint8_t> out) { std::fill(out.begin(), out.end(), 0); });
    expect([&] { pack::plan_sources({dir / "dense.gguf"}); }, Status::not_found, "no routed expert tensors");
  }
  {
    format::GgufWriter w;
    w.add("general.architecture", format::GgufValue::make_string("deepseek4"));
    w.add("deepseek4.expert_count", format::GgufValue::make_u32(4));
    w.add_tensor("blk.0.ffn_gate_exps.weight", GgmlType::f32, {8, 4, 4});
    w.add_tensor("blk.0.ffn_up_exps.weight", GgmlType::f32, {8, 4, 4});
    w.add_tensor("blk.0.ffn_down_exps.weight", GgmlType::f32, {8, 4, 4});  // should be {4, 8, 4}
    w.write(dir / "bad.gguf", 1, [](size_t, uint64_t, std::span<uint8_t> out) { std::fill(out.begin(), out.end(), 0); });
    expect([&] { pack::plan_sources({dir / "bad.gguf"}); }, Status::shape, "shape mismatch");
  }
  {
    format::GgufWriter w;
    w.add("general.architecture", format::GgufValue::make_string("deepseek4"));
    w.add_tensor("blk.0.ffn_gate_exps.weight", GgmlType::f32, {8, 4, 2});
    w.add_tensor("blk.0.ffn_up_exps.weight", GgmlType::f32, {8, 4, 2});
    w.write(dir / "missing.gguf", 1, [](size_t, uint64_t, std::span<uint8_t> out) { std::fill(out.begin(), out.end(), 0); });
    expect([&] { pack::plan_sources({dir / "missing.gguf"}); }, Status::not_found, "blk.0.ffn_down_exps.weight");
  }
  {
    format::write_safetensors(dir / "fp8.safetensors",
                              {{"model.layers.0.mlp.experts.gate_up_proj", format::StDtype::f8_e4m3, {2, 8, 4}},
                               {"model.layers.0.mlp.experts.down_proj", format::StDtype::f8_e4m3, {2, 4, 4}}},
                              [](size_t, uint64_t, std::span<uint8_t> out) { std::fill(out.begin(), out.end(), 1); });
    expect([&] { pack::plan_sources({dir / "fp8.safetensors"}); }, Status::unsupported, "unsupported dtype");
  }
  expect([&] { pack::plan_sources({dir / "nothing.gguf"}); }, Status::not_found, "source missing");
}
