// The corruption matrix at the model level: a synthetic DeepSeek-V4 model, its Expert Pack and
// manifest, damaged one way at a time, opened through ep_model_open() (the pack given
// explicitly: never rebuilt). Every case must be refused at open, or caught by
// `validate --full` (pack::validate_pack) and then by the store's per-read hash check when a
// damaged expert is read — and none may crash or produce output that differs from the
// undamaged model's. docs/reliability.md lists the cases and where each is caught.
#include "rel_support.hpp"

#include "core/error.hpp"
#include "format/hash.hpp"
#include "format/pack_file.hpp"
#include "format/pack_format.hpp"
#include "pack/builder.hpp"
#include "pack/validate.hpp"

#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <functional>
#include <random>

using namespace ep;
namespace fs = std::filesystem;

namespace {

const std::vector<int32_t> kSeq = {1, 9, 27, 81, 3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26,
                                   43, 38, 32, 79, 50, 28, 84, 19, 71, 69, 39, 93, 75, 10, 58, 20};

struct Matrix {
  test::TempDir dir;
  const std::string unused = dir / "unused", packs = dir / "packs";
  std::string gguf, pack, manifest;
  std::vector<uint8_t> bytes;
  std::string manifest_text;
  std::vector<float> want;  // logits of kSeq on the undamaged model
  uint32_t vocab = 0;
  int opened = 0, refused = 0;

  Matrix() {
    gguf = rel::write_small_model(dir / "m.gguf", 51);
    pack = dir / "m.epk";
    manifest = pack + ".json";
    pack::build_pack(std::vector<std::string>{gguf}, pack);
    bytes = test::read_file(pack);
    const auto m = test::read_file(manifest);
    manifest_text.assign(m.begin(), m.end());
    rel::ModelHandle h;
    const ep_model_options o = rel::options_in(unused, 0, 0);
    REQUIRE(ep_model_open(&h.model, pack.c_str(), &o) == EP_OK);
    ep_model_properties p;
    ep_model_properties_init(&p);
    REQUIRE(ep_model_info(&p, h.model) == EP_OK);
    vocab = p.vocab_size;
    REQUIRE(rel::score(h.model, kSeq, vocab, want) == EP_OK);
  }
  format::PackHeader header() const {
    format::PackHeader h;
    std::memcpy(&h, bytes.data(), sizeof h);
    return h;
  }
  void restore() {
    test::write_file(pack, bytes);
    test::write_file(manifest, std::vector<uint8_t>(manifest_text.begin(), manifest_text.end()));
  }
  /// Opens the damaged pack: must fail with a status in @p allowed (any error when empty) and
  /// a one-line message, and leave no model.
  void expect_refused(const std::string &what, std::initializer_list<ep_status> allowed = {}) {
    INFO(what);
    ep_model *m = reinterpret_cast<ep_model *>(1);
    const ep_model_options o = rel::options_in(unused, 0, 0);
    const ep_status st = ep_model_open(&m, pack.c_str(), &o);
    const std::string msg = ep_last_error();
    INFO(ep_status_str(st) << ": " << msg);
    CHECK(st != EP_OK);
    CHECK(m == nullptr);
    if (st == EP_OK) ep_model_close(m);
    if (allowed.size()) CHECK(std::find(allowed.begin(), allowed.end(), st) != allowed.end());
    CHECK_FALSE(msg.empty());
    CHECK(msg.find('\n') == std::string::npos);
    ++refused;
  }
  /// Opens the damaged pack if it can: the model must then score kSeq exactly as the undamaged
  /// one or fail with EP_ERR_CORRUPT. Returns whether it opened.
  bool open_and_score_or_refuse(const std::string &what, int &caught_at_read) {
    INFO(what);
    rel::ModelHandle h;
    const ep_model_options o = rel::options_in(unused, 0, 0);
    if (ep_model_open(&h.model, pack.c_str(), &o) != EP_OK) {
      INFO(ep_last_error());
      CHECK(h.model == nullptr);
      ++refused;
      return false;
    }
    ++opened;
    std::vector<float> got;
    const ep_status st = rel::score(h.model, kSeq, vocab, got);
    if (st == EP_OK) {
      CHECK(rel::same_bits(got, want));  // the damaged expert was not used
    } else {
      INFO(ep_last_error());
      CHECK(st == EP_ERR_CORRUPT);
      ++caught_at_read;
    }
    return true;
  }
  /// validate --full must reject the damaged pack with @p status.
  void expect_validate_fails(Status status, const std::string &needle) {
    try {
      pack::validate_pack(pack, {true, true, true});
      FAIL("validate --full accepted it");
    } catch (const Error &e) {
      INFO(e.what());
      CHECK(e.status() == status);
      CHECK(std::string(e.what()).find(needle) != std::string::npos);
    }
  }
};

// Rewrites the header checksum after an edit (a "valid-looking" header with a wrong field).
std::vector<uint8_t> with_header(std::vector<uint8_t> b, const std::function<void(format::PackHeader &)> &edit) {
  format::PackHeader h;
  std::memcpy(&h, b.data(), sizeof h);
  edit(h);
  h.header_xxh3 = format::xxh3_64(&h, format::kPackHeaderHashedBytes);
  std::memcpy(b.data(), &h, sizeof h);
  return b;
}

}  // namespace

TEST_CASE("corruption matrix through ep_model_open: header, index, truncation", "[reliability][corrupt]") {
  Matrix x;
  const format::PackHeader h = x.header();
  // Every header byte, flipped.
  for (size_t off = 0; off < sizeof(format::PackHeader); ++off) {
    std::vector<uint8_t> b = x.bytes;
    b[off] ^= 0x41;
    test::write_file(x.pack, b);
    x.expect_refused("header byte " + std::to_string(off));
  }
  // Header fields edited with a valid checksum.
  const std::vector<std::pair<std::string, std::function<void(format::PackHeader &)>>> edits = {
      {"num_layers + 1", [](format::PackHeader &e) { e.num_layers += 1; }},
      {"num_layers - 1", [](format::PackHeader &e) { e.num_layers -= 1; }},
      {"num_experts * 2", [](format::PackHeader &e) { e.num_experts *= 2; }},
      {"object_stride + 4096", [](format::PackHeader &e) { e.object_stride += 4096; }},
      {"data_start + 4096", [](format::PackHeader &e) { e.data_start += 4096; }},
      {"file_size - 4096", [](format::PackHeader &e) { e.file_size -= 4096; }},
      {"index_offset + 128", [](format::PackHeader &e) { e.index_offset += 128; }},
      {"flags 1", [](format::PackHeader &e) { e.flags = 1; }},
      {"model identity digest", [](format::PackHeader &e) { e.model_identity_sha256[3] ^= 1; }},
      {"source files digest", [](format::PackHeader &e) { e.source_files_sha256[0] ^= 1; }},
      {"config digest", [](format::PackHeader &e) { e.config_sha256[31] ^= 1; }},
  };
  for (const auto &[name, edit] : edits) {
    test::write_file(x.pack, with_header(x.bytes, edit));
    x.expect_refused("header field " + name);
  }
  // Index entries and the string table: a byte every 37 bytes (the digest covers all of them).
  for (uint64_t off = h.index_offset; off < h.strings_offset + h.strings_size; off += 37) {
    std::vector<uint8_t> b = x.bytes;
    b[off] ^= 0x08;
    test::write_file(x.pack, b);
    x.expect_refused("index byte " + std::to_string(off), {EP_ERR_CORRUPT});
  }
  // Truncation at many points, and one byte too many.
  std::vector<uint64_t> cuts = {0, 1, 8, 100, 255, 256, h.index_offset + 1, h.strings_offset, h.data_start,
                                h.data_start + 1, h.file_size - 1};
  std::mt19937_64 rng(7);
  for (int i = 0; i < 24; ++i) cuts.push_back(rng() % h.file_size);
  for (uint64_t cut : cuts) {
    test::write_file(x.pack, std::vector<uint8_t>(x.bytes.begin(), x.bytes.begin() + static_cast<std::ptrdiff_t>(cut)));
    x.expect_refused("truncated at " + std::to_string(cut));
  }
  std::vector<uint8_t> longer = x.bytes;
  longer.resize(longer.size() + 4096);
  test::write_file(x.pack, longer);
  x.expect_refused("4096 bytes appended", {EP_ERR_FORMAT});
  x.restore();
  rel::ModelHandle ok;
  const ep_model_options o = rel::options_in(x.unused, 0, 0);
  CHECK(ep_model_open(&ok.model, x.pack.c_str(), &o) == EP_OK);  // the restored pack works again
}

TEST_CASE("corruption matrix: the manifest", "[reliability][corrupt][manifest]") {
  Matrix x;
  auto with_manifest = [&](const std::function<void(nlohmann::json &)> &edit) {
    nlohmann::json j = nlohmann::json::parse(x.manifest_text);
    edit(j);
    const std::string t = j.dump(2);
    test::write_file(x.manifest, std::vector<uint8_t>(t.begin(), t.end()));
  };
  fs::remove(x.manifest);
  x.expect_refused("manifest missing", {EP_ERR_NOT_FOUND});
  for (size_t cut : {size_t{0}, size_t{1}, x.manifest_text.size() / 3, x.manifest_text.size() - 2}) {
    test::write_file(x.manifest, std::vector<uint8_t>(x.manifest_text.begin(), x.manifest_text.begin() + cut));
    x.expect_refused("manifest truncated at " + std::to_string(cut), {EP_ERR_FORMAT});
  }
  with_manifest([](nlohmann::json &j) { j["format"] = "something-else"; });
  x.expect_refused("manifest format", {EP_ERR_FORMAT});
  with_manifest([](nlohmann::json &j) { j["version"] = 2; });
  x.expect_refused("manifest version", {EP_ERR_VERSION});
  with_manifest([](nlohmann::json &j) { j["pack"]["size"] = j["pack"]["size"].get<uint64_t>() + 4096; });
  x.expect_refused("manifest pack size", {EP_ERR_STALE});
  for (const char *k : {"source_files_sha256", "model_identity_sha256", "config_sha256"}) {
    with_manifest([&](nlohmann::json &j) {
      std::string d = j["identity"][k];
      d[0] = d[0] == '0' ? '1' : '0';
      j["identity"][k] = d;
    });
    x.expect_refused(std::string("manifest ") + k, {EP_ERR_STALE});
  }
  with_manifest([](nlohmann::json &j) { j["config"]["top_k"] = 3; });
  x.expect_refused("manifest config edited", {EP_ERR_CORRUPT});
  with_manifest([](nlohmann::json &j) { j["sources"][0]["path"] = "/nonexistent/m.gguf"; });
  x.expect_refused("manifest source path", {EP_ERR_NOT_FOUND});
  with_manifest([](nlohmann::json &j) { j["sources"][0]["size"] = j["sources"][0]["size"].get<uint64_t>() + 1; });
  x.expect_refused("manifest source size", {EP_ERR_STALE});
  with_manifest([](nlohmann::json &j) { j["sources"] = nlohmann::json::array(); });
  x.expect_refused("manifest without sources", {EP_ERR_FORMAT});
  // Random byte damage to the manifest text: refused, or (a change JSON does not see, such as
  // whitespace or the informational "build" block) opened and exact.
  std::mt19937_64 rng(11);
  int caught_at_read = 0;
  for (int i = 0; i < 40; ++i) {
    std::string t = x.manifest_text;
    t[rng() % t.size()] ^= static_cast<char>(1 + rng() % 127);
    test::write_file(x.manifest, std::vector<uint8_t>(t.begin(), t.end()));
    x.open_and_score_or_refuse("manifest byte damage " + std::to_string(i), caught_at_read);
  }
  CHECK(caught_at_read == 0);
  CHECK(x.refused > 0);
}

TEST_CASE("corruption matrix: payload bytes of every expert", "[reliability][corrupt][payload]") {
  Matrix x;
  auto pf = format::PackFile::open(x.pack, format::ValidationLevel::structure);
  std::mt19937_64 rng(5);
  int caught_at_read = 0, checked = 0;
  for (uint32_t l = 0; l < pf->num_layers(); ++l) {
    for (uint32_t e = 0; e < pf->num_experts(); ++e) {
      const auto role = static_cast<format::Role>((l + e) % 3);
      const format::RoleEntry &re = pf->entry(l, e, role);
      std::vector<uint8_t> b = x.bytes;
      b[re.file_offset + rng() % re.nbytes] ^= 0x10;
      test::write_file(x.pack, b);
      const std::string what = "layer " + std::to_string(l) + " expert " + std::to_string(e);
      x.open_and_score_or_refuse(what, caught_at_read);
      x.expect_validate_fails(Status::corrupt, "payload hash mismatch: " + what);
      ++checked;
    }
  }
  WARN(checked << " payload cases: " << x.refused << " refused at open (sampled hashes), " << caught_at_read
               << " refused when read (EP_ERR_CORRUPT), the rest not routed by the scored sequence (output exact)");
  CHECK(x.refused + x.opened == checked);
  CHECK(caught_at_read > 0);
}

TEST_CASE("corruption matrix: the source swapped or touched after packing", "[reliability][corrupt][source]") {
  Matrix x;
  const auto mtime = fs::last_write_time(x.gguf);
  const std::string other = rel::write_small_model(x.dir / "other.gguf", 52);  // same shapes, other weights
  REQUIRE(fs::file_size(other) == fs::file_size(x.gguf));

  fs::copy_file(other, x.gguf, fs::copy_options::overwrite_existing);
  x.expect_refused("source swapped (size equal, mtime new)", {EP_ERR_STALE});
  x.expect_validate_fails(Status::stale, "source changed");

  // Swapped with the old mtime put back (cp -p, rsync -t): the fingerprint (size, mtime) cannot
  // see it; validate --full re-hashes the sources' expert slices and can.
  fs::last_write_time(x.gguf, mtime);
  x.expect_validate_fails(Status::stale, "source slice changed");

  fs::remove(x.gguf);
  x.expect_refused("source deleted", {EP_ERR_NOT_FOUND});
  x.expect_validate_fails(Status::not_found, "source missing");

  // Opened through the source with building allowed, the derived pack is rebuilt and exact.
  rel::write_small_model(x.gguf, 51);
  rel::ModelHandle h;
  ep_model_options o = rel::options_in(x.packs, 0, 1);
  REQUIRE(ep_model_open(&h.model, x.gguf.c_str(), &o) == EP_OK);
  std::vector<float> got;
  REQUIRE(rel::score(h.model, kSeq, x.vocab, got) == EP_OK);
  CHECK(rel::same_bits(got, x.want));
}

TEST_CASE("a derived pack damaged in the pack directory: refused without building, rebuilt with it", "[reliability][corrupt]") {
  Matrix x;
  const std::string &packs = x.packs;
  std::string derived;
  {
    rel::ModelHandle h;
    const ep_model_options o = rel::options_in(packs, 0, 1);
    REQUIRE(ep_model_open(&h.model, x.gguf.c_str(), &o) == EP_OK);
    derived = ep_model_pack_path(h.model);
  }
  const std::vector<uint8_t> good = test::read_file(derived);
  for (int variant = 0; variant < 3; ++variant) {
    std::vector<uint8_t> b = good;
    if (variant == 0) b[20] ^= 1;                     // header
    if (variant == 1) b.resize(b.size() / 2);         // truncated
    if (variant == 2) b[x.header().index_offset] ^= 1;  // index
    test::write_file(derived, b);
    INFO("variant " << variant);
    ep_model *m = nullptr;
    ep_model_options o = rel::options_in(packs, 0, 0);
    CHECK(ep_model_open(&m, x.gguf.c_str(), &o) != EP_OK);
    CHECK(std::string(ep_last_error()).find("pack building is disabled") != std::string::npos);
    CHECK(m == nullptr);
    rel::ModelHandle h;
    o = rel::options_in(packs, 0, 1);
    REQUIRE(ep_model_open(&h.model, x.gguf.c_str(), &o) == EP_OK);
    std::vector<float> got;
    REQUIRE(rel::score(h.model, kSeq, x.vocab, got) == EP_OK);
    CHECK(rel::same_bits(got, x.want));
    CHECK(test::read_file(derived) == good);  // the same bytes again (deterministic build)
  }
}
