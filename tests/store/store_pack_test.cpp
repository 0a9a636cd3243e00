// The store over a real Expert Pack (built from a synthetic DeepSeek-V4-shaped GGUF): every
// role's payload inside each acquired slot matches the pack index's XXH3.
#include "support/catch.hpp"

#include "format/pack_file.hpp"
#include "pack/builder.hpp"
#include "store/expert_store.hpp"
#include "store/pack_object_map.hpp"
#include "testkit/checkpoint.hpp"

#include <xxhash.h>

#include <filesystem>
#include <random>

using namespace ep;

TEST_CASE("ExpertStore reads a real Expert Pack through PackObjectMap", "[store][pack]") {
  const auto dir = std::filesystem::current_path() / "store_pack_test.dir";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  testkit::SyntheticSpec spec;
  spec.arch = "deepseek4";
  spec.num_layers = 3;
  spec.num_experts = 8;
  spec.top_k = 2;
  spec.n_embd = 256;
  spec.n_ff = 128;
  spec.seed = 77;
  const auto sources = testkit::write_synthetic_gguf(spec, (dir / "m.gguf").string());
  const auto built = pack::build_pack(sources, (dir / "m.epk").string());

  auto layout = store::PackObjectMap::open(built.pack_path);
  REQUIRE(layout->num_experts() == 8);
  const uint32_t layers = layout->num_layers();
  REQUIRE(layers >= 1);
  store::StoreOptions o;
  o.pack_path = built.pack_path;
  o.objects = layout;
  o.top_k = 2;
  o.tokens_per_acquire = 2;
  o.cache_bytes = 5 * io::align_up(layout->max_object_bytes(), 4096);
  store::ExpertStore st(o, std::make_unique<store::HostDevice>());
  std::mt19937 rng(1);
  const auto &pack = layout->pack();
  for (int i = 0; i < 60; ++i) {
    const uint32_t layer = rng() % layers;
    std::vector<uint32_t> ids{uint32_t(rng() % 8), uint32_t(rng() % 8), uint32_t(rng() % 8)};
    auto a = st.acquire(layer, ids);
    for (std::size_t k = 0; k < ids.size(); ++k) {
      for (auto role : {format::Role::gate, format::Role::up, format::Role::down}) {
        const auto &e = pack.entry(layer, ids[k], role);
        const auto *p = static_cast<const std::byte *>(a.pointers[k]) + e.offset_in_object;
        CHECK(XXH3_64bits(p, e.nbytes) == e.xxh3);
      }
    }
    st.release(a);
  }
  const auto s = st.stats();
  CHECK(s.cache_hits + s.cache_misses > 0);
  CHECK(s.io_errors == 0);
  std::filesystem::remove_all(dir);
}
