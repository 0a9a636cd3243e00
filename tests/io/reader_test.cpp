// The expert reader on both backends: correctness under injected short reads, EINTR/EAGAIN,
// EIO (transient and persistent), latency, O_DIRECT rejection, and the pread fallback.
#include "support/catch.hpp"

#include "core/error.hpp"
#include "io/reader.hpp"
#include "support/fake_disk_clock.hpp"
#include "testkit/store_pack.hpp"

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace {

using namespace ep;

struct Fixture {
  testkit::SyntheticPackSpec spec;
  std::string path;
  Fixture() {
    spec.num_layers = 2;
    spec.num_experts = 6;
    spec.object_bytes = 3 * 4096 * 5 + 777;  // not a multiple of 4096: the tail is padding
    spec.seed = 42;
    path = (std::filesystem::current_path() / "io_reader_test.pack").string();
    testkit::create_synthetic_pack(path, spec, 2);
  }
};

Fixture &fixture() {
  static Fixture f;
  return f;
}

std::vector<io::Backend> backends() {
  std::vector<io::Backend> out{io::Backend::pread};
  if (io::uring_compiled()) out.push_back(io::Backend::uring);
  return out;
}

// Reads every object with @p options; returns the completions; checks the bytes of the
// successful ones against the generator.
std::vector<io::ReadCompletion> read_all(const io::ReaderOptions &options, io::ReaderCounters &counters,
                                         std::string *backend_name = nullptr, bool *direct = nullptr) {
  Fixture &f = fixture();
  auto reader = io::open_reader(f.path, options, counters);
  if (backend_name) *backend_name = std::string(reader->backend_name());
  const uint64_t objects = static_cast<uint64_t>(f.spec.num_layers) * f.spec.num_experts;
  const uint64_t stride = f.spec.stride();
  io::AlignedBuffer buffer(objects * stride);
  std::memset(buffer.data(), 0xAB, buffer.size());
  reader->register_buffer(buffer.data(), buffer.size());
  auto layout = f.spec.object_map();
  for (uint64_t i = 0; i < objects; ++i) {
    io::ReadRequest r;
    r.offset = layout->object_offset(static_cast<uint32_t>(i / f.spec.num_experts), static_cast<uint32_t>(i % f.spec.num_experts));
    r.bytes = f.spec.object_bytes;
    r.dst = buffer.data() + i * stride;
    r.tag = i;
    reader->submit(r);
  }
  std::vector<io::ReadCompletion> done;
  while (reader->outstanding() > 0) reader->wait(done, 1);
  if (direct) *direct = reader->direct();
  std::vector<std::byte> expect(f.spec.object_bytes);
  for (const auto &c : done) {
    if (!c.ok) continue;
    const auto layer = static_cast<uint32_t>(c.tag / f.spec.num_experts);
    const auto expert = static_cast<uint32_t>(c.tag % f.spec.num_experts);
    testkit::fill_synthetic_object(f.spec, layer, expert, expect);
    CHECK(std::memcmp(buffer.data() + c.tag * stride, expect.data(), expect.size()) == 0);
  }
  return done;
}

}  // namespace

TEST_CASE("reader reads every object exactly on each backend and mode", "[io]") {
  for (auto backend : backends()) {
    for (auto mode : {io::DirectMode::automatic, io::DirectMode::buffered}) {
      for (uint32_t splits : {1u, 3u}) {
        io::ReaderOptions o;
        o.backend = backend;
        o.direct = mode;
        o.read_splits = splits;
        o.queue_depth = 4;
        o.pread_threads = 3;
        io::ReaderCounters counters;
        std::string name;
        const auto done = read_all(o, counters, &name);
        REQUIRE(done.size() == 12);
        for (const auto &c : done) CHECK(c.ok);
        CHECK(counters.reads == 12);
        CHECK(counters.read_bytes == 12 * fixture().spec.object_bytes);
        CHECK(counters.io_errors == 0);
        if (backend == io::Backend::pread) CHECK(name == "pread");
      }
    }
  }
}

TEST_CASE("short reads, EINTR and EAGAIN are resubmitted until complete", "[io]") {
  for (auto backend : backends()) {
    for (auto mode : {io::DirectMode::automatic, io::DirectMode::buffered}) {
      io::FaultPlan plan;
      plan.seed = 7;
      plan.short_probability = 0.5;
      plan.eagain_probability = 0.1;
      plan.eintr_probability = 0.1;
      auto seam = std::make_shared<io::FaultInjector>(plan);
      io::ReaderOptions o;
      o.backend = backend;
      o.direct = mode;
      o.read_splits = 2;
      o.seam = seam;
      io::ReaderCounters counters;
      const auto done = read_all(o, counters);
      REQUIRE(done.size() == 12);
      for (const auto &c : done) CHECK(c.ok);
      CHECK(seam->injected_short() > 0);
      CHECK(seam->injected_retry() > 0);
      CHECK(counters.short_reads > 0);  // a short read ending in the padding tail needs no resubmission
      CHECK(counters.retries == seam->injected_retry());
      CHECK(counters.io_errors == 0);
    }
  }
}

TEST_CASE("transient EIO is retried and counted; persistent EIO fails naming pack and offset", "[io]") {
  for (auto backend : backends()) {
    SECTION("transient") {
      io::FaultPlan plan;
      plan.eio_probability = 0.3;
      plan.seed = 3;
      auto seam = std::make_shared<io::FaultInjector>(plan);
      io::ReaderOptions o;
      o.backend = backend;
      o.eio_retries = 50;
      o.seam = seam;
      io::ReaderCounters counters;
      const auto done = read_all(o, counters);
      for (const auto &c : done) CHECK(c.ok);
      CHECK(seam->injected_eio() > 0);
      CHECK(counters.io_errors == seam->injected_eio());
    }
    SECTION("persistent") {
      auto layout = fixture().spec.object_map();
      io::FaultPlan plan;
      plan.bad_offset = layout->object_offset(1, 2) + 4096;
      plan.bad_bytes = 1;
      io::ReaderOptions o;
      o.backend = backend;
      o.eio_retries = 2;
      o.seam = std::make_shared<io::FaultInjector>(plan);
      io::ReaderCounters counters;
      const auto done = read_all(o, counters);
      REQUIRE(done.size() == 12);
      int failed = 0;
      for (const auto &c : done) {
        if (c.ok) continue;
        ++failed;
        CHECK(c.tag == 1 * 6 + 2);
        CHECK(c.error == EIO);
        CHECK(c.message.find(fixture().path) != std::string::npos);
        CHECK(c.message.find(std::to_string(layout->object_offset(1, 2))) != std::string::npos);
        CHECK(c.message.find("3 attempt") != std::string::npos);
      }
      CHECK(failed == 1);
      CHECK(counters.io_errors == 3);  // the first try and two retries
      CHECK(counters.reads == 11);
    }
  }
}

TEST_CASE("latency injection does not change the bytes and shows in latency_ns", "[io]") {
  for (auto backend : backends()) {
    io::FaultPlan plan;
    plan.latency_ns = 2'000'000;
    io::ReaderOptions o;
    o.backend = backend;
    o.seam = std::make_shared<io::FaultInjector>(plan);
    io::ReaderCounters counters;
    const auto done = read_all(o, counters);
    REQUIRE(done.size() == 12);
    for (const auto &c : done) {
      CHECK(c.ok);
      CHECK(c.latency_ns >= 2'000'000);
    }
  }
}

TEST_CASE("EINVAL from an O_DIRECT read switches to buffered reads with a fallback count", "[io]") {
  struct RejectDirect : io::IoSeam {
    std::atomic<int> left{1};
    int64_t on_read_result(uint64_t, uint64_t, int64_t result) override {
      return left.fetch_sub(1) > 0 ? -EINVAL : result;
    }
  };
  {
    // Where the filesystem already refuses O_DIRECT at open, the fallback happened there.
    io::ReaderCounters probe_counters;
    io::ReaderOptions probe;
    probe.backend = io::Backend::pread;
    if (!io::open_reader(fixture().path, probe, probe_counters)->direct()) {
      CHECK(probe_counters.fallback_count == 1);
      return;
    }
  }
  for (auto backend : backends()) {
    io::ReaderOptions o;
    o.backend = backend;
    o.direct = io::DirectMode::automatic;
    o.seam = std::make_shared<RejectDirect>();
    io::ReaderCounters counters;
    bool direct = true;
    const auto done = read_all(o, counters, nullptr, &direct);
    REQUIRE(done.size() == 12);
    for (const auto &c : done) CHECK(c.ok);
    CHECK_FALSE(direct);
    CHECK(counters.fallback_count >= 1);
  }
}

TEST_CASE("EINVAL with DirectMode::direct is an error, not a silent fallback", "[io]") {
  struct RejectDirect : io::IoSeam {
    int64_t on_read_result(uint64_t, uint64_t, int64_t) override { return -EINVAL; }
  };
  io::ReaderOptions o;
  o.backend = io::Backend::pread;
  o.direct = io::DirectMode::direct;
  o.seam = std::make_shared<RejectDirect>();
  io::ReaderCounters counters;
  std::vector<io::ReadCompletion> done;
  try {
    done = read_all(o, counters);
  } catch (const Error &e) {
    CHECK(e.status() == Status::io);  // this filesystem refuses O_DIRECT at open already
    return;
  }
  REQUIRE(done.size() == 12);
  for (const auto &c : done) {
    CHECK_FALSE(c.ok);
    CHECK(c.error == EINVAL);
  }
  CHECK(counters.fallback_count == 0);
}

TEST_CASE("io_uring setup failure falls back to the pread pool, counted", "[io]") {
  io::FaultPlan plan;
  plan.uring_setup_errno = EPERM;
  io::ReaderOptions o;
  o.backend = io::Backend::automatic;
  o.seam = std::make_shared<io::FaultInjector>(plan);
  io::ReaderCounters counters;
  std::string name;
  const auto done = read_all(o, counters, &name);
  for (const auto &c : done) CHECK(c.ok);
  CHECK(name == "pread");
  CHECK(counters.fallback_count >= 1);

  // Asking for io_uring explicitly makes the same failure an error.
  if (io::uring_compiled()) {
    o.backend = io::Backend::uring;
    io::ReaderCounters c2;
    try {
      io::open_reader(fixture().path, o, c2);
      FAIL("expected an error");
    } catch (const Error &e) {
      CHECK(e.status() == Status::unsupported);
      CHECK(std::string(e.what()).find(fixture().path) != std::string::npos);
    }
  }
}

TEST_CASE("an explicitly chosen pread pool is not a fallback", "[io]") {
  io::ReaderOptions o;
  o.backend = io::Backend::pread;
  o.direct = io::DirectMode::buffered;
  io::ReaderCounters counters;
  read_all(o, counters);
  CHECK(counters.fallback_count == 0);
  CHECK(io::parse_backend("uring") == io::Backend::uring);
  CHECK_THROWS_AS(io::parse_backend("mmap"), Error);
}

TEST_CASE("misaligned O_DIRECT requests are rejected up front", "[io]") {
  io::ReaderOptions o;
  o.backend = io::Backend::pread;
  o.direct = io::DirectMode::automatic;
  io::ReaderCounters counters;
  auto reader = io::open_reader(fixture().path, o, counters);
  CHECK(reader->backend_name() == "pread");
  if (!reader->direct()) return;  // a filesystem without O_DIRECT: nothing more to check
  io::AlignedBuffer buf(1 << 16);
  io::ReadRequest r{4096 + 512, 4096, buf.data(), 0};
  CHECK_THROWS_AS(reader->submit(r), Error);
}

using ep::test::FakeClock;
using ep::test::SlowDevice;

TEST_CASE("BusyClock sums the time with reads in flight, reading the clock only at transitions", "[io]") {
  FakeClock c;
  io::BusyClock busy(c.clock(), 2);
  c.t = 10;
  busy.started();  // 0 -> 1: opens busy
  c.t = 20;
  busy.started();  // 1 -> 2: opens full
  c.t = 25;
  busy.started();  // 2 -> 3: no transition
  c.t = 35;
  busy.finished();  // 3 -> 2: still full
  CHECK(c.reads == 2);
  c.t = 40;
  busy.finished();  // 2 -> 1: closes full (20 ns)
  c.t = 50;
  busy.finished();  // 1 -> 0: closes busy (40 ns)
  CHECK(c.reads == 4);
  c.t = 60;
  io::BusyTimes b = busy.until_now();
  CHECK(b.now_ns == 60);
  CHECK(b.busy_ns == 40);
  CHECK(b.full_ns == 20);
  c.t = 100;
  busy.started(2);  // opens both with one clock read
  CHECK(c.reads == 6);
  c.t = 130;
  b = busy.until_now();  // the open intervals count up to now
  CHECK(b.busy_ns == 70);
  CHECK(b.full_ns == 50);
  CHECK(busy.in_flight() == 2);
  CHECK_THROWS_AS(busy.finished(3), Error);
}

TEST_CASE("a reader's busy time is the time its reads spend in the device, on every backend", "[io]") {
  // The clock moves only inside reads (500 ns each): whatever the interleaving of the pool's
  // threads or of io_uring's completions, the busy time is 500 ns per raw read, and with a full
  // depth of 1 the full time is the same.
  for (auto backend : backends()) {
    for (uint32_t threads : {1u, 3u}) {
      FakeClock c;
      auto seam = std::make_shared<SlowDevice>(c, 500);
      io::ReaderOptions o;
      o.backend = backend;
      o.direct = io::DirectMode::buffered;
      o.queue_depth = 4;
      o.pread_threads = threads;
      o.full_depth = 1;
      o.seam = seam;
      o.clock = c.clock();
      io::ReaderCounters counters;
      auto reader = io::open_reader(fixture().path, o, counters);
      CHECK(reader->full_depth() == 1);
      CHECK(reader->busy_times().busy_ns == 0);  // nothing read yet
      const uint64_t t0 = c.t;
      io::AlignedBuffer buffer(fixture().spec.stride());
      reader->register_buffer(buffer.data(), buffer.size());
      std::vector<io::ReadCompletion> got;
      for (int i = 0; i < 3; ++i) {
        io::ReadRequest r;
        r.offset = fixture().spec.object_map()->object_offset(0, static_cast<uint32_t>(i));
        r.bytes = fixture().spec.object_bytes;
        r.dst = buffer.data();
        r.tag = static_cast<uint64_t>(i);
        reader->submit(r);
        while (reader->outstanding() > 0) reader->wait(got, 1);
      }
      const io::BusyTimes b = reader->busy_times();
      const uint64_t calls = seam->calls;
      CHECK(got.size() == 3);
      CHECK(calls >= 3);
      CHECK(b.busy_ns == 500 * calls);
      CHECK(b.full_ns == b.busy_ns);
      CHECK(b.now_ns == t0 + 500 * calls);
    }
  }
}

TEST_CASE("a reader's full depth is at most what it can have in flight", "[io]") {
  for (auto backend : backends()) {
    io::ReaderOptions o;
    o.backend = backend;
    o.queue_depth = 4;
    o.pread_threads = 3;
    io::ReaderCounters counters;
    auto reader = io::open_reader(fixture().path, o, counters);
    const uint32_t most = reader->backend_name() == "pread" ? 3 : 4;
    CHECK(reader->full_depth() == most);
    o.full_depth = 2;
    CHECK(io::open_reader(fixture().path, o, counters)->full_depth() == 2);
    o.full_depth = 100;
    CHECK(io::open_reader(fixture().path, o, counters)->full_depth() == most);
  }
}
