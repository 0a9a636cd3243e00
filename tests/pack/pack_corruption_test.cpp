// Corrupts a valid pack in every header field, in index entries and in payloads, truncates it
// at several points, and checks each is rejected with its own specific error: at open
// (structure) or by full validation (payload). Nothing may crash.
#include "core/error.hpp"
#include "format/hash.hpp"
#include "format/pack_file.hpp"
#include "pack/builder.hpp"
#include "pack/manifest.hpp"
#include "support/temp_dir.hpp"
#include "pack/validate.hpp"
#include "support/catch.hpp"
#include "testkit/checkpoint.hpp"

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <functional>
#include <random>

using namespace ep;
using format::PackEntry;
using format::PackHeader;
using format::ValidationLevel;
using test::TempDir;

namespace {

struct Fixture {
  TempDir dir;
  std::string src;
  std::string pack_path;
  std::vector<uint8_t> bytes;
  Fixture() {
    testkit::SyntheticSpec spec;
    spec.num_layers = 2;
    spec.num_experts = 4;
    spec.n_embd = 128;
    spec.n_ff = 64;
    spec.seed = 5;
    src = testkit::write_synthetic_gguf(spec, dir / "src.gguf")[0];
    pack_path = dir / "p.epk";
    pack::build_pack(std::vector<std::string>{src}, pack_path);
    bytes = test::read_file(pack_path);
  }
  PackHeader header() const {
    PackHeader h;
    std::memcpy(&h, bytes.data(), sizeof h);
    return h;
  }
};

std::unique_ptr<format::PackFile> parse(const std::vector<uint8_t> &b, ValidationLevel level = ValidationLevel::full) {
  auto src = std::make_shared<std::vector<uint8_t>>(b);
  struct Owned : format::ByteSource {
    std::shared_ptr<std::vector<uint8_t>> data;
    std::string nm = "corrupt.epk";
    uint64_t size() const override { return data->size(); }
    const std::string &name() const override { return nm; }
    void read_unchecked(uint64_t off, void *dst, size_t n) const override { std::memcpy(dst, data->data() + off, n); }
  };
  auto owned = std::make_shared<Owned>();
  owned->data = src;
  return format::PackFile::parse(owned, level);
}

// The parse must throw ep::Error with @p status and a message containing @p needle.
void expect_reject(const std::vector<uint8_t> &b, Status status, const std::string &needle,
                   ValidationLevel level = ValidationLevel::full) {
  try {
    parse(b, level);
    FAIL("accepted; expected " << status_name(status) << " '" << needle << "'");
  } catch (const Error &e) {
    INFO(e.what());
    CHECK(e.status() == status);
    CHECK(std::string(e.what()).find(needle) != std::string::npos);
    CHECK(std::string(e.what()).find('\n') == std::string::npos);  // one line
  }
}

// Rewrites the header (fixing its checksum) after @p edit.
std::vector<uint8_t> with_header(std::vector<uint8_t> b, const std::function<void(PackHeader &)> &edit) {
  PackHeader h;
  std::memcpy(&h, b.data(), sizeof h);
  edit(h);
  h.header_xxh3 = format::xxh3_64(&h, format::kPackHeaderHashedBytes);
  std::memcpy(b.data(), &h, sizeof h);
  return b;
}

// Edits index entry @p i, then fixes the index digest and the header checksum.
std::vector<uint8_t> with_entry(std::vector<uint8_t> b, size_t i, const std::function<void(PackEntry &)> &edit) {
  PackHeader h;
  std::memcpy(&h, b.data(), sizeof h);
  PackEntry e;
  std::memcpy(&e, b.data() + h.index_offset + i * sizeof e, sizeof e);
  edit(e);
  std::memcpy(b.data() + h.index_offset + i * sizeof e, &e, sizeof e);
  format::Sha256Hasher d;
  d.update(b.data() + h.index_offset, h.index_size);
  d.update(b.data() + h.strings_offset, h.strings_size);
  const auto digest = d.finish();
  return with_header(std::move(b), [&](PackHeader &hh) { std::memcpy(hh.index_sha256, digest.data(), 32); });
}

}  // namespace

TEST_CASE("the uncorrupted pack opens at every level", "[pack][corrupt]") {
  Fixture f;
  CHECK_NOTHROW(parse(f.bytes, ValidationLevel::structure));
  CHECK_NOTHROW(parse(f.bytes, ValidationLevel::sampled));
  CHECK_NOTHROW(parse(f.bytes, ValidationLevel::full));
}

TEST_CASE("every header byte flipped is rejected with the error of its field", "[pack][corrupt][header]") {
  Fixture f;
  for (size_t off = 0; off < sizeof(PackHeader); ++off) {
    for (uint8_t mask : {uint8_t{0x01}, uint8_t{0x80}}) {
      std::vector<uint8_t> b = f.bytes;
      b[off] ^= mask;
      INFO("offset " << off << " mask " << int(mask));
      if (off < 8) expect_reject(b, Status::format, "bad magic");
      else if (off < 12) expect_reject(b, Status::version, "unsupported version");
      else if (off < 20) expect_reject(b, Status::struct_size, "wrong struct size");
      else expect_reject(b, Status::corrupt, "header checksum mismatch");
    }
  }
}

TEST_CASE("header fields with a recomputed checksum are checked one by one", "[pack][corrupt][header]") {
  Fixture f;
  const PackHeader h = f.header();
  expect_reject(with_header(f.bytes, [](PackHeader &x) { x.flags = 4; }), Status::unsupported, "unsupported flags");
  expect_reject(with_header(f.bytes, [](PackHeader &x) { x.reserved[3] = 1; }), Status::format, "reserved");
  expect_reject(with_header(f.bytes, [](PackHeader &x) { x.num_roles = 2; }), Status::format, "num_roles");
  expect_reject(with_header(f.bytes, [](PackHeader &x) { x.num_layers = 0; }), Status::format, "empty pack");
  expect_reject(with_header(f.bytes, [](PackHeader &x) { x.alignment = 3000; }), Status::format, "alignment");
  expect_reject(with_header(f.bytes, [](PackHeader &x) { x.data_start += 64; }), Status::format, "misaligned offset");
  expect_reject(with_header(f.bytes, [](PackHeader &x) { x.object_stride += 512; }), Status::format, "misaligned offset");
  expect_reject(with_header(f.bytes, [](PackHeader &x) { x.file_size += 4096; }), Status::format, "truncated file");
  expect_reject(with_header(f.bytes, [](PackHeader &x) { x.file_size -= 4096; }), Status::format, "trailing bytes");
  expect_reject(with_header(f.bytes, [](PackHeader &x) { x.num_layers += 1; }), Status::format, "objects of");
  expect_reject(with_header(f.bytes, [](PackHeader &x) { x.num_experts = 0x40000000; }), Status::format, "");
  expect_reject(with_header(f.bytes, [](PackHeader &x) { x.object_stride = 1ull << 62; }), Status::format, "overflows");
  expect_reject(with_header(f.bytes, [](PackHeader &x) { x.index_size += 128; }), Status::format, "index_size");
  expect_reject(with_header(f.bytes, [](PackHeader &x) { x.index_offset = 8; }), Status::format, "overlaps the header");
  expect_reject(with_header(f.bytes, [&](PackHeader &x) { x.strings_offset = h.index_offset; }), Status::format,
                "must lie in order");
  expect_reject(with_header(f.bytes, [](PackHeader &x) { x.index_sha256[0] ^= 1; }), Status::corrupt,
                "index digest mismatch");
  // Identity digests are not checked by the structure (they are compared with the manifest).
  CHECK_NOTHROW(parse(with_header(f.bytes, [](PackHeader &x) { x.top_k = 99; })));
}

TEST_CASE("index entries: flipped bytes and edited fields", "[pack][corrupt][index]") {
  Fixture f;
  const PackHeader h = f.header();
  for (uint64_t off = h.index_offset; off < h.strings_offset + h.strings_size; ++off) {
    std::vector<uint8_t> b = f.bytes;
    b[off] ^= 0x10;
    INFO("offset " << off);
    expect_reject(b, Status::corrupt, "index digest mismatch", ValidationLevel::structure);
  }
  expect_reject(with_entry(f.bytes, 4, [](PackEntry &e) { e.ggml_type = 1000; }), Status::unsupported, "unsupported dtype");
  expect_reject(with_entry(f.bytes, 4, [](PackEntry &e) { e.ne[0] *= 2; }), Status::shape, "shape mismatch");
  expect_reject(with_entry(f.bytes, 4, [](PackEntry &e) { e.n_dims = 7; }), Status::shape, "shape mismatch");
  expect_reject(with_entry(f.bytes, 4, [](PackEntry &e) { e.nbytes += 17; }), Status::shape, "shape mismatch");
  expect_reject(with_entry(f.bytes, 5, [](PackEntry &e) {
                  e.ne[1] *= 2;
                  e.nbytes *= 2;
                }),
                Status::shape, "expert 0");
  expect_reject(with_entry(f.bytes, 4, [](PackEntry &e) { e.pack_offset += 256; }), Status::format, "misaligned offset");
  expect_reject(with_entry(f.bytes, 0, [](PackEntry &e) { e.pack_offset -= 4096; }), Status::format, "misaligned offset");
  expect_reject(with_entry(f.bytes, 3, [](PackEntry &e) { e.expert = 2; }), Status::format, "expected (0, 1, 0)");
  expect_reject(with_entry(f.bytes, 3, [](PackEntry &e) { e.role = 2; }), Status::format, "expected (0, 1, 0)");
  expect_reject(with_entry(f.bytes, 3, [](PackEntry &e) { e.source_tensor = 1u << 30; }), Status::format, "string offset");
  expect_reject(with_entry(f.bytes, 3, [](PackEntry &e) { e.source_layout = 2; }), Status::format, "source layout");
  expect_reject(with_entry(f.bytes, 3, [](PackEntry &e) { e.payload_xxh3 ^= 1; }), Status::corrupt, "payload hash mismatch");
}

TEST_CASE("payload bytes: structure passes, full validation names the object", "[pack][corrupt][payload]") {
  Fixture f;
  auto pack = parse(f.bytes, ValidationLevel::structure);
  std::mt19937_64 rng(3);
  for (uint32_t l = 0; l < pack->num_layers(); ++l) {
    for (uint32_t x = 0; x < pack->num_experts(); ++x) {
      for (uint32_t r = 0; r < 3; ++r) {
        const auto &e = pack->entry(l, x, static_cast<format::Role>(r));
        std::vector<uint8_t> b = f.bytes;
        b[e.file_offset + rng() % e.nbytes] ^= 0x04;
        CHECK_NOTHROW(parse(b, ValidationLevel::structure));
        expect_reject(b, Status::corrupt,
                      fmt::format("payload hash mismatch: layer {} expert {} {}", l, x, format::role_name(e.role)));
      }
    }
  }
  // The sample always includes the first and the last object.
  std::vector<uint8_t> b = f.bytes;
  b[pack->entry(0, 0, format::Role::gate).file_offset] ^= 1;
  expect_reject(b, Status::corrupt, "payload hash mismatch", ValidationLevel::sampled);
  b = f.bytes;
  b[pack->entry(1, 3, format::Role::down).file_offset + 5] ^= 1;
  expect_reject(b, Status::corrupt, "payload hash mismatch", ValidationLevel::sampled);
  // Through the file: validate --full.
  b = f.bytes;
  b[pack->entry(1, 2, format::Role::up).file_offset + 1] ^= 0xff;
  test::write_file(f.pack_path, b);
  try {
    pack::validate_pack(f.pack_path, {true, true, true});
    FAIL("validate --full accepted a corrupt payload");
  } catch (const Error &e) {
    CHECK(e.status() == Status::corrupt);
    CHECK(std::string(e.what()).find("layer 1 expert 2 up") != std::string::npos);
  }
}

TEST_CASE("truncation at several points", "[pack][corrupt][truncate]") {
  Fixture f;
  const PackHeader h = f.header();
  const std::vector<uint64_t> cuts = {0, 1, 7, 8, 12, 23, 24, 100, 255, 256, h.index_offset + 100, h.strings_offset,
                                      h.data_start, h.data_start + 1, h.data_start + h.object_stride,
                                      h.file_size - 4096, h.file_size - 1};
  for (uint64_t cut : cuts) {
    std::vector<uint8_t> b(f.bytes.begin(), f.bytes.begin() + static_cast<std::ptrdiff_t>(cut));
    INFO("cut at " << cut);
    expect_reject(b, Status::format, "truncated file", ValidationLevel::structure);
  }
  std::vector<uint8_t> longer = f.bytes;
  longer.push_back(0);
  expect_reject(longer, Status::format, "trailing bytes");
}

TEST_CASE("random multi-byte corruption never crashes", "[pack][corrupt][random]") {
  Fixture f;
  const PackHeader h = f.header();
  std::mt19937_64 rng(99);
  int rejected = 0;
  for (int i = 0; i < 2000; ++i) {
    std::vector<uint8_t> b = f.bytes;
    const int n = 1 + static_cast<int>(rng() % 6);
    for (int k = 0; k < n; ++k) b[rng() % (h.strings_offset + h.strings_size)] ^= static_cast<uint8_t>(1 + rng() % 255);
    try {
      parse(b, ValidationLevel::full);
    } catch (const Error &) {
      ++rejected;
    }
  }
  CHECK(rejected == 2000);  // every byte of header, index and strings is covered by a checksum
}

TEST_CASE("manifest and sources: missing, changed, or belonging to another pack", "[pack][corrupt][manifest]") {
  Fixture f;
  CHECK_NOTHROW(pack::validate_pack(f.pack_path, {true, true, true}));
  SECTION("source changed") {
    auto b = test::read_file(f.src);
    b.back() ^= 1;
    test::write_file(f.src, b);
    const auto t = std::filesystem::last_write_time(f.src);
    std::filesystem::last_write_time(f.src, t + std::chrono::seconds(5));
    try {
      pack::validate_pack(f.pack_path);
      FAIL("accepted");
    } catch (const Error &e) {
      CHECK(e.status() == Status::stale);
      CHECK(std::string(e.what()).find("source changed: " + std::filesystem::absolute(f.src).string()) != std::string::npos);
    }
    CHECK_NOTHROW(pack::validate_pack(f.pack_path, {true, false, true}));  // --no-sources
  }
  SECTION("source missing") {
    std::filesystem::remove(f.src);
    try {
      pack::validate_pack(f.pack_path);
      FAIL("accepted");
    } catch (const Error &e) {
      CHECK(e.status() == Status::not_found);
      CHECK(std::string(e.what()).find("source missing") != std::string::npos);
    }
  }
  SECTION("manifest of another pack") {
    testkit::SyntheticSpec spec;
    spec.num_layers = 2;
    spec.num_experts = 4;
    spec.n_embd = 128;
    spec.n_ff = 64;
    spec.seed = 6;  // different bytes
    const auto other = testkit::write_synthetic_gguf(spec, f.dir / "other.gguf")[0];
    pack::build_pack(std::vector<std::string>{other}, f.dir / "other.epk");
    std::filesystem::copy_file(f.dir / "other.epk.json", f.pack_path + ".json",
                               std::filesystem::copy_options::overwrite_existing);
    try {
      pack::validate_pack(f.pack_path);
      FAIL("accepted");
    } catch (const Error &e) {
      CHECK(e.status() == Status::stale);
      CHECK(std::string(e.what()).find("manifest does not match") != std::string::npos);
    }
  }
  SECTION("malformed manifest") {
    test::write_file(f.pack_path + ".json", {'{', '}'});
    try {
      pack::validate_pack(f.pack_path);
      FAIL("accepted");
    } catch (const Error &e) {
      CHECK(e.status() == Status::format);
    }
  }
}
