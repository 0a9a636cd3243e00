// A GGUF under an Ollama blob name (`sha256-<64 hex>`, no extension) opens everywhere a .gguf
// does: the pack builder, the model open through the C API (CPU), and the scores equal the
// .gguf's bit for bit. A file that is no model format is refused by the C API naming it and its
// first bytes.
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

#include "format/file_format.hpp"
#include "pack/builder.hpp"

#include <expertpack/expertpack.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

const std::string kGolden = std::string(EP_TEST_DATA_DIR) + "/deepseek_v4/deepseek_v4_a.gguf";
const std::vector<int32_t> kTokens = {3, 14, 15, 92, 65, 35};

/// All logits of kTokens, teacher-forced, from the model at @p path (its pack built in @p pack_dir).
std::vector<float> score(const std::string &path, const std::string &pack_dir) {
  ep_model_options o;
  ep_model_options_init(&o);
  o.device = EP_DEVICE_CPU;
  o.pack_dir = pack_dir.c_str();
  ep_model *m = nullptr;
  INFO(path);
  REQUIRE(ep_model_open(&m, path.c_str(), &o) == EP_OK);
  ep_model_properties p;
  ep_model_properties_init(&p);
  REQUIRE(ep_model_info(&p, m) == EP_OK);
  CHECK(std::string(p.architecture) == "deepseek4");
  ep_session *s = nullptr;
  REQUIRE(ep_session_open(&s, m) == EP_OK);
  std::vector<float> logits(kTokens.size() * p.vocab_size);
  REQUIRE(ep_score(s, kTokens.data(), kTokens.size(), 0, nullptr, logits.data()) == EP_OK);
  ep_session_close(s);
  ep_model_close(m);
  return logits;
}

}  // namespace

TEST_CASE("ollama blob: a GGUF without an extension builds a pack and opens", "[model][format]") {
  ep::test::TempDir dir;
  const std::string blob = dir / ("sha256-" + std::string("4f1c9e2a7b3d5e6f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7"));
  fs::copy_file(kGolden, blob);
  REQUIRE(ep::format::detect_file_format(blob) == ep::format::FileFormat::gguf);

  const ep::pack::BuildResult b = ep::pack::build_pack(std::vector<std::string>{blob}, dir / "blob.epk");
  CHECK(b.num_layers == 4);
  CHECK(b.num_experts == 6);

  const std::vector<float> from_blob = score(blob, dir / "packs");
  const std::vector<float> from_gguf = score(kGolden, dir / "packs");
  REQUIRE(from_blob.size() == from_gguf.size());
  CHECK(std::memcmp(from_blob.data(), from_gguf.data(), from_blob.size() * 4) == 0);
}

TEST_CASE("ollama blob: a file that is no model format is refused with its first bytes", "[model][format]") {
  ep::test::TempDir dir;
  const std::string bad = dir / ("sha256-" + std::string(64, '0'));
  ep::test::write_file(bad, {'P', 'K', 3, 4, 'z', 'i', 'p'});
  ep_model_options o;
  ep_model_options_init(&o);
  o.device = EP_DEVICE_CPU;
  const std::string packs = dir / "packs";
  o.pack_dir = packs.c_str();
  ep_model *m = nullptr;
  CHECK(ep_model_open(&m, bad.c_str(), &o) == EP_ERR_FORMAT);
  CHECK(m == nullptr);
  const std::string msg = ep_last_error();
  INFO(msg);
  CHECK(msg.find(bad) != std::string::npos);
  CHECK(msg.find("50 4b 03 04 7a 69 70 |PK..zip|") != std::string::npos);
  CHECK_FALSE(fs::exists(packs));  // nothing built
}
