// The builder under failure: disk full or an I/O error at any point leaves no file that opens
// as a pack (and keeps a previous pack intact), a second builder is refused while the first
// holds the lock, and a source that changes between planning and copying is refused.
#include "core/error.hpp"
#include "format/pack_file.hpp"
#include "pack/builder.hpp"
#include "support/temp_dir.hpp"
#include "support/catch.hpp"
#include "testkit/checkpoint.hpp"

#include <cerrno>
#include <fcntl.h>
#include <filesystem>
#include <sys/file.h>
#include <unistd.h>

using namespace ep;
using test::TempDir;

namespace {

/// Fails with @p err once @p limit bytes have been written (or at sync when sync_fails).
class FailingOutput final : public format::OutputFile {
 public:
  FailingOutput(std::unique_ptr<format::OutputFile> inner, uint64_t limit, int err, bool sync_fails)
      : inner_(std::move(inner)), limit_(limit), err_(err), sync_fails_(sync_fails) {}
  void write(const void *data, size_t n) override {
    if (inner_->offset() + n > limit_) {
      const uint64_t room = limit_ - inner_->offset();
      if (room) inner_->write(data, static_cast<size_t>(room));  // a short write first, like a real disk
      fail_errno(err_, "write " + inner_->path() + " at offset " + std::to_string(inner_->offset()));
    }
    inner_->write(data, n);
  }
  void write_at(uint64_t offset, const void *data, size_t n) override { inner_->write_at(offset, data, n); }
  void sync() override {
    if (sync_fails_) fail_errno(err_, "fsync " + inner_->path());
    inner_->sync();
  }
  uint64_t offset() const override { return inner_->offset(); }
  const std::string &path() const override { return inner_->path(); }

 private:
  std::unique_ptr<format::OutputFile> inner_;
  uint64_t limit_;
  int err_;
  bool sync_fails_;
};

std::vector<std::string> dir_entries(const std::string &dir) {
  std::vector<std::string> names;
  for (const auto &e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("ENOSPC or EIO at any point leaves no pack and no temporary file", "[pack][faults]") {
  TempDir dir;
  testkit::SyntheticSpec spec;
  spec.num_layers = 2;
  spec.num_experts = 4;
  spec.n_embd = 256;
  spec.n_ff = 128;
  const std::string src = testkit::write_synthetic_gguf(spec, dir / "src.gguf")[0];
  const std::string out = dir / "m.epk";
  const auto before = dir_entries(dir.str());
  // Learn the size of a good build, then fail at points across it.
  pack::build_pack(std::vector<std::string>{src}, dir / "probe.epk");
  const uint64_t size = std::filesystem::file_size(dir / "probe.epk");
  std::filesystem::remove(dir / "probe.epk");
  std::filesystem::remove(dir / "probe.epk.json");
  for (uint64_t limit : {uint64_t{0}, uint64_t{1}, uint64_t{4096}, uint64_t{8192}, size / 3, size / 2, size - 4096, size - 1}) {
    for (int err : {ENOSPC, EIO}) {
      INFO("fail after " << limit << " bytes with errno " << err);
      pack::BuildOptions opt;
      opt.wrap_output = [&](std::unique_ptr<format::OutputFile> f) -> std::unique_ptr<format::OutputFile> {
        return std::make_unique<FailingOutput>(std::move(f), limit, err, false);
      };
      try {
        pack::build_pack(std::vector<std::string>{src}, out, opt);
        FAIL("build succeeded");
      } catch (const Error &e) {
        CHECK(e.status() == Status::io);
        CHECK(std::string(e.what()).find(err == ENOSPC ? "No space left" : "Input/output error") != std::string::npos);
      }
      CHECK_FALSE(std::filesystem::exists(out));
      CHECK(dir_entries(dir.str()) == before);
    }
  }
  SECTION("fsync fails") {
    pack::BuildOptions opt;
    opt.wrap_output = [&](std::unique_ptr<format::OutputFile> f) -> std::unique_ptr<format::OutputFile> {
      return std::make_unique<FailingOutput>(std::move(f), UINT64_MAX, EIO, true);
    };
    CHECK_THROWS_AS(pack::build_pack(std::vector<std::string>{src}, out, opt), Error);
    CHECK(dir_entries(dir.str()) == before);
  }
  SECTION("a failed rebuild keeps the previous pack intact") {
    pack::build_pack(std::vector<std::string>{src}, out);
    const auto good = test::read_file(out);
    const auto good_manifest = test::read_file(out + ".json");
    pack::BuildOptions opt;
    opt.wrap_output = [&](std::unique_ptr<format::OutputFile> f) -> std::unique_ptr<format::OutputFile> {
      return std::make_unique<FailingOutput>(std::move(f), size / 2, ENOSPC, false);
    };
    CHECK_THROWS_AS(pack::build_pack(std::vector<std::string>{src}, out, opt), Error);
    CHECK(test::read_file(out) == good);
    CHECK(test::read_file(out + ".json") == good_manifest);
    CHECK_NOTHROW(format::PackFile::open(out, format::ValidationLevel::full));
  }
}

TEST_CASE("a second builder is refused while the lock is held", "[pack][faults][lock]") {
  TempDir dir;
  testkit::SyntheticSpec spec;
  const std::string src = testkit::write_synthetic_gguf(spec, dir / "src.gguf")[0];
  const std::string out = dir / "m.epk";
  const int fd = ::open((out + ".lock").c_str(), O_RDWR | O_CREAT, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX) == 0);
  try {
    pack::build_pack(std::vector<std::string>{src}, out);
    FAIL("second builder was not refused");
  } catch (const Error &e) {
    CHECK(e.status() == Status::busy);
    CHECK(std::string(e.what()).find("another builder") != std::string::npos);
  }
  CHECK_FALSE(std::filesystem::exists(out));
  ::flock(fd, LOCK_UN);
  ::close(fd);
  CHECK_NOTHROW(pack::build_pack(std::vector<std::string>{src}, out));
  CHECK_FALSE(std::filesystem::exists(out + ".lock"));  // removed by the builder that held it
}

TEST_CASE("a source that changes between planning and copying is refused", "[pack][faults]") {
  TempDir dir;
  testkit::SyntheticSpec spec;
  const std::string src = testkit::write_synthetic_gguf(spec, dir / "src.gguf")[0];
  const pack::ExpertPlan plan = pack::plan_sources({src});
  {
    auto b = test::read_file(src);
    b.push_back(0);
    test::write_file(src, b);
  }
  try {
    pack::build_pack(plan, dir / "m.epk");
    FAIL("accepted");
  } catch (const Error &e) {
    CHECK(e.status() == Status::stale);
    CHECK(std::string(e.what()).find("source changed") != std::string::npos);
  }
  CHECK_FALSE(std::filesystem::exists(dir / "m.epk"));
}
