#include "core/error.hpp"
#include "format/safetensors.hpp"
#include "support/expect_error.hpp"
#include "support/temp_dir.hpp"
#include "support/catch.hpp"
#include "testkit/checkpoint.hpp"

#include <cstring>
#include <filesystem>
#include <random>

using namespace ep::format;
using ep::test::expect_error;
using ep::test::TempDir;

namespace {

std::vector<uint8_t> make_file(const std::string &json, size_t data_bytes) {
  std::vector<uint8_t> b(8 + json.size() + data_bytes, 0x5a);
  const uint64_t n = json.size();
  std::memcpy(b.data(), &n, 8);
  if (!json.empty()) std::memcpy(b.data() + 8, json.data(), json.size());
  return b;
}

SafetensorsFile parse_bytes(const std::vector<uint8_t> &b) {
  return SafetensorsFile::parse(std::make_shared<MemorySource>(std::span<const uint8_t>(b.data(), b.size()), "mem.safetensors"));
}

}  // namespace

TEST_CASE("safetensors: every dtype, metadata and offsets", "[format][safetensors]") {
  TempDir dir;
  const std::vector<std::pair<std::string, size_t>> dtypes = {
      {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"F8_E4M3", 1}, {"I8", 1}, {"U8", 1}, {"I32", 4}, {"I64", 8}, {"F8_E8M0", 1}};
  std::vector<StWriteTensor> tensors;
  for (const auto &[name, size] : dtypes) tensors.push_back({"t." + name, *st_dtype_from_name(name), {3, 5}});
  write_safetensors(dir / "x.safetensors", tensors,
                    [](size_t t, uint64_t off, std::span<uint8_t> out) { ep::testkit::synthetic_bytes(5, t, off, out); },
                    {{"format", "pt"}});
  const SafetensorsFile f = SafetensorsFile::open(dir / "x.safetensors");
  CHECK(f.metadata().at("format") == "pt");
  REQUIRE(f.tensors().size() == dtypes.size());
  for (size_t i = 0; i < dtypes.size(); ++i) {
    const StTensorInfo *t = f.find("t." + dtypes[i].first);
    REQUIRE(t);
    CHECK(st_dtype_name(t->dtype) == dtypes[i].first);
    CHECK(t->nbytes == 15 * dtypes[i].second);
    CHECK(t->shape == std::vector<uint64_t>{3, 5});
    std::vector<uint8_t> want(t->nbytes), got(t->nbytes);
    ep::testkit::synthetic_bytes(5, i, 0, want);
    f.source().read(t->file_offset, got.data(), got.size());
    CHECK(want == got);
  }
  CHECK(st_dtype_from_name("F8_E8M0FNU") == StDtype::f8_e8m0);
  CHECK_FALSE(st_dtype_from_name("F4"));
}

TEST_CASE("safetensors: malformed headers give specific errors", "[format][safetensors][hostile]") {
  expect_error([] { parse_bytes({1, 2, 3}); }, ep::Status::format, "truncated file");
  {
    std::vector<uint8_t> b = make_file("{}", 0);
    const uint64_t huge = 1ull << 60;
    std::memcpy(b.data(), &huge, 8);
    expect_error([&] { parse_bytes(b); }, ep::Status::format, "header length");
  }
  expect_error([] { parse_bytes(make_file("{not json", 0)); }, ep::Status::format, "not a JSON object");
  expect_error([] { parse_bytes(make_file("[1,2]", 0)); }, ep::Status::format, "not a JSON object");
  expect_error([] { parse_bytes(make_file(R"({"a":{"dtype":"F32","shape":[2]}})", 8)); }, ep::Status::format, "data_offsets");
  expect_error([] { parse_bytes(make_file(R"({"a":{"dtype":"Q9","shape":[2],"data_offsets":[0,8]}})", 8)); },
               ep::Status::unsupported, "unsupported dtype Q9");
  expect_error([] { parse_bytes(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", 8)); },
               ep::Status::format, "truncated file");
  expect_error([] { parse_bytes(make_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)); },
               ep::Status::shape, "shape mismatch");
  expect_error([] { parse_bytes(make_file(R"({"a":{"dtype":"F32","shape":[-3],"data_offsets":[0,8]}})", 8)); },
               ep::Status::format, "non-integer");
  expect_error([] { parse_bytes(make_file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})", 8)); },
               ep::Status::format, "overflows");
  expect_error([] { parse_bytes(make_file(R"({"__metadata__":{"x":1}})", 0)); }, ep::Status::format, "__metadata__");
  CHECK(parse_bytes(make_file(R"({"a":{"dtype":"F8_E8M0","shape":[2,4],"data_offsets":[0,8]}})", 8)).find("a")->nbytes == 8);
  // a header that lies about offsets: two tensors on the same bytes, a hole, bytes after the last one
  expect_error([] { parse_bytes(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12)); },
               ep::Status::format, "tensor 'b' data [4, 12) overlaps tensor 'a' [0, 8)");
  expect_error([] { parse_bytes(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8)); },
               ep::Status::format, "lies about offsets");
  expect_error([] { parse_bytes(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12)); },
               ep::Status::format, "data bytes [0, 4) before tensor 'a' belong to no tensor");
  expect_error([] { parse_bytes(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 12)); },
               ep::Status::format, "trailing bytes");
  CHECK(parse_bytes(make_file(R"({"e":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8))
            .tensors()
            .size() == 2);
}

TEST_CASE("safetensors: truncations and random corruption never crash", "[format][safetensors][hostile]") {
  const std::vector<uint8_t> good =
      make_file(R"({"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[2,4],"data_offsets":[0,16]},)"
                R"("b":{"dtype":"U8","shape":[8],"data_offsets":[16,24]}})", 24);
  REQUIRE_NOTHROW(parse_bytes(good));
  for (size_t len = 0; len < good.size(); ++len) {
    std::vector<uint8_t> cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(len));
    CHECK_THROWS_AS(parse_bytes(cut), ep::Error);
  }
  std::mt19937_64 rng(77);
  for (int i = 0; i < 3000; ++i) {
    std::vector<uint8_t> bad = good;
    bad[rng() % (good.size() - 24)] ^= static_cast<uint8_t>(1 + rng() % 255);
    try {
      const SafetensorsFile f = parse_bytes(bad);
      for (const auto &t : f.tensors()) CHECK(t.file_offset + t.nbytes <= bad.size());
    } catch (const ep::Error &) {
    }
  }
}

TEST_CASE("safetensors: sharded checkpoints through model.safetensors.index.json", "[format][safetensors]") {
  TempDir dir;
  ep::testkit::SyntheticSpec spec;
  spec.num_layers = 2;
  spec.n_shards = 3;
  const std::string index = ep::testkit::write_synthetic_safetensors(spec, dir.str(), ep::testkit::StLayout::fused);
  CHECK(std::filesystem::path(index).filename() == "model.safetensors.index.json");
  const SafetensorsSet set = SafetensorsSet::open(index);
  CHECK(set.files().size() == 3);
  CHECK(set.find("model.layers.1.mlp.experts.gate_up_proj"));
  CHECK(set.find("model.embed_tokens.weight"));
  const SafetensorsSet from_dir = SafetensorsSet::open(dir.str());
  CHECK(from_dir.files().size() == 3);
  SECTION("missing shard") {
    const std::string shard = dir / "model-00002-of-00003.safetensors";
    std::filesystem::remove(shard);
    expect_error([&] { SafetensorsSet::open(index); }, ep::Status::not_found, shard);
  }
  SECTION("index names a tensor the shard lacks") {
    auto map = SafetensorsSet::parse_index(R"({"weight_map":{"nope":"model-00001-of-00003.safetensors"}})", "i.json");
    CHECK(map.at("nope") == "model-00001-of-00003.safetensors");
    ep::test::write_file(index, std::vector<uint8_t>{});
    std::string text = R"({"weight_map":{"nope":"model-00001-of-00003.safetensors"}})";
    ep::test::write_file(index, std::vector<uint8_t>(text.begin(), text.end()));
    expect_error([&] { SafetensorsSet::open(index); }, ep::Status::not_found, "'nope'");
  }
  SECTION("a shard of another checkpoint under a listed name") {
    TempDir other;
    ep::testkit::SyntheticSpec o = spec;
    o.num_layers = 3;
    ep::testkit::write_synthetic_safetensors(o, other.str(), ep::testkit::StLayout::fused);
    const std::string shard = dir / "model-00002-of-00003.safetensors";
    std::filesystem::copy_file(other / "model-00002-of-00003.safetensors", shard, std::filesystem::copy_options::overwrite_existing);
    try {
      (void)SafetensorsSet::open(index);
      FAIL("a foreign shard was accepted");
    } catch (const ep::Error &e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find("model-0000") != std::string::npos);
      CHECK(std::string(e.what()).find("tensor '") != std::string::npos);
    }
  }
  SECTION("a truncated shard names the file, the tensor and its offsets") {
    const std::string shard = dir / "model-00003-of-00003.safetensors";
    std::filesystem::resize_file(shard, std::filesystem::file_size(shard) - 5);
    expect_error([&] { SafetensorsSet::open(index); }, ep::Status::format, shard + ": truncated file: tensor '");
  }
  expect_error([] { SafetensorsSet::parse_index(R"({"weight_map":{"a":"../evil"}})", "i.json"); }, ep::Status::format,
               "not a file name");
  expect_error([] { SafetensorsSet::parse_index("{}", "i.json"); }, ep::Status::format, "weight_map");
}
