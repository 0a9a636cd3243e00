// A striped Expert Pack (ep-pack build --stripe: the pack file keeps header, index and strings,
// N part files hold the objects interleaved) built from the DeepSeek-V4 golden: the layout on
// disk, the same payloads as the unstriped pack, the store reading every part, the model's
// logits bit-identical to resident experts (also through ep_model_open on the striped pack);
// a missing or resized part fails at open naming it; a part whose reads refuse O_DIRECT fails
// naming it (DirectMode::direct) or is read buffered (automatic); an EIO on one part fails the
// step naming the part, layer and expert, computes nothing, and the next request works.
#include "support/catch.hpp"

#include "backend/cpu_backend.hpp"
#include "core/error.hpp"
#include "support/deepseek_v4_golden.hpp"
#include "experts/packed_experts.hpp"
#include "format/pack_file.hpp"
#include "io/seam.hpp"
#include "pack/builder.hpp"
#include "store/expert_store.hpp"
#include "store/pack_object_map.hpp"
#include "support/expect_error.hpp"

#include <expertpack/expertpack.h>

#include <xxhash.h>

#include <atomic>
#include <cerrno>
#include <functional>
#include <cstring>
#include <filesystem>
#include <mutex>

using namespace deepseek_v4test;
using ep::experts::PackedExperts;
using ep::experts::PackedExpertsOptions;

namespace {

struct Striped {
  fs::path dir;
  std::string plain, striped;
  std::vector<std::string> parts;
};

const Striped &striped_pack() {
  static const Striped s = [] {
    Striped r;
    r.dir = scratch_dir("stripe");
    const Golden g = load_golden("deepseek_v4_a");
    r.plain = ep::pack::build_pack(std::vector<std::string>{g.gguf}, (r.dir / "plain.epk").string()).pack_path;
    ep::pack::BuildOptions o;
    for (const char *d : {"drive0", "drive1", "drive2"}) {
      fs::create_directories(r.dir / d);
      o.stripe_dirs.push_back((r.dir / d).string());
    }
    const auto built = ep::pack::build_pack(std::vector<std::string>{g.gguf}, (r.dir / "striped.epk").string(), o);
    r.striped = built.pack_path;
    r.parts = built.part_paths;
    return r;
  }();
  static const struct Remove {
    fs::path dir;
    ~Remove() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } remove{s.dir};
  return s;
}

/// Fails the first @p fails attempts to read the first object asked for from part file @p file.
class FailPartOnce final : public ep::io::IoSeam {
 public:
  FailPartOnce(uint32_t file, int fails) : file_(file), fails_left_(fails) {}
  int64_t on_file_read_result(uint32_t file, uint64_t offset, uint64_t, int64_t result) override {
    std::lock_guard lock(mutex_);
    if (file != file_) return result;
    if (!seen_) {
      seen_ = true;
      offset_ = offset;
    }
    if (offset == offset_ && fails_left_ > 0) {
      --fails_left_;
      return -EIO;
    }
    return result;
  }

 private:
  std::mutex mutex_;
  uint32_t file_;
  int fails_left_;
  bool seen_ = false;
  uint64_t offset_ = 0;
};

/// The first @p times reads of part file @p file return EINVAL (what a file system that refuses
/// O_DIRECT reads answers); later ones (after the reader's switch to buffered reads) pass.
class RefuseDirect final : public ep::io::IoSeam {
 public:
  RefuseDirect(uint32_t file, int times) : file_(file), left_(times) {}
  int64_t on_file_read_result(uint32_t file, uint64_t, uint64_t, int64_t result) override {
    if (file != file_) return result;
    return left_.fetch_sub(1) > 0 ? -EINVAL : result;
  }

 private:
  uint32_t file_;
  std::atomic<int> left_;
};

std::unique_ptr<DeepseekV4Model> packed_model(const std::string &source, const std::string &pack, ep::backend::Backend &be,
                                              const PackedExpertsOptions &po, PackedExperts **out = nullptr) {
  ep::model::DeepseekV4LoadOptions lo;
  lo.resident_experts = false;
  auto m = DeepseekV4Model::open(source, be, lo);
  auto experts = std::make_unique<PackedExperts>(pack, m->expert_shapes(), m->config().n_experts_used, po);
  if (out) *out = experts.get();
  m->set_experts(std::move(experts));
  return m;
}

/// The golden's full-pass logits with resident experts on the CPU.
const std::vector<float> &reference_logits() {
  static const std::vector<float> ref = [] {
    ep::backend::CpuBackend cpu;
    const Golden g = load_golden("deepseek_v4_a");
    return run_full(*DeepseekV4Model::open(g.gguf, cpu), g.tokens);
  }();
  return ref;
}

bool bit_identical(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("striped pack: layout, payloads and the store over its parts", "[pack][stripe]") {
  const Striped &s = striped_pack();
  const auto plain = ep::format::PackFile::open(s.plain, ep::format::ValidationLevel::full);
  const auto striped = ep::format::PackFile::open(s.striped, ep::format::ValidationLevel::full);
  REQUIRE(striped->num_parts() == 3);
  REQUIRE(striped->data_files() == s.parts);
  CHECK(plain->num_parts() == 0);
  CHECK(plain->data_files() == std::vector<std::string>{s.plain});
  // The pack file ends at data_start; part k holds objects k, k + 3, ...
  CHECK(fs::file_size(s.striped) == striped->data_start());
  const uint32_t L = striped->num_layers(), E = striped->num_experts();
  const uint64_t objects = static_cast<uint64_t>(L) * E;
  for (uint32_t k = 0; k < 3; ++k) CHECK(fs::file_size(s.parts[k]) == (objects - k + 2) / 3 * striped->object_stride());
  CHECK(std::memcmp(plain->header().model_identity_sha256, striped->header().model_identity_sha256, 32) == 0);
  for (uint32_t l = 0; l < L; ++l)
    for (uint32_t e = 0; e < E; ++e) {
      const uint64_t i = static_cast<uint64_t>(l) * E + e;
      CHECK(striped->object_file(l, e) == i % 3);
      CHECK(striped->object_offset(l, e) == i / 3 * striped->object_stride());
      for (auto role : {ep::format::Role::gate, ep::format::Role::up, ep::format::Role::down}) {
        const auto &a = plain->entry(l, e, role), &b = striped->entry(l, e, role);
        CHECK(a.xxh3 == b.xxh3);
        std::vector<uint8_t> x(a.nbytes), y(b.nbytes);
        plain->data_source(a.file).read(a.file_offset, x.data(), x.size());
        striped->data_source(b.file).read(b.file_offset, y.data(), y.size());
        CHECK(x == y);
      }
    }

  // The store reads every object from its part, checked against the index.
  auto layout = std::make_shared<ep::store::PackObjectMap>(std::shared_ptr<const ep::format::PackFile>(
      ep::format::PackFile::open(s.striped, ep::format::ValidationLevel::structure)));
  for (auto backend : {ep::io::Backend::automatic, ep::io::Backend::pread}) {
    ep::store::StoreOptions o;
    o.pack_path = s.striped;
    o.data_paths = layout->pack().data_files();
    o.objects = layout;
    o.top_k = E;
    o.reader.backend = backend;
    o.cache_bytes = 0;  // all that is free
    ep::store::ExpertStore store(o, std::make_unique<ep::store::HostDevice>());
    std::vector<uint32_t> all(E);
    for (uint32_t e = 0; e < E; ++e) all[e] = e;
    for (uint32_t l = 0; l < L; ++l) {
      auto a = store.acquire(l, all);
      for (uint32_t e = 0; e < E; ++e)
        CHECK(layout->check_object(l, e, static_cast<const std::byte *>(a.pointers[e])).empty());
      store.release(a);
    }
    CHECK(store.stats().pack_reads == objects);
  }
}

TEST_CASE("striped pack: a missing or resized part fails at open naming it", "[pack][stripe]") {
  const Striped &s = striped_pack();
  const fs::path copy = s.dir / "broken";
  fs::remove_all(copy);
  fs::create_directories(copy);
  // Parts are recorded by path: move one away, then give it the wrong size.
  const std::string part = s.parts[1], moved = (copy / "part1.saved").string();
  fs::rename(part, moved);
  auto open = [&] { ep::format::PackFile::open(s.striped); };
  ep::test::expect_error(open, ep::Status::not_found, "part 1 of 3 (" + part + ") cannot be opened");
  fs::copy_file(moved, part);
  fs::resize_file(part, fs::file_size(moved) - 4096);
  ep::test::expect_error(open, ep::Status::format,
                         "part 1 of 3 (" + part + ") has " + std::to_string(fs::file_size(moved) - 4096) + " bytes, expected " +
                             std::to_string(fs::file_size(moved)));
  fs::remove(part);
  fs::rename(moved, part);
  ep::format::PackFile::open(s.striped, ep::format::ValidationLevel::full);
  // Fewer than two directories is refused by the builder.
  ep::pack::BuildOptions one;
  one.stripe_dirs = {(s.dir / "drive0").string()};
  ep::test::expect_error(
      [&] { ep::pack::build_pack(std::vector<std::string>{load_golden("deepseek_v4_a").gguf}, (copy / "x.epk").string(), one); },
      ep::Status::invalid_argument, "striping needs 2..");
}

TEST_CASE("striped pack: the model's logits are the resident experts' bits", "[model][deepseek_v4][stripe]") {
  const Striped &s = striped_pack();
  const Golden g = load_golden("deepseek_v4_a");
  ep::backend::CpuBackend cpu;
  const std::vector<float> &ref = reference_logits();
  for (const bool overlap : {false, true}) {
    PackedExpertsOptions po;
    po.store.overlap_reads = overlap;
    po.store.cache_budget_bytes = PackedExperts::min_cache_bytes(s.striped, 2) * 2;  // deepseek_v4_a: top-2
    auto m = packed_model(g.gguf, s.striped, cpu, po);
    CHECK(bit_identical(run_full(*m, g.tokens), ref));
  }
  // Through the C API: the striped pack opens like any pack (its manifest names the source).
  ep_model_options o;
  ep_model_options_init(&o);
  o.device = EP_DEVICE_CPU;
  o.cache_budget_bytes = PackedExperts::min_cache_bytes(s.striped, 2);
  ep_model *model = nullptr;
  REQUIRE(ep_model_open(&model, s.striped.c_str(), &o) == EP_OK);
  CHECK(std::string(ep_model_pack_path(model)) == s.striped);
  ep_session *session = nullptr;
  REQUIRE(ep_session_open(&session, model) == EP_OK);
  std::vector<float> out(ref.size());
  REQUIRE(ep_score(session, g.tokens.data(), g.tokens.size(), 0, nullptr, out.data()) == EP_OK);
  CHECK(bit_identical(out, ref));
  ep_session_close(session);
  ep_model_close(model);
}

TEST_CASE("striped pack: an EIO on one part fails the step naming part, layer and expert; the next works",
          "[model][deepseek_v4][stripe]") {
  const Striped &s = striped_pack();
  const Golden g = load_golden("deepseek_v4_a");
  ep::backend::CpuBackend cpu;
  const std::vector<float> &ref = reference_logits();
  for (const bool overlap : {false, true}) {
    INFO("overlap " << overlap);
    PackedExpertsOptions po;
    po.store.overlap_reads = overlap;
    po.seam = std::make_shared<FailPartOnce>(2, 3);  // the reader tries 1 + eio_retries (2) times
    PackedExperts *experts = nullptr;
    auto m = packed_model(g.gguf, s.striped, cpu, po, &experts);
    std::vector<float> logits(ref.size(), -1.0f);
    ep::model::DeepseekV4State st = m->new_state();
    try {
      m->forward(g.tokens.data(), static_cast<int64_t>(g.tokens.size()), st, logits.data());
      FAIL("expected EP_ERR_IO");
    } catch (const ep::Error &e) {
      const std::string msg = e.what();
      CHECK(e.status() == ep::Status::io);
      CHECK(msg.find(s.parts[2]) != std::string::npos);
      CHECK(msg.find("layer ") != std::string::npos);
      CHECK(msg.find(" expert ") != std::string::npos);
      CHECK(msg.find("Input/output error") != std::string::npos);
    }
    for (float v : logits) CHECK(v == -1.0f);  // nothing computed reached the caller
    CHECK(experts->stats().io_errors == 3);
    // The next request works and is right.
    CHECK(bit_identical(run_full(*m, g.tokens), ref));
  }
}

TEST_CASE("striped pack: a part refusing O_DIRECT reads is named (direct) or read buffered (automatic)", "[pack][stripe]") {
  const Striped &s = striped_pack();
  auto layout = ep::store::PackObjectMap::open(s.striped);
  std::vector<uint32_t> all(layout->num_experts());
  for (uint32_t e = 0; e < all.size(); ++e) all[e] = e;
  // A store over the parts whose reads of part 1 are refused @p refusals times.
  auto store_with = [&](ep::io::DirectMode mode, int refusals) {
    ep::store::StoreOptions o;
    o.pack_path = s.striped;
    o.data_paths = layout->pack().data_files();
    o.objects = layout;
    o.top_k = layout->num_experts();
    o.reader.direct = mode;
    if (refusals) o.reader.seam = std::make_shared<RefuseDirect>(1, refusals);
    return std::make_unique<ep::store::ExpertStore>(o, std::make_unique<ep::store::HostDevice>());
  };
  if (!store_with(ep::io::DirectMode::automatic, 0)->reader().direct()) {
    WARN("this file system has no O_DIRECT at all: nothing to check");
    return;
  }
  auto direct = store_with(ep::io::DirectMode::direct, 1 << 30);
  ep::test::expect_error([&] { direct->acquire(0, all); }, ep::Status::io, s.parts[1] + ": read of ");
  // automatic: the EINVAL switches part 1 to buffered reads, with a warning; the bytes are right.
  auto automatic = store_with(ep::io::DirectMode::automatic, 1);
  const uint64_t fallbacks = automatic->stats().fallback_count;
  auto a = automatic->acquire(0, all);
  for (uint32_t e = 0; e < all.size(); ++e) CHECK(layout->check_object(0, e, static_cast<const std::byte *>(a.pointers[e])).empty());
  automatic->release(a);
  CHECK(automatic->stats().fallback_count == fallbacks + 1);
  CHECK_FALSE(automatic->reader().direct());
}
