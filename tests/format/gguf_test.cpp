#include "core/error.hpp"
#include "format/gguf.hpp"
#include "format/gguf_writer.hpp"
#include "support/expect_error.hpp"
#include "support/temp_dir.hpp"
#include "support/catch.hpp"
#include "testkit/checkpoint.hpp"

#include <cstring>
#include <filesystem>
#include <random>

using namespace ep::format;
using ep::test::TempDir;

using ep::test::expect_error;

namespace {

std::shared_ptr<MemorySource> mem(const std::vector<uint8_t> &bytes) {
  return std::make_shared<MemorySource>(std::span<const uint8_t>(bytes.data(), bytes.size()), "mem.gguf");
}


std::vector<std::pair<std::string, GgufValue>> kv_list() {
  return {
      {"k.u8", GgufValue::make_u8(250)},
      {"k.i8", GgufValue::make_i8(-100)},
      {"k.u16", GgufValue::make_u16(60000)},
      {"k.i16", GgufValue::make_i16(-20000)},
      {"k.u32", GgufValue::make_u32(4000000000u)},
      {"k.i32", GgufValue::make_i32(-2000000000)},
      {"k.f32", GgufValue::make_f32(3.5f)},
      {"k.bool", GgufValue::make_bool(true)},
      {"k.string", GgufValue::make_string("h\xc3\xa9llo\nworld")},
      {"k.u64", GgufValue::make_u64(1ull << 63)},
      {"k.i64", GgufValue::make_i64(-(1ll << 62))},
      {"k.f64", GgufValue::make_f64(-2.25)},
      {"k.arr_f32", GgufValue::make_array(GgufType::f32, {GgufValue::make_f32(1.0f), GgufValue::make_f32(-2.0f)})},
      {"k.arr_str", GgufValue::make_array(GgufType::string, {GgufValue::make_string("a"), GgufValue::make_string("")})},
      {"k.arr_bool", GgufValue::make_array(GgufType::boolean, {GgufValue::make_bool(false), GgufValue::make_bool(true)})},
      {"k.nested", GgufValue::make_array(
                       GgufType::array,
                       {GgufValue::make_array(GgufType::i64, {GgufValue::make_i64(-1), GgufValue::make_i64(7)}),
                        GgufValue::make_array(GgufType::array,
                                              {GgufValue::make_array(GgufType::u8, {GgufValue::make_u8(9)})})})},
      {"k.empty", GgufValue::make_array(GgufType::u32, {})},
  };
}

GgufWriter all_types_writer() {
  GgufWriter w;
  for (auto &[k, v] : kv_list()) w.add(k, v);
  w.add_tensor("a.weight", GgmlType::f32, {8, 3});
  w.add_tensor("b.weight", GgmlType::q8_0, {64, 2, 3});
  w.add_tensor("c.weight", GgmlType::mxfp4, {32});
  w.add_tensor("d.weight", GgmlType::q4_k, {256, 1, 1, 2});
  return w;
}

void fill_pattern(size_t t, uint64_t off, std::span<uint8_t> out) {
  ep::testkit::synthetic_bytes(99, t, off, out);
}

}  // namespace

TEST_CASE("GGUF writer and reader round-trip every value type, nested arrays and tensors", "[format][gguf]") {
  TempDir dir;
  GgufWriter w = all_types_writer();
  w.set_alignment(64);
  const auto paths = w.write(dir / "all.gguf", 1, fill_pattern);
  REQUIRE(paths.size() == 1);
  const GgufFile g = GgufFile::open(paths[0]);
  CHECK(g.version() == 3);
  CHECK(g.alignment() == 64);
  CHECK(g.data_offset() % 64 == 0);
  CHECK(g.find("k.u8")->u == 250);
  CHECK(g.find("k.i8")->i == -100);
  CHECK(g.find("k.u16")->u == 60000);
  CHECK(g.find("k.i16")->i == -20000);
  CHECK(g.find("k.u32")->u == 4000000000u);
  CHECK(g.find("k.i32")->i == -2000000000);
  CHECK(g.find("k.f32")->f == 3.5);
  CHECK(g.find("k.bool")->u == 1);
  CHECK(g.find("k.string")->s == "h\xc3\xa9llo\nworld");
  CHECK(g.find("k.u64")->u == (1ull << 63));
  CHECK(g.find("k.i64")->i == -(1ll << 62));
  CHECK(g.find("k.f64")->f == -2.25);
  const GgufValue *arr = g.find("k.arr_f32");
  REQUIRE(arr->array_size() == 2);
  CHECK(arr->at(1).f == -2.0);
  CHECK(g.find("k.arr_str")->at(0).s == "a");
  CHECK(g.find("k.arr_bool")->at(1).u == 1);
  const GgufValue *nested = g.find("k.nested");
  REQUIRE(nested->array_size() == 2);
  CHECK(nested->at(0).at(0).i == -1);
  CHECK(nested->at(1).at(0).at(0).u == 9);
  CHECK(g.find("k.empty")->array_size() == 0);
  // Every written value compares equal after the round trip, in order.
  const auto expected = kv_list();
  REQUIRE(g.metadata().size() == expected.size() + 1);  // + general.alignment
  for (size_t k = 0; k < expected.size(); ++k) {
    INFO(expected[k].first);
    CHECK(g.metadata()[k].first == expected[k].first);
    CHECK(g.metadata()[k].second == expected[k].second);
  }
  REQUIRE(g.tensors().size() == 4);
  const GgufTensorInfo *b = g.find_tensor("b.weight");
  REQUIRE(b);
  CHECK(b->n_dims == 3);
  CHECK(b->ne[0] == 64);
  CHECK(b->ne[2] == 3);
  CHECK(b->type == GgmlType::q8_0);
  CHECK(b->nbytes == 2 * 34 * 2 * 3);
  const GgufTensorInfo *d = g.find_tensor("d.weight");
  CHECK(d->n_dims == 4);
  CHECK(d->nbytes == 144 * 2);
  for (size_t t = 0; t < g.tensors().size(); ++t) {
    const auto &ti = g.tensors()[t];
    CHECK(ti.file_offset % 64 == 0);
    std::vector<uint8_t> want(ti.nbytes), got(ti.nbytes);
    fill_pattern(t, 0, want);
    g.source().read(ti.file_offset, got.data(), got.size());
    CHECK(want == got);
  }
}

TEST_CASE("GGUF writer: tensors of several chunks (filled ahead on a helper thread) and a failing fill", "[format][gguf]") {
  // The writer fills the next 8 MiB chunk while it writes this one: the bytes must not change,
  // and a fill that throws must surface as that error from write(), with nothing left running.
  TempDir dir;
  GgufWriter w;
  w.add_tensor("big.weight", GgmlType::f32, {uint64_t{5} << 20});  // 20 MiB: 3 chunks
  w.add_tensor("small.weight", GgmlType::q8_0, {64, 3});
  w.add_tensor("odd.weight", GgmlType::f32, {(uint64_t{2} << 20) + 7});  // 8 MiB + 28 B: 2 chunks
  const auto paths = w.write(dir / "chunks.gguf", 1, fill_pattern);
  const GgufFile g = GgufFile::open(paths.at(0));
  REQUIRE(g.tensors().size() == 3);
  for (size_t t = 0; t < 3; ++t) {
    const auto &ti = g.tensors()[t];
    std::vector<uint8_t> want(ti.nbytes), got(ti.nbytes);
    fill_pattern(t, 0, want);  // the whole tensor at once: chunking must not show
    g.source().read(ti.file_offset, got.data(), got.size());
    INFO(ti.name);
    CHECK(want == got);
  }
  int calls = 0;
  auto failing = [&](size_t t, uint64_t off, std::span<uint8_t> out) {
    if (++calls == 3) ep::fail(ep::Status::io, "fill of tensor {} at offset {} failed (injected)", t, off);
    fill_pattern(t, off, out);
  };
  try {
    w.write(dir / "failing.gguf", 1, failing);
    FAIL("a failing fill was not reported");
  } catch (const ep::Error &e) {
    CHECK(e.status() == ep::Status::io);
    CHECK(std::string(e.what()).find("injected") != std::string::npos);
  }
  CHECK(calls == 3);  // nothing filled after the failure
  // nothing under the GGUF's name, and no partial file left behind
  CHECK_FALSE(std::filesystem::exists(dir / "failing.gguf"));
  CHECK_FALSE(std::filesystem::exists(dir / "failing.gguf.partial"));
  // a complete write leaves only the file itself
  CHECK(std::filesystem::exists(dir / "chunks.gguf"));
  CHECK_FALSE(std::filesystem::exists(dir / "chunks.gguf.partial"));
}

TEST_CASE("GGUF default alignment is 32 and values print", "[format][gguf]") {
  TempDir dir;
  GgufWriter w = all_types_writer();
  w.write(dir / "a.gguf", 1, fill_pattern);
  const GgufFile g = GgufFile::open(dir / "a.gguf");
  CHECK(g.alignment() == 32);
  CHECK(g.find("general.alignment") == nullptr);
  CHECK(g.find("k.nested")->to_string() == "array[2] [i64[2] [-1, 7], array[1] [u8[1] [9]]]");
  CHECK(g.find("k.arr_str")->to_string() == "string[2] [\"a\", \"\"]");
}

TEST_CASE("GGUF split sets are found from any shard; a missing or changed shard is named", "[format][gguf][split]") {
  TempDir dir;
  ep::testkit::SyntheticSpec spec;
  spec.num_layers = 3;
  spec.n_shards = 3;
  const auto paths = ep::testkit::write_synthetic_gguf(spec, dir / "model.gguf");
  REQUIRE(paths.size() == 3);
  CHECK(paths[0] == dir / "model-00001-of-00003.gguf");
  const GgufSet set = GgufSet::open(paths[0]);
  CHECK(set.shards().size() == 3);
  CHECK(set.find("general.architecture")->s == "deepseek4");
  CHECK(set.find_tensor("blk.2.ffn_down_exps.weight"));
  CHECK(set.find_tensor("blk.0.ffn_gate_exps.weight"));
  const GgufSet from_middle = GgufSet::open(paths[1]);
  CHECK(from_middle.tensor_count() == set.tensor_count());
  CHECK(from_middle.first().path() == paths[0]);

  SECTION("missing shard") {
    std::filesystem::remove(paths[1]);
    expect_error([&] { GgufSet::open(paths[0]); }, ep::Status::not_found, paths[1]);
  }
  SECTION("changed shard: another shard copied over it") {
    std::filesystem::copy_file(paths[2], paths[1], std::filesystem::copy_options::overwrite_existing);
    expect_error([&] { GgufSet::open(paths[0]); }, ep::Status::format, paths[1]);
  }
  SECTION("changed shard: a different model's shard") {
    TempDir other;
    ep::testkit::SyntheticSpec spec2 = spec;
    spec2.num_layers = 5;
    const auto p2 = ep::testkit::write_synthetic_gguf(spec2, other / "model.gguf");
    std::filesystem::copy_file(p2[2], paths[2], std::filesystem::copy_options::overwrite_existing);
    expect_error([&] { GgufSet::open(paths[0]); }, ep::Status::format, "a shard changed");
  }
  CHECK(parse_split_name("/x/name-00002-of-00038.gguf")->index == 2);
  CHECK(parse_split_name("/x/name-00002-of-00038.gguf")->count == 38);
  CHECK(parse_split_name("/x/name-00002-of-00038.gguf")->prefix == "/x/name");
  CHECK_FALSE(parse_split_name("/x/name.gguf"));
  CHECK_FALSE(parse_split_name("/x/name-00004-of-00003.gguf"));
}

TEST_CASE("GGUF reader rejects hostile headers with specific errors", "[format][gguf][hostile]") {
  auto header = [](uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    std::vector<uint8_t> b(24);
    const uint32_t magic = 0x46554747;
    std::memcpy(b.data(), &magic, 4);
    std::memcpy(b.data() + 4, &version, 4);
    std::memcpy(b.data() + 8, &n_tensors, 8);
    std::memcpy(b.data() + 16, &n_kv, 8);
    return b;
  };
  auto append = [](std::vector<uint8_t> &b, const void *p, size_t n) {
    b.insert(b.end(), static_cast<const uint8_t *>(p), static_cast<const uint8_t *>(p) + n);
  };
  auto append_str = [&](std::vector<uint8_t> &b, const std::string &s) {
    const uint64_t n = s.size();
    append(b, &n, 8);
    append(b, s.data(), s.size());
  };
  {
    std::vector<uint8_t> b = header(3, 0, 0);
    b[0] = 'X';
    expect_error([&] { GgufFile::parse(mem(b)); }, ep::Status::format, "bad magic");
  }
  expect_error([&] { GgufFile::parse(mem(header(1, 0, 0))); }, ep::Status::version, "unsupported GGUF version 1");
  expect_error([&] { GgufFile::parse(mem(header(3, 0, 1ull << 60))); }, ep::Status::format, "metadata count");
  expect_error([&] { GgufFile::parse(mem(header(3, 1ull << 62, 0))); }, ep::Status::format, "tensor count");
  {
    std::vector<uint8_t> b = header(3, 0, 1);
    const uint64_t huge = 1ull << 62;
    append(b, &huge, 8);
    b.resize(b.size() + 16, 0);
    expect_error([&] { GgufFile::parse(mem(b)); }, ep::Status::format, "string length");
  }
  {
    std::vector<uint8_t> b = header(3, 0, 1);
    append_str(b, "k");
    const uint32_t t = 9, et = 4;
    const uint64_t n = 1ull << 40;
    append(b, &t, 4);
    append(b, &et, 4);
    append(b, &n, 8);
    expect_error([&] { GgufFile::parse(mem(b)); }, ep::Status::format, "array of 1099511627776");
  }
  {
    std::vector<uint8_t> b = header(3, 0, 1);
    append_str(b, "k");
    const uint32_t t = 13;
    append(b, &t, 4);
    expect_error([&] { GgufFile::parse(mem(b)); }, ep::Status::format, "value type 13");
  }
  {
    std::vector<uint8_t> b = header(3, 0, 1);
    append_str(b, "k");
    const uint32_t t = 7;
    append(b, &t, 4);
    b.push_back(2);
    expect_error([&] { GgufFile::parse(mem(b)); }, ep::Status::format, "bool");
  }
  {  // nested arrays deeper than the limit
    std::vector<uint8_t> b = header(3, 0, 1);
    append_str(b, "deep");
    const uint32_t arr = 9;
    append(b, &arr, 4);
    for (int d = 0; d < 12; ++d) {
      const uint64_t one = 1;
      append(b, &arr, 4);
      append(b, &one, 8);
    }
    b.resize(b.size() + 64, 0);
    expect_error([&] { GgufFile::parse(mem(b)); }, ep::Status::format, "nested deeper");
  }
  {  // general.alignment not a power of two
    std::vector<uint8_t> b = header(3, 0, 1);
    append_str(b, "general.alignment");
    const uint32_t t = 4, v = 48;
    append(b, &t, 4);
    append(b, &v, 4);
    expect_error([&] { GgufFile::parse(mem(b)); }, ep::Status::format, "general.alignment");
  }
  auto tensor = [&](uint32_t n_dims, std::vector<uint64_t> ne, uint32_t type, uint64_t offset, size_t data_bytes) {
    std::vector<uint8_t> b = header(3, 1, 0);
    append_str(b, "t");
    append(b, &n_dims, 4);
    for (uint64_t d : ne) append(b, &d, 8);
    append(b, &type, 4);
    append(b, &offset, 8);
    b.resize((b.size() + 31) / 32 * 32 + data_bytes, 0);
    return b;
  };
  CHECK_NOTHROW(GgufFile::parse(mem(tensor(2, {4, 2}, 0, 0, 32))));
  expect_error([&] { GgufFile::parse(mem(tensor(5, {1, 1, 1, 1, 1}, 0, 0, 32))); }, ep::Status::format, "5 dimensions");
  expect_error([&] { GgufFile::parse(mem(tensor(2, {4, 2}, 4, 0, 32))); }, ep::Status::unsupported, "ggml type id 4");
  expect_error([&] { GgufFile::parse(mem(tensor(2, {4, 2}, 0, 0, 16))); }, ep::Status::format, "truncated file");
  expect_error([&] { GgufFile::parse(mem(tensor(2, {4, 2}, 0, 8, 64))); }, ep::Status::format, "not a multiple of the alignment");
  expect_error([&] { GgufFile::parse(mem(tensor(2, {1ull << 40, 1ull << 40}, 0, 0, 32))); }, ep::Status::format, "overflows");
  expect_error([&] { GgufFile::parse(mem(tensor(1, {33}, 8, 0, 64))); }, ep::Status::shape, "not a whole number");
  expect_error([&] { GgufFile::parse(mem(tensor(2, {4, 2}, 0, (1ull << 63), 32))); }, ep::Status::format, "");
}

TEST_CASE("GGUF reader survives every truncation and random corruption of a real file", "[format][gguf][hostile]") {
  TempDir dir;
  ep::testkit::SyntheticSpec spec;
  spec.num_layers = 2;
  spec.num_experts = 2;
  spec.n_embd = 64;
  spec.n_ff = 32;
  ep::testkit::write_synthetic_gguf(spec, dir / "s.gguf");
  const std::vector<uint8_t> good = ep::test::read_file(dir / "s.gguf");
  REQUIRE_NOTHROW(GgufFile::parse(mem(good)));
  const uint64_t data_offset = GgufFile::parse(mem(good)).data_offset();
  size_t errors = 0;
  for (size_t len = 0; len < good.size(); len += (len < data_offset + 64 ? 1 : 97)) {
    std::vector<uint8_t> cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(len));
    try {
      GgufFile::parse(mem(cut));
    } catch (const ep::Error &e) {
      ++errors;
      CHECK((e.status() == ep::Status::format || e.status() == ep::Status::version));
    }
  }
  CHECK(errors > data_offset);  // every cut inside the header and the data fails
  std::mt19937_64 rng(1234);
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<uint8_t> bad = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) bad[rng() % data_offset] ^= static_cast<uint8_t>(1 + rng() % 255);
    try {
      GgufFile g = GgufFile::parse(mem(bad));
      for (const auto &t : g.tensors()) CHECK(t.file_offset + t.nbytes <= bad.size());
    } catch (const ep::Error &) {
    }
  }
}
