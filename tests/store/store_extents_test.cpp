// Objects made of several extents (what a source index gives the store: each role a slice of a
// source file) on the host-memory device: extents at unaligned offsets and sizes, in two files,
// the first at offset 0 of its file and the last ending at the end of its (unaligned) file, read
// as the 4096-aligned ranges around them and put together at their offsets in the slot; with a
// small cache (evictions), a host tier (demotions and promotions), staged acquires, prefetch and
// both reader backends. Wrong bytes are EP_ERR_CORRUPT and never reach a slot; a file shorter
// than an extent is refused at construction naming it.
#include "support/catch.hpp"

#include "core/error.hpp"
#include "io/file.hpp"
#include "store/expert_store.hpp"
#include "support/expect_error.hpp"
#include "support/temp_dir.hpp"

#include <xxhash.h>

#include <cstring>
#include <fstream>
#include <random>

using namespace ep;
using namespace ep::store;

namespace {

constexpr uint32_t kLayers = 3, kExperts = 6, kRoles = 3;

/// Two files of random bytes and, per object, three extents: role r of object o at a place of
/// its own, unaligned, alternating between the files.
class ExtentMap final : public ObjectMap {
 public:
  explicit ExtentMap(const ep::test::TempDir &dir) {
    std::mt19937_64 rng(1234);
    paths_ = {dir / "a.bin", dir / "b.bin"};
    std::vector<uint64_t> at = {0, 0};  // the next free byte of each file
    for (uint32_t o = 0; o < kLayers * kExperts; ++o) {
      uint64_t in_object = 0;
      for (uint32_t r = 0; r < kRoles; ++r) {
        ObjectExtent x;
        x.file = (o + r) % 2;
        // The first extent starts at offset 0 of file 0; the others after a gap of 0..5000 bytes.
        x.offset = at[x.file] + (o == 0 && r == 0 ? 0 : rng() % 5000);
        x.bytes = 1000 + rng() % 9000;
        x.offset_in_object = in_object;
        in_object = (x.offset_in_object + x.bytes + 255) / 256 * 256;
        at[x.file] = x.offset + x.bytes;
        extents_.push_back(x);
      }
      object_bytes_.push_back(extents_.back().offset_in_object + extents_.back().bytes);
    }
    // The last extent of each file ends at the file's end, which is not 4096-aligned.
    for (uint32_t f = 0; f < 2; ++f) {
      REQUIRE(at[f] % io::kDirectAlignment != 0);
      std::vector<char> bytes(at[f]);
      for (char &c : bytes) c = static_cast<char>(rng());
      std::ofstream(paths_[f], std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      files_.push_back(std::move(bytes));
    }
    for (size_t i = 0; i < extents_.size(); ++i) hashes_.push_back(XXH3_64bits(source(extents_[i]), extents_[i].bytes));
  }
  uint32_t num_layers() const override { return kLayers; }
  uint32_t num_experts() const override { return kExperts; }
  uint64_t object_offset(uint32_t l, uint32_t e) const override { return extent(l, e, 0).offset; }
  uint32_t object_file(uint32_t l, uint32_t e) const override { return extent(l, e, 0).file; }
  uint64_t object_bytes(uint32_t l, uint32_t e) const override { return object_bytes_[l * kExperts + e]; }
  std::vector<ObjectExtent> object_extents(uint32_t l, uint32_t e) const override {
    return {extent(l, e, 0), extent(l, e, 1), extent(l, e, 2)};
  }
  /// Each role against its hash, at its offset in the assembled object (the default
  /// check_extents() puts the object together first).
  std::string check_object(uint32_t l, uint32_t e, const std::byte *data) const override {
    for (uint32_t r = 0; r < kRoles; ++r) {
      const ObjectExtent &x = extent(l, e, r);
      if (XXH3_64bits(data + x.offset_in_object, x.bytes) != hashes_[(l * kExperts + e) * kRoles + r])
        return "role " + std::to_string(r) + " hash mismatch";
    }
    return {};
  }

  const ObjectExtent &extent(uint32_t l, uint32_t e, uint32_t r) const { return extents_[(l * kExperts + e) * kRoles + r]; }
  const char *source(const ObjectExtent &x) const { return files_[x.file].data() + x.offset; }
  const std::vector<std::string> &paths() const { return paths_; }
  /// Flips one byte of a file on disk (the map's hashes keep the old bytes).
  void flip(const ObjectExtent &x, uint64_t at) const {
    std::fstream f(paths_[x.file], std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(static_cast<std::streamoff>(x.offset + at));
    const char c = static_cast<char>(files_[x.file][x.offset + at] ^ 0x40);
    f.write(&c, 1);
  }

 private:
  std::vector<std::string> paths_;
  std::vector<std::vector<char>> files_;
  std::vector<ObjectExtent> extents_;
  std::vector<uint64_t> object_bytes_, hashes_;
};

StoreOptions options(const std::shared_ptr<ExtentMap> &map, uint32_t slots, uint32_t host_slots, io::Backend backend) {
  StoreOptions o;
  o.pack_path = map->paths()[0];
  o.data_paths = map->paths();
  o.objects = map;
  o.top_k = 3;
  const uint64_t slot = io::align_up(map->max_object_bytes(), io::kDirectAlignment);
  o.cache_bytes = slots * slot;
  o.host_cache_bytes = host_slots * slot;
  o.staging_slots = 2;
  o.reader.backend = backend;
  o.reader.queue_depth = 4;
  o.reader.pread_threads = 2;
  return o;
}

/// Every role of the expert in @p slot_data is its source bytes.
bool right_roles(const ExtentMap &map, const void *slot_data, uint32_t l, uint32_t e) {
  for (uint32_t r = 0; r < kRoles; ++r) {
    const ObjectExtent &x = map.extent(l, e, r);
    if (std::memcmp(static_cast<const std::byte *>(slot_data) + x.offset_in_object, map.source(x), x.bytes) != 0) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("store: multi-extent objects at unaligned offsets are assembled in their slots", "[store][extents]") {
  ep::test::TempDir dir;
  auto map = std::make_shared<ExtentMap>(dir);
  // The map really exercises the edges: an extent at offset 0, one ending at each file's end.
  bool at_start = false, at_end[2] = {false, false};
  for (uint32_t l = 0; l < kLayers; ++l)
    for (uint32_t e = 0; e < kExperts; ++e)
      for (uint32_t r = 0; r < kRoles; ++r) {
        const ObjectExtent &x = map->extent(l, e, r);
        at_start = at_start || x.offset == 0;
        if (x.offset + x.bytes == std::filesystem::file_size(map->paths()[x.file])) at_end[x.file] = true;
      }
  REQUIRE(at_start);
  REQUIRE(at_end[0]);
  REQUIRE(at_end[1]);

  for (const io::Backend backend : {io::Backend::automatic, io::Backend::pread}) {
    for (const uint32_t host_slots : {0u, 4u}) {
      INFO("backend " << (backend == io::Backend::pread ? "pread" : "auto") << ", host slots " << host_slots);
      ExpertStore store(options(map, 4, host_slots, backend), std::make_unique<HostDevice>());
      std::mt19937 rng(7);
      uint64_t reads = 0;
      for (int step = 0; step < 60; ++step) {
        const uint32_t l = step % kLayers;
        std::vector<uint32_t> ids = {static_cast<uint32_t>(rng() % kExperts), static_cast<uint32_t>(rng() % kExperts),
                                     static_cast<uint32_t>(rng() % 2)};
        const bool staged = step % 3 == 1;
        Acquisition a = store.acquire(l, ids, {}, staged);
        while (a.pending > 0) store.wait_ready(a);
        for (size_t i = 0; i < ids.size(); ++i) CHECK(right_roles(*map, a.pointers[i], l, ids[i]));
        reads += a.misses - a.host_hits;
        store.release(a);
        store.hint((l + 1) % kLayers, std::vector<uint32_t>{static_cast<uint32_t>(rng() % kExperts)});
      }
      const StoreStats s = store.stats();
      CHECK(s.cache_evictions > 0);
      if (host_slots) CHECK(s.host_hits > 0);
      // One read per extent of every object read from the files (demand and prefetch).
      CHECK(s.pack_reads % kRoles == 0);
      CHECK(s.pack_reads >= reads * kRoles);
      for (const ExpertStore::Resident &r : store.resident()) {
        std::vector<std::byte> bytes(map->object_bytes(r.layer, r.expert));
        store.read_slot(r.slot, bytes.data(), bytes.size());
        CHECK(right_roles(*map, bytes.data(), r.layer, r.expert));
      }
      for (const ExpertStore::Resident &r : store.host_resident()) {
        std::vector<std::byte> bytes(map->object_bytes(r.layer, r.expert));
        store.read_host_slot(r.slot, bytes.data(), bytes.size());
        CHECK(right_roles(*map, bytes.data(), r.layer, r.expert));
      }
    }
  }
}

TEST_CASE("store: a wrong byte in one extent is EP_ERR_CORRUPT and never reaches the slot", "[store][extents]") {
  ep::test::TempDir dir;
  auto map = std::make_shared<ExtentMap>(dir);
  // The last byte of the last extent of file 1 (at the file's end) and a middle one elsewhere.
  const ObjectExtent last = map->extent(kLayers - 1, kExperts - 1, 2);
  map->flip(last, last.bytes - 1);
  map->flip(map->extent(1, 2, 1), 17);
  ExpertStore store(options(map, 4, 0, io::Backend::automatic), std::make_unique<HostDevice>());
  ep::test::expect_error([&] { store.acquire(1, std::vector<uint32_t>{2}); }, Status::corrupt, "layer 1 expert 2");
  ep::test::expect_error([&] { store.acquire(kLayers - 1, std::vector<uint32_t>{kExperts - 1}); }, Status::corrupt,
                         "role 2 hash mismatch");
  CHECK(store.resident().empty());
  // The other experts still load.
  Acquisition a = store.acquire(1, std::vector<uint32_t>{0, 3});
  CHECK(right_roles(*map, a.pointers[0], 1, 0));
  CHECK(right_roles(*map, a.pointers[1], 1, 3));
  store.release(a);
}

TEST_CASE("store: a file shorter than an extent is refused naming it", "[store][extents]") {
  ep::test::TempDir dir;
  auto map = std::make_shared<ExtentMap>(dir);
  std::filesystem::resize_file(map->paths()[1], std::filesystem::file_size(map->paths()[1]) - 1);
  ep::test::expect_error([&] { ExpertStore(options(map, 4, 0, io::Backend::automatic), std::make_unique<HostDevice>()); },
                         Status::format, map->paths()[1] + ": layer ");
}
