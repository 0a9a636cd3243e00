// Exact conversions of checkpoint encodings (format/microscale.hpp), checked value by value
// against an independent decoder of the source encoding, and the companion-tensor resolution
// (format/checkpoint_tensors.hpp) on hand-made checkpoints, good and bad.
#include "backend/dequant.hpp"
#include "core/error.hpp"
#include "format/checkpoint_tensors.hpp"
#include "format/microscale.hpp"
#include "format/safetensors.hpp"
#include "support/catch.hpp"
#include "support/expect_error.hpp"
#include "support/temp_dir.hpp"
#include "testkit/checkpoint.hpp"

#include <cmath>
#include <memory>
#include <cstring>
#include <random>

using namespace ep::format;
using ep::test::expect_error;
using ep::test::TempDir;

namespace {

/// OCP e2m1 code → value, written from the spec (sign, 2 exponent bits, 1 mantissa bit, bias 1).
double e2m1(uint8_t code) {
  const int e = (code >> 1) & 3, m = code & 1;
  const double mag = e == 0 ? 0.5 * m : std::ldexp(1.0 + 0.5 * m, e - 1);
  return (code & 8) ? -mag : mag;
}

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

}  // namespace

TEST_CASE("microscale: FP4 + E8M0 re-laid into MXFP4 dequantizes to the same values, bit for bit", "[format][microscale]") {
  std::mt19937 rng(11);
  const uint64_t rows = 5, cols = 96;
  std::vector<uint8_t> packed(rows * cols / 2), scales(rows * cols / 32);
  // every scale the MXFP4 decoder must reproduce, including the subnormal ones (0, 1) and the largest
  const uint8_t edge[] = {0, 1, 2, 3, 60, 117, 126, 127, 128, 200, 253, 254};
  for (int round = 0; round < 16; ++round) {
    for (auto &b : packed) b = static_cast<uint8_t>(rng());
    for (size_t i = 0; i < scales.size(); ++i) scales[i] = edge[(i + static_cast<size_t>(round)) % std::size(edge)];
    if (round == 0)  // every byte value at every position of a block
      for (size_t i = 0; i < packed.size(); ++i) packed[i] = static_cast<uint8_t>(i * 7 + i / 16);
    std::vector<uint8_t> mx(mxfp4_bytes(rows, cols));
    fp4_e8m0_to_mxfp4(packed.data(), scales.data(), rows, cols, mx.data(), "test");
    std::vector<float> got(rows * cols);
    ep::backend::dequantize_row(GgmlType::mxfp4, mx.data(), got.data(), static_cast<int64_t>(got.size()));
    for (uint64_t r = 0; r < rows; ++r)
      for (uint64_t c = 0; c < cols; ++c) {
        const uint8_t byte = packed[r * cols / 2 + c / 2];
        const uint8_t code = c % 2 ? byte >> 4 : byte & 0x0F;  // element 2i in the low nibble
        const double want = e2m1(code) * std::ldexp(1.0, static_cast<int>(scales[r * cols / 32 + c / 32]) - 127);
        const float w = static_cast<float>(want);
        if (std::isfinite(w)) REQUIRE(static_cast<double>(w) == want);  // beyond f32 both give inf
        INFO("row " << r << " col " << c << " code " << int(code) << " scale " << int(scales[r * cols / 32 + c / 32]));
        // equal values; ggml's MXFP4 table has +0 for the code of -0 (8), the only bit difference
        REQUIRE(got[r * cols + c] == w);
        if (code != 8) REQUIRE(bits_of(got[r * cols + c]) == bits_of(w));
      }
    // and back: the inverse gives the source bytes
    std::vector<uint8_t> p2(packed.size()), s2(scales.size());
    mxfp4_to_fp4_e8m0(mx.data(), rows, cols, p2.data(), s2.data());
    CHECK(p2 == packed);
    CHECK(s2 == scales);
  }
  scales[7] = 0xFF;
  std::vector<uint8_t> mx(mxfp4_bytes(rows, cols));
  expect_error([&] { fp4_e8m0_to_mxfp4(packed.data(), scales.data(), rows, cols, mx.data(), "f.safetensors: tensor 'w'"); },
               ep::Status::corrupt, "f.safetensors: tensor 'w': E8M0 scale byte 7");
}

TEST_CASE("microscale: FP8 e4m3 times power-of-two block scales is exact in bf16", "[format][microscale]") {
  CHECK(e4m3_value(0x7E) == 448.0);
  CHECK(e4m3_value(0x08) == std::ldexp(1.0, -6));
  CHECK(e4m3_value(0x01) == std::ldexp(1.0, -9));
  CHECK(e4m3_value(0xC0) == -2.0);
  CHECK(std::isnan(e4m3_value(0x7F)));
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7F) == 0x7F) continue;
    CHECK(e4m3_from_value(e4m3_value(static_cast<uint8_t>(b))) == (b == 0x80 ? 0x80 : b));
  }
  // all 254 finite codes in one 2 x 127 matrix, for block scales across the whole bf16-exact range
  const uint64_t rows = 2, cols = 127;
  std::vector<uint8_t> w(rows * cols);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<uint8_t>((i % 127) | (i >= 127 ? 0x80 : 0));
  for (int e : {3, 10, 100, 127, 130, 200, 246}) {
    const std::vector<uint8_t> sc = {static_cast<uint8_t>(e)};
    REQUIRE(fp8_block_type(sc.data(), 1, ScaleType::e8m0) == GgmlType::bf16);
    const std::vector<uint8_t> out = fp8_block_dequant(w.data(), sc.data(), ScaleType::e8m0, rows, cols, 128, 128, GgmlType::bf16, "t");
    for (size_t i = 0; i < w.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, out.data() + 2 * i, 2);
      REQUIRE(static_cast<double>(ep::backend::bf16_to_fp32(h)) == e4m3_value(w[i]) * std::ldexp(1.0, e - 127));
    }
  }
  // scales that bf16 cannot hold every product of: f32, still exact
  for (int e : {0, 2, 247}) {
    const std::vector<uint8_t> sc = {static_cast<uint8_t>(e)};
    CHECK(fp8_block_type(sc.data(), 1, ScaleType::e8m0) == GgmlType::f32);
  }
  {
    const std::vector<uint8_t> sc = {2};
    const std::vector<uint8_t> out = fp8_block_dequant(w.data(), sc.data(), ScaleType::e8m0, rows, cols, 128, 128, GgmlType::f32, "t");
    for (size_t i = 0; i < w.size(); ++i) {
      float f;
      std::memcpy(&f, out.data() + 4 * i, 4);
      REQUIRE(static_cast<double>(f) == e4m3_value(w[i]) * std::ldexp(1.0, -125));
    }
  }
  // F32 scales: powers of two in range are bf16, anything else the f32 product
  const float pow2 = 0.0078125f, other = 0.3f;
  std::vector<uint8_t> fs(4);
  std::memcpy(fs.data(), &pow2, 4);
  CHECK(fp8_block_type(fs.data(), 1, ScaleType::f32) == GgmlType::bf16);
  std::memcpy(fs.data(), &other, 4);
  REQUIRE(fp8_block_type(fs.data(), 1, ScaleType::f32) == GgmlType::f32);
  const std::vector<uint8_t> out = fp8_block_dequant(w.data(), fs.data(), ScaleType::f32, rows, cols, 128, 128, GgmlType::f32, "t");
  for (size_t i = 0; i < w.size(); ++i) {
    float f;
    std::memcpy(&f, out.data() + 4 * i, 4);
    REQUIRE(f == static_cast<float>(e4m3_value(w[i])) * other);
  }
  // blocks: each 2 x 3 block has its own scale, partial blocks at the edges
  {
    const uint64_t r = 5, c = 7;
    std::vector<uint8_t> ww(r * c, 0x38);  // 1.0
    std::vector<uint8_t> sc(3 * 3);
    for (size_t i = 0; i < sc.size(); ++i) sc[i] = static_cast<uint8_t>(120 + i);
    const std::vector<uint8_t> o = fp8_block_dequant(ww.data(), sc.data(), ScaleType::e8m0, r, c, 2, 3, GgmlType::bf16, "t");
    for (uint64_t i = 0; i < r; ++i)
      for (uint64_t j = 0; j < c; ++j) {
        uint16_t h;
        std::memcpy(&h, o.data() + 2 * (i * c + j), 2);
        CHECK(ep::backend::bf16_to_fp32(h) == std::ldexp(1.0f, static_cast<int>(120 + (i / 2) * 3 + j / 3) - 127));
      }
  }
  std::vector<uint8_t> nan = w;
  nan[5] = 0x7F;
  const std::vector<uint8_t> sc = {127};
  expect_error([&] { fp8_block_dequant(nan.data(), sc.data(), ScaleType::e8m0, rows, cols, 128, 128, GgmlType::bf16, "x: tensor 'q'"); },
               ep::Status::corrupt, "x: tensor 'q': element 5");
}

namespace {

struct T {
  std::string name;
  StDtype dtype;
  std::vector<uint64_t> shape;
};

std::string write(const TempDir &dir, const std::vector<T> &ts, const std::string &file = "model.safetensors") {
  std::vector<StWriteTensor> w;
  for (const T &t : ts) w.push_back({t.name, t.dtype, t.shape});
  const std::string p = dir / file;
  write_safetensors(p, w, [](size_t t, uint64_t off, std::span<uint8_t> out) {
    ep::testkit::synthetic_bytes(3, t, off, out);
    for (auto &b : out) b &= 0x77;  // no NaN FP8 / E8M0 bytes
  });
  return p;
}

/// The resolved tensors point into their set: keep both.
struct Resolved : StResolved {
  std::unique_ptr<SafetensorsSet> set;
};
Resolved resolve(const std::string &path, CheckpointQuant q = {}) {
  Resolved r;
  r.set = std::make_unique<SafetensorsSet>(SafetensorsSet::open(path));
  static_cast<StResolved &>(r) = resolve_checkpoint_tensors(*r.set, q);
  return r;
}

std::string rejected(const StResolved &r) {
  std::string s;
  for (const auto &x : r.rejected) s += x + "\n";
  return s;
}

}  // namespace

TEST_CASE("checkpoint tensors: companions resolve, and every mismatch is named", "[format][microscale][hostile]") {
  TempDir dir;
  SECTION("DeepSeek-V4 official: FP8 + block scales, FP4 experts, plain tensors") {
    const std::string p = write(dir, {{"a.wq.weight", StDtype::f8_e4m3, {300, 200}},
                                      {"a.wq.scale", StDtype::f8_e8m0, {3, 2}},
                                      {"e.0.w1.weight", StDtype::i8, {64, 32}},
                                      {"e.0.w1.scale", StDtype::f8_e8m0, {64, 2}},
                                      {"n.weight", StDtype::bf16, {200}},
                                      {"t.tid2eid", StDtype::i64, {7, 2}}});
    const Resolved r = resolve(p);
    INFO(rejected(r));
    REQUIRE(r.rejected.empty());
    REQUIRE(r.tensors.size() == 4);
    for (const StLogical &l : r.tensors) {
      if (l.name == "a.wq.weight") {
        CHECK(l.encoding == StEncoding::fp8_block);
        CHECK(l.shape == std::vector<uint64_t>{300, 200});
        CHECK(l.read().size() == l.nbytes());
      } else if (l.name == "e.0.w1.weight") {
        CHECK(l.encoding == StEncoding::fp4_e8m0);
        CHECK(l.type == GgmlType::mxfp4);
        CHECK(l.shape == std::vector<uint64_t>{64, 64});
        CHECK(l.read().size() == mxfp4_bytes(64, 64));
      } else {
        CHECK(l.encoding == StEncoding::plain);
      }
    }
  }
  SECTION("compressed-tensors mxfp4-pack-quantized") {
    const std::string p = write(dir, {{"x.w2.weight_packed", StDtype::u8, {16, 64}}, {"x.w2.weight_scale", StDtype::u8, {16, 4}}});
    const Resolved r = resolve(p);
    REQUIRE(r.rejected.empty());
    REQUIRE(r.tensors.size() == 1);
    CHECK(r.tensors[0].name == "x.w2.weight");
    CHECK(r.tensors[0].shape == std::vector<uint64_t>{16, 128});
    CHECK(fp4_scale_tensor_name("x.w2.weight_packed") == "x.w2.weight_scale");
    CHECK(fp4_scale_tensor_name("x.w2.weight") == "x.w2.scale");
  }
  SECTION("a scale shape that does not match the weight") {
    const std::string p = write(dir, {{"a.wq.weight", StDtype::f8_e4m3, {300, 200}}, {"a.wq.scale", StDtype::f8_e8m0, {2, 2}}});
    const std::string why = rejected(resolve(p));
    CHECK(why.find("scale shape does not match") != std::string::npos);
    CHECK(why.find("a.wq.scale") != std::string::npos);
    CHECK(why.find(p) != std::string::npos);
    CHECK(why.find("offset") != std::string::npos);
    // the same file is fine with the block size its config.json gives
    CheckpointQuant q = CheckpointQuant::from_config_json(R"({"quantization_config":{"fmt":"e4m3","scale_fmt":"ue8m0","weight_block_size":[150,100]}})", "c");
    CHECK(resolve(p, q).rejected.empty());
  }
  SECTION("FP4 scales of the wrong shape or dtype") {
    const std::string p = write(dir, {{"e.0.w1.weight", StDtype::i8, {64, 32}}, {"e.0.w1.scale", StDtype::f8_e8m0, {64, 4}},
                                      {"e.1.w1.weight", StDtype::i8, {64, 32}}, {"e.1.w1.scale", StDtype::bf16, {64, 2}}});
    const std::string why = rejected(resolve(p));
    CHECK(why.find("e.0.w1.scale") != std::string::npos);
    CHECK(why.find("one per 32") != std::string::npos);
    CHECK(why.find("FP4 scales must be E8M0") != std::string::npos);
  }
  SECTION("a weight whose dtype needs a scale it does not have, and an orphan scale") {
    const std::string p = write(dir, {{"a.weight", StDtype::f8_e4m3, {4, 4}}, {"b.weight", StDtype::i8, {4, 4}},
                                      {"c.scale", StDtype::f8_e8m0, {1, 1}}, {"d.weight_packed", StDtype::u8, {4, 16}}});
    const Resolved r = resolve(p);
    const std::string why = rejected(r);
    CHECK(r.tensors.empty());
    CHECK(why.find("'a.weight'") != std::string::npos);
    CHECK(why.find("FP8 without its block scale tensor a.scale") != std::string::npos);
    CHECK(why.find("packed FP4 needs b.scale") != std::string::npos);
    CHECK(why.find("a scale tensor without its weight c.weight") != std::string::npos);
    CHECK(why.find("d.weight_scale") != std::string::npos);
  }
  SECTION("quantization_config this reader does not know") {
    expect_error([] { CheckpointQuant::from_config_json(R"({"quantization_config":{"fmt":"e5m2"}})", "cfg.json"); },
                 ep::Status::unsupported, "cfg.json");
  }
}

TEST_CASE("checkpoint tensors: a NaN scale in the file is an error naming file, tensor and offset", "[format][microscale][hostile]") {
  TempDir dir;
  std::vector<StWriteTensor> w = {{"e.0.w1.scale", StDtype::f8_e8m0, {2, 1}}, {"e.0.w1.weight", StDtype::i8, {2, 16}}};
  const std::string p = dir / "m.safetensors";
  write_safetensors(p, w, [](size_t t, uint64_t, std::span<uint8_t> out) {
    for (auto &b : out) b = t == 0 ? 0xFF : 0x11;
  });
  const Resolved r = resolve(p);
  REQUIRE(r.tensors.size() == 1);
  expect_error([&] { (void)r.tensors[0].read(); }, ep::Status::corrupt, "e.0.w1.scale");
  try {
    (void)r.tensors[0].read();
  } catch (const ep::Error &e) {
    CHECK(std::string(e.what()).find(p) != std::string::npos);
    CHECK(std::string(e.what()).find("at offset") != std::string::npos);
  }
}
