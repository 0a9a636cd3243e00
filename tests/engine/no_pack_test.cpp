// Routed experts read from the source files themselves (ep_model_options::no_pack): logits
// bitwise the pack's for DeepSeek-V4 and Kimi goldens, a 3-shard synthetic Kimi-K3 and a
// safetensors checkpoint and the official DeepSeek-V4 and Kimi-K3 release layouts (FP4 experts
// with E8M0 scales, re-laid into MXFP4 as they are read), with a cache of top_k slots (reads and evictions), a host tier, with
// and without overlap and prefetch; the pack directory holds the source index and its manifest
// only, built once (with progress) and reused; refusals: a pack as the path, resident experts, a
// source whose mtime, size (a truncated shard) or tensor inventory changed since it was indexed;
// a wrong payload byte is EP_ERR_CORRUPT naming the source file, layer, expert and role, at open
// (the sampled check) or when the store reads it; so are an FP4 value byte and a NaN scale.
#include "support/catch.hpp"
#include "support/expect_error.hpp"
#include "support/temp_dir.hpp"

#include "support/capi_support.hpp"
#include "support/deepseek_v4_golden.hpp"
#include "format/checkpoint_tensors.hpp"
#include "format/gguf.hpp"
#include "format/pack_file.hpp"
#include "format/safetensors.hpp"
#include "io/file.hpp"
#include "pack/validate.hpp"
#include "store/expert_store.hpp"
#include "store/pack_object_map.hpp"
#include "testkit/kimi_gguf.hpp"
#include "testkit/official_checkpoint.hpp"

#include <expertpack/expertpack.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <set>
#include <sys/stat.h>

namespace {

namespace fs = std::filesystem;

struct Opened {
  ep_model *model = nullptr;
  ep_status status = EP_OK;
  std::string error;
};

Opened open(const std::string &path, const std::string &pack_dir, uint64_t cache, uint64_t host, int no_pack,
            bool overlap = true, bool prefetch = false, int resident = 0) {
  ep_model_options o;
  ep_model_options_init(&o);
  o.device = EP_DEVICE_CPU;
  o.pack_dir = pack_dir.c_str();
  o.cache_budget_bytes = cache;
  o.host_cache_bytes = host;
  o.no_pack = no_pack;
  o.overlap_reads = overlap ? 1 : 0;
  o.prefetch = prefetch ? 1 : 0;
  o.resident_experts = resident;
  Opened r;
  r.status = ep_model_open(&r.model, path.c_str(), &o);
  if (r.status != EP_OK) r.error = ep_last_error();
  return r;
}

ep_model *must_open(const std::string &path, const std::string &pack_dir, uint64_t cache, uint64_t host, int no_pack,
                    bool overlap = true, bool prefetch = false) {
  Opened r = open(path, pack_dir, cache, host, no_pack, overlap, prefetch);
  INFO(path << ": " << r.error);
  REQUIRE(r.status == EP_OK);
  return r.model;
}

ep_model_properties info(ep_model *m) {
  ep_model_properties p;
  ep_model_properties_init(&p);
  REQUIRE(ep_model_info(&p, m) == EP_OK);
  return p;
}

bool bit_identical(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::set<std::string> names_in(const fs::path &dir) {
  std::set<std::string> out;
  for (const auto &e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

/// The source's logits through its pack, then through no pack with small caches: bitwise the same.
void check_same_logits(const std::string &source, const fs::path &work, const std::vector<int32_t> &tokens) {
  INFO("source " << source);
  const std::string packs = (work / "packs").string(), index_dir = (work / "index").string();
  ep_model *big = must_open(source, packs, 0, 0, 0);
  const size_t vocab = info(big).vocab_size;
  const uint64_t k = info(big).experts_per_token;
  const uint64_t slot = ep::test::store_stats(big).slot_bytes;
  const std::vector<float> ref = ep::test::score_all(big, tokens, vocab);
  ep_model_close(big);

  // The index is built once, with progress, into the pack directory: no pack there.
  struct Progress {
    uint64_t calls = 0, done = 0, total = 0;
  } progress;
  ep_model_options o;
  ep_model_options_init(&o);
  o.device = EP_DEVICE_CPU;
  o.pack_dir = index_dir.c_str();
  o.no_pack = 1;
  o.progress = [](uint64_t done, uint64_t total, void *p) {
    auto &pr = *static_cast<Progress *>(p);
    ++pr.calls;
    pr.done = done;
    pr.total = total;
  };
  o.progress_payload = &progress;
  ep_model *whole = nullptr;
  REQUIRE(ep_model_open(&whole, source.c_str(), &o) == EP_OK);
  CHECK(progress.calls > 0);
  CHECK(progress.done == progress.total);
  CHECK(progress.total > 0);
  const std::string index = ep_model_pack_path(whole);
  CHECK(fs::path(index).extension() == ".epx");
  CHECK(fs::path(index).parent_path() == fs::path(index_dir));
  const std::string name = fs::path(index).filename().string();
  CHECK(names_in(index_dir) == std::set<std::string>{name, name + ".json"});
  CHECK(fs::file_size(index) < 1u << 20);
  {
    const auto pf = ep::format::PackFile::open(index, ep::format::ValidationLevel::full);
    CHECK(pf->source_objects());
    CHECK(pf->file_size() == pf->data_start());
    // The same objects as the pack's: every role at the same offset with the same hash.
    std::string epk;
    for (const auto &e : fs::directory_iterator(packs))
      if (e.path().extension() == ".epk") epk = e.path().string();
    REQUIRE(!epk.empty());
    const auto pk = ep::format::PackFile::open(epk, ep::format::ValidationLevel::structure);
    REQUIRE(pk->entries().size() == pf->entries().size());
    for (size_t i = 0; i < pk->entries().size(); ++i) {
      CHECK(pk->entries()[i].offset_in_object == pf->entries()[i].offset_in_object);
      CHECK(pk->entries()[i].xxh3 == pf->entries()[i].xxh3);
    }
    CHECK(std::memcmp(pk->header().model_identity_sha256, pf->header().model_identity_sha256, 32) == 0);
    CHECK(pk->max_object_bytes() == pf->max_object_bytes());
  }
  CHECK(bit_identical(ep::test::score_all(whole, tokens, vocab), ref));
  ep_model_close(whole);
  const auto built = fs::last_write_time(index);

  // Small caches (evictions), the host tier, overlap and prefetch on and off: the same bits; the
  // index is reused, not rebuilt.
  for (const bool overlap : {true, false}) {
    INFO("overlap " << overlap);
    ep_model *small = must_open(source, index_dir, slot * k, slot * 4, 1, overlap, !overlap);
    CHECK(bit_identical(ep::test::score_all(small, tokens, vocab), ref));
    CHECK(bit_identical(ep::test::score_all(small, tokens, vocab), ref));
    const ep_store_stats st = ep::test::store_stats(small);
    CHECK(st.cache_evictions > 0);
    CHECK(st.demotions > 0);
    ep_model_close(small);
  }
  CHECK(fs::last_write_time(index) == built);
  CHECK(names_in(index_dir) == std::set<std::string>{name, name + ".json"});
}

/// Sets @p path's mtime to @p st's (so only the bytes changed).
void restore_mtime(const std::string &path, const struct stat &st) {
  const struct timespec times[2] = {st.st_atim, st.st_mtim};
  REQUIRE(::utimensat(AT_FDCWD, path.c_str(), times, 0) == 0);
}

/// Flips byte @p offset of @p path, keeping its mtime.
void flip_byte(const std::string &path, uint64_t offset) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  {
    std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
    f.seekg(static_cast<std::streamoff>(offset));
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    f.seekp(static_cast<std::streamoff>(offset));
    f.write(&c, 1);
  }
  restore_mtime(path, st);
}

/// A copy of the DeepSeek-V4 golden GGUF (to change), indexed.
struct IndexedCopy {
  ep::test::TempDir dir;
  std::string src = dir / "m.gguf", index_dir = dir / "index", index;
  IndexedCopy() {
    fs::copy_file(deepseek_v4test::load_golden("deepseek_v4_a").gguf, src);
    ep_model *m = must_open(src, index_dir, 0, 0, 1);
    index = ep_model_pack_path(m);
    ep_model_close(m);
  }
};

}  // namespace

TEST_CASE("no pack: DeepSeek-V4 goldens, logits bitwise the pack's", "[model][no_pack]") {
  for (const char *name : deepseek_v4test::kConfigs) {
    ep::test::TempDir dir;
    const deepseek_v4test::Golden g = deepseek_v4test::load_golden(name);
    check_same_logits(g.gguf, dir.str(), g.tokens);
  }
}

TEST_CASE("no pack: DeepSeek-V4 safetensors checkpoint, logits bitwise the pack's", "[model][no_pack][safetensors]") {
  ep::test::TempDir dir;
  const deepseek_v4test::Golden g = deepseek_v4test::load_golden("deepseek_v4_a");
  const fs::path ckpt = dir / "checkpoint";
  fs::create_directories(ckpt);
  deepseek_v4test::write_checkpoint(g, ckpt);
  check_same_logits(ckpt.string(), dir.str(), g.tokens);
}

TEST_CASE("no pack: the official DeepSeek-V4 and Kimi-K3 layouts (FP4 experts re-laid as read), logits bitwise the pack's",
          "[model][no_pack][safetensors][official]") {
  ep::testkit::OfficialCheckpointOptions opt;
  opt.shards = 2;
  {
    ep::test::TempDir dir;
    const deepseek_v4test::Golden g = deepseek_v4test::load_golden("deepseek_v4_a");
    ep::testkit::write_deepseek_v4_official(g.gguf, dir / "ckpt", dir / "reference.gguf", opt);
    check_same_logits(dir / "ckpt", dir.str(), g.tokens);
  }
  {
    ep::test::TempDir dir;
    const std::string k3 = std::string(EP_TEST_DATA_DIR) + "/kimi_k3/k3_a.gguf";
    opt.shards = 2;  // one expert's values in the first shard, its scales in the second
    ep::testkit::write_kimi_checkpoint(k3, ep::testkit::KimiCheckpointLayout::k3_official, dir / "ckpt", dir / "reference.gguf",
                                       opt);
    check_same_logits(dir / "ckpt", dir.str(), {3, 14, 15, 9, 26, 5, 35});
    // The split really happened: some role's scales are read from the other shard.
    for (const auto &e : fs::directory_iterator(dir / "index")) {
      if (e.path().extension() != ".epx") continue;
      const auto pf = ep::format::PackFile::open(e.path().string(), ep::format::ValidationLevel::structure);
      CHECK(std::any_of(pf->entries().begin(), pf->entries().end(), [](const ep::format::RoleEntry &r) {
        return r.source_layout == ep::format::SourceLayout::fp4_e8m0 && r.scale_file != r.file;
      }));
    }
  }
}

TEST_CASE("no pack: an FP4 scale tensor alone in a shard of its own is found through the checkpoint's index",
          "[model][no_pack][safetensors][official]") {
  ep::test::TempDir dir;
  ep::testkit::OfficialCheckpointOptions opt;
  opt.shards = 2;
  const fs::path ckpt = dir / "ckpt";
  ep::testkit::write_kimi_checkpoint(std::string(EP_TEST_DATA_DIR) + "/kimi_k3/k3_a.gguf", ep::testkit::KimiCheckpointLayout::k3_official,
                                     ckpt.string(), "", opt);
  // The scales whose values are in the other shard move to a third file that holds nothing else.
  const fs::path index_json = ckpt / "model.safetensors.index.json";
  nlohmann::json idx = nlohmann::json::parse(std::ifstream(index_json));
  auto &map = idx.at("weight_map");
  std::string scale;
  for (auto it = map.begin(); it != map.end() && scale.empty(); ++it) {
    const std::string name = it.key();
    const std::string packed = name.size() > 13 && name.ends_with(".weight_scale") ? name.substr(0, name.size() - 5) + "packed" : "";
    if (!packed.empty() && map.contains(packed) && map.at(packed) != it.value()) scale = name;
  }
  REQUIRE(!scale.empty());
  const std::string shard_name = map.at(scale), alone = "model-scales.safetensors";
  {
    const ep::format::SafetensorsFile shard = ep::format::SafetensorsFile::open((ckpt / shard_name).string());
    std::vector<ep::format::StWriteTensor> rest, moved;
    std::vector<std::vector<uint8_t>> rest_bytes, moved_bytes;
    for (const ep::format::StTensorInfo &t : shard.tensors()) {
      auto &list = t.name == scale ? moved : rest;
      auto &bytes = t.name == scale ? moved_bytes : rest_bytes;
      list.push_back({t.name, t.dtype, t.shape});
      bytes.push_back(shard.source().read_vector(t.file_offset, static_cast<size_t>(t.nbytes)));
    }
    REQUIRE(moved.size() == 1);
    auto write = [](const fs::path &p, const std::vector<ep::format::StWriteTensor> &ts, const std::vector<std::vector<uint8_t>> &bytes) {
      ep::format::write_safetensors(p.string(), ts, [&](size_t t, uint64_t off, std::span<uint8_t> out) {
        std::memcpy(out.data(), bytes[t].data() + off, out.size());
      });
    };
    write(ckpt / (shard_name + ".new"), rest, rest_bytes);
    write(ckpt / alone, moved, moved_bytes);
  }
  fs::rename(ckpt / (shard_name + ".new"), ckpt / shard_name);
  map[scale] = alone;
  std::ofstream(index_json) << idx.dump(1);
  check_same_logits(ckpt.string(), dir.str(), {3, 14, 15, 9, 26, 5, 35});
  for (const auto &e : fs::directory_iterator(dir / "index")) {
    if (e.path().extension() != ".epx") continue;
    const auto pf = ep::format::PackFile::open(e.path().string(), ep::format::ValidationLevel::structure);
    CHECK(std::find(pf->data_files().begin(), pf->data_files().end(), (ckpt / alone).string()) != pf->data_files().end());
  }
  // ep-pack validate's source check finds it as well.
  for (const auto &e : fs::directory_iterator(dir / "packs")) {
    if (e.path().extension() != ".epk") continue;
    ep::pack::ValidateOptions vo;
    vo.full = true;  // with check_sources: every source slice re-hashed, the moved scales included
    CHECK_NOTHROW(ep::pack::validate_pack(e.path().string(), vo));
  }
}

TEST_CASE("no pack: Kimi goldens and a 3-shard synthetic Kimi-K3, logits bitwise the pack's", "[model][no_pack][kimi]") {
  const std::vector<int32_t> tokens = {3, 14, 15, 9, 26, 5, 35};
  for (const char *rel : {"kimi_linear/kimi_a.gguf", "kimi_k3/k3_a.gguf"}) {
    ep::test::TempDir dir;
    check_same_logits(std::string(EP_TEST_DATA_DIR) + "/" + rel, dir.str(), tokens);
  }
  ep::test::TempDir dir;
  ep::testkit::KimiSyntheticSpec spec = ep::testkit::KimiSyntheticSpec::tiny(4);
  spec.seed = 5;
  spec.shards = 3;
  const std::string first = ep::testkit::write_kimi_synthetic_gguf(spec, dir / "k3.gguf");
  check_same_logits(first, dir.str(), {5, 80, 81, 300, 17, 42});
}

TEST_CASE("no pack: refused with a pack, with resident experts, after the source changed", "[model][no_pack]") {
  const IndexedCopy c;
  const std::string &src = c.src, &index_dir = c.index_dir, &index = c.index;

  // An Expert Pack (or the index itself) as the path; resident experts.
  ep_model *p = must_open(src, c.dir / "packs", 0, 0, 0);
  const std::string epk = ep_model_pack_path(p);
  ep_model_close(p);
  for (const std::string &path : {epk, index}) {
    Opened r = open(path, index_dir, 0, 0, 1);
    CHECK(r.status == EP_ERR_INVALID_ARGUMENT);
    CHECK(r.error.find(path) != std::string::npos);
    CHECK(r.error.find("no_pack") != std::string::npos);
  }
  Opened r = open(src, index_dir, 0, 0, 1, true, false, 1);
  CHECK(r.status == EP_ERR_INVALID_ARGUMENT);
  CHECK(r.error.find("resident_experts") != std::string::npos);

  // A source touched since it was indexed is refused naming it (never silently re-indexed).
  struct stat st {};
  REQUIRE(::stat(src.c_str(), &st) == 0);
  struct stat later = st;
  later.st_mtim.tv_sec += 10;
  restore_mtime(src, later);
  r = open(src, index_dir, 0, 0, 1);
  CHECK(r.status == EP_ERR_STALE);
  CHECK(r.error.find("source changed: " + src) != std::string::npos);
  CHECK(r.error.find(index) != std::string::npos);
  restore_mtime(src, st);
  ep_model_close(must_open(src, index_dir, 0, 0, 1));

  // Its tensor inventory changed with the same size and mtime: a tensor renamed in the header.
  {
    std::ifstream in(src, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t at = bytes.find("output_norm.weight");
    REQUIRE(at != std::string::npos);
    flip_byte(src, at + 3);
    r = open(src, index_dir, 0, 0, 1);
    CHECK(r.status == EP_ERR_STALE);
    CHECK(r.error.find(src) != std::string::npos);
    CHECK(r.error.find("tensor inventory") != std::string::npos);
    flip_byte(src, at + 3);
    ep_model_close(must_open(src, index_dir, 0, 0, 1));
  }

  // Grown (the size differs, the GGUF still parses): stale. Truncated: the GGUF reader refuses it
  // first, naming it.
  const uint64_t size = fs::file_size(src);
  fs::resize_file(src, size + 4096);
  r = open(src, index_dir, 0, 0, 1);
  CHECK(r.status == EP_ERR_STALE);
  CHECK(r.error.find("source changed: " + src + ": size " + std::to_string(size)) != std::string::npos);
  fs::resize_file(src, size - 100);
  r = open(src, index_dir, 0, 0, 1);
  CHECK(r.status == EP_ERR_FORMAT);
  CHECK(r.error.find(src + ": truncated file") != std::string::npos);
}

TEST_CASE("no pack: a truncated shard is refused naming it", "[model][no_pack][kimi]") {
  ep::test::TempDir dir;
  ep::testkit::KimiSyntheticSpec spec = ep::testkit::KimiSyntheticSpec::tiny(4);
  spec.seed = 9;
  spec.shards = 3;
  const std::string first = ep::testkit::write_kimi_synthetic_gguf(spec, dir / "k3.gguf");
  const std::string index_dir = dir / "index";
  ep_model_close(must_open(first, index_dir, 0, 0, 1));
  const std::string shard = ep::format::split_path(dir / "k3", 2, 3);
  fs::resize_file(shard, fs::file_size(shard) - 4096);
  Opened r = open(first, index_dir, 0, 0, 1);
  INFO(r.error);
  CHECK(r.status == EP_ERR_STALE);
  CHECK(r.error.find("source changed: " + shard) != std::string::npos);
}

TEST_CASE("no pack: a wrong payload byte is EP_ERR_CORRUPT naming the source, layer, expert and role", "[model][no_pack]") {
  const IndexedCopy c;
  const std::string &src = c.src, &index_dir = c.index_dir, &index = c.index;
  const auto pf = ep::format::PackFile::open(index, ep::format::ValidationLevel::structure);
  const uint32_t E = pf->num_experts();
  const auto sample = pf->sample_objects();
  auto sampled = [&](uint32_t l, uint32_t e) {
    return std::find(sample.begin(), sample.end(), std::make_pair(l, e)) != sample.end();
  };
  // One expert outside the sample the open checks, one inside.
  std::pair<uint32_t, uint32_t> quiet{UINT32_MAX, 0}, loud = sample.front();
  for (uint32_t l = 0; l < pf->num_layers() && quiet.first == UINT32_MAX; ++l)
    for (uint32_t e = 0; e < E; ++e)
      if (!sampled(l, e)) {
        quiet = {l, e};
        break;
      }
  REQUIRE(quiet.first != UINT32_MAX);
  const ep::format::RoleEntry &up = pf->entry(quiet.first, quiet.second, ep::format::Role::up);
  flip_byte(src, up.source_offset + up.nbytes / 2);

  // The store reading it: EP_ERR_CORRUPT naming the file, layer, expert, role and offset; the
  // other experts of the layer load.
  auto layout = ep::store::PackObjectMap::open(index);
  ep::store::StoreOptions so;
  so.pack_path = index;
  so.data_paths = layout->pack().data_files();
  so.objects = layout;
  so.top_k = E;
  CHECK(so.data_paths == std::vector<std::string>{fs::absolute(src).lexically_normal().string()});
  ep::store::ExpertStore store(so, std::make_unique<ep::store::HostDevice>());
  ep::test::expect_error([&] { store.acquire(quiet.first, std::vector<uint32_t>{quiet.second}); }, ep::Status::corrupt,
                         fmt::format("payload hash mismatch: {}: layer {} expert {} up (tensor '{}') at offset {}",
                                     so.data_paths[0], quiet.first, quiet.second, up.source_tensor, up.source_offset));
  CHECK(store.resident().empty());
  const uint32_t other = (quiet.second + 1) % E;
  auto a = store.acquire(quiet.first, std::vector<uint32_t>{other});
  CHECK(layout->check_object(quiet.first, other, static_cast<const std::byte *>(a.pointers[0])).empty());
  store.release(a);

  // An expert the open samples: the model refuses to open, naming the same.
  const ep::format::RoleEntry &down = pf->entry(loud.first, loud.second, ep::format::Role::down);
  flip_byte(src, down.source_offset + 1);
  Opened r = open(src, index_dir, 0, 0, 1);
  CHECK(r.status == EP_ERR_CORRUPT);
  CHECK(r.error.find(so.data_paths[0]) != std::string::npos);
  CHECK(r.error.find(fmt::format("layer {} expert {} down", loud.first, loud.second)) != std::string::npos);
}

TEST_CASE("no pack: a wrong FP4 value byte or a NaN scale is EP_ERR_CORRUPT naming the source and tensor",
          "[model][no_pack][official]") {
  ep::test::TempDir dir;
  const deepseek_v4test::Golden g = deepseek_v4test::load_golden("deepseek_v4_a");
  ep::testkit::OfficialCheckpointOptions opt;
  opt.shards = 1;
  ep::testkit::write_deepseek_v4_official(g.gguf, dir / "ckpt", dir / "reference.gguf", opt);
  const std::string index_dir = dir / "index";
  ep_model *m = must_open(dir / "ckpt", index_dir, 0, 0, 1);
  const std::string index = ep_model_pack_path(m);
  ep_model_close(m);
  const auto pf = ep::format::PackFile::open(index, ep::format::ValidationLevel::structure);
  const auto sample = pf->sample_objects();
  std::pair<uint32_t, uint32_t> quiet{UINT32_MAX, 0};
  for (uint32_t l = 0; l < pf->num_layers() && quiet.first == UINT32_MAX; ++l)
    for (uint32_t e = 0; e < pf->num_experts(); ++e)
      if (std::find(sample.begin(), sample.end(), std::make_pair(l, e)) == sample.end()) {
        quiet = {l, e};
        break;
      }
  REQUIRE(quiet.first != UINT32_MAX);
  const ep::format::RoleEntry &up = pf->entry(quiet.first, quiet.second, ep::format::Role::up);
  const ep::format::RoleEntry &down = pf->entry(quiet.first, quiet.second, ep::format::Role::down);
  REQUIRE(up.source_layout == ep::format::SourceLayout::fp4_e8m0);
  REQUIRE(up.scale_bytes == up.nbytes / 17);
  const std::string src(up.source_file);

  auto layout = ep::store::PackObjectMap::open(index);
  ep::store::StoreOptions so;
  so.pack_path = index;
  so.data_paths = layout->pack().data_files();
  so.objects = layout;
  so.top_k = pf->num_experts();
  auto load = [&] {
    ep::store::ExpertStore store(so, std::make_unique<ep::store::HostDevice>());
    auto a = store.acquire(quiet.first, std::vector<uint32_t>{quiet.second});
    store.release(a);
  };
  load();  // as written: loads
  // A value byte: the re-laid payload's hash differs.
  flip_byte(src, up.source_offset + up.source_bytes / 2);
  ep::test::expect_error(load, ep::Status::corrupt,
                         fmt::format("payload hash mismatch: {}: layer {} expert {} up (tensor '{}') at offset {}", src,
                                     quiet.first, quiet.second, up.source_tensor, up.source_offset));
  flip_byte(src, up.source_offset + up.source_bytes / 2);
  load();
  // A scale byte set to E8M0's NaN: refused while re-laying, naming the file and the tensor.
  {
    struct stat st {};
    REQUIRE(::stat(src.c_str(), &st) == 0);
    {
      std::fstream f(src, std::ios::binary | std::ios::in | std::ios::out);
      f.seekp(static_cast<std::streamoff>(down.scale_offset + 3));
      f.put(static_cast<char>(0xFF));
    }
    restore_mtime(src, st);
  }
  const uint64_t blocks = down.ne[0] / 32;
  ep::test::expect_error(load, ep::Status::corrupt,
                         fmt::format("{}: FP4 values at offset {}, scales at offset {}: E8M0 scale byte 3 (row {}, block {}) is NaN",
                                     src, down.source_offset, down.scale_offset, 3 / blocks, 3 % blocks));

  // The scale tensor gone from the source's header (renamed): the index no longer opens, naming
  // the source and both tensors.
  const std::string scale_name = ep::format::fp4_scale_tensor_name(std::string(down.source_tensor));
  {
    std::ifstream in(src, std::ios::binary);
    std::string head(4u << 20, '\0');
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    const size_t at = head.find("\"" + scale_name + "\"");
    REQUIRE(at != std::string::npos);
    flip_byte(src, at + scale_name.size());  // its last character
  }
  ep::test::expect_error([&] { ep::format::PackFile::open(index, ep::format::ValidationLevel::structure); }, ep::Status::format,
                         fmt::format("{} (nor another source of the index) has no scale tensor '{}' for the FP4 tensor '{}'", src,
                                     scale_name, down.source_tensor));
}
