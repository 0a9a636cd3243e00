// ep-bench io: the disk's raw O_DIRECT random-read bandwidth at the pack's object size (fio
// with --fixedbufs --registerfiles where installed, else an own io_uring loop) against the engine's expert
// reader (src/io: io_uring, fixed file + fixed buffers) on the same file in the same run.
#include "bench_common.hpp"

#include "core/error.hpp"
#include "io/file.hpp"
#include "io/reader.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#ifdef EP_HAVE_URING
#include <liburing.h>
#endif

#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

namespace ep::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Objects {
  const store::ObjectMap *layout;
  uint64_t count() const { return static_cast<uint64_t>(layout->num_layers()) * layout->num_experts(); }
  uint64_t offset(uint64_t i) const {
    return layout->object_offset(static_cast<uint32_t>(i / layout->num_experts()),
                                 static_cast<uint32_t>(i % layout->num_experts()));
  }
  uint32_t file(uint64_t i) const {
    return layout->object_file(static_cast<uint32_t>(i / layout->num_experts()),
                               static_cast<uint32_t>(i % layout->num_experts()));
  }
};

// fio, random O_DIRECT reads of `block` bytes at block-aligned offsets after data_start.
bool fio_gbps(const PackSource &src, uint64_t block, uint32_t depth, double seconds, double &gbps, std::string &why) {
  if (src.files.size() > 1) {
    why = "a striped pack (fio reads one file here)";
    return false;
  }
  int rc = 0;
  run_command("command -v fio >/dev/null 2>&1", rc);
  if (rc != 0) {
    why = "fio not installed";
    return false;
  }
  const Objects objects{src.layout.get()};
  const uint64_t start = objects.offset(0);
  const uint64_t span = objects.count() * block;
  const std::string cmd = fmt::format(
      "fio --name=raw --filename='{}' --readonly --direct=1 --ioengine=io_uring --rw=randread --bs={} "
      "--iodepth={} --offset={} --size={} --runtime={} --time_based --norandommap --randrepeat=0 "
      "--fixedbufs --registerfiles --output-format=json 2>/dev/null",
      src.path, block, depth, start, span, static_cast<int>(seconds + 0.5));
  const std::string out = run_command(cmd, rc);
  const auto brace = out.find('{');
  if (rc != 0 || brace == std::string::npos) {
    why = fmt::format("fio failed (exit {})", rc);
    return false;
  }
  try {
    const auto j = nlohmann::json::parse(out.substr(brace));
    const double bw = j.at("jobs").at(0).at("read").at("bw_bytes").get<double>();
    gbps = bw / 1e9;
    return gbps > 0;
  } catch (const std::exception &e) {
    why = fmt::format("cannot parse fio's JSON: {}", e.what());
    return false;
  }
}

}  // namespace

// The own raw loop (no fio): io_uring with a registered file and buffer, `depth` whole-object
// O_DIRECT reads in flight — the same kernel features fio uses with --fixedbufs
// --registerfiles. Without liburing: `depth` threads of O_DIRECT pread. A striped pack's parts are
// all read at once (each a registered file). (Also used by ep-bench e2e.)
double raw_loop_gbps(const PackSource &src, uint64_t block, uint32_t depth, double seconds) {
  const Objects objects{src.layout.get()};
  std::vector<io::FileHandle> handles;
  std::vector<int> fds;
  for (const std::string &f : src.files.empty() ? std::vector<std::string>{src.path} : src.files) {
    bool direct = false;
    handles.push_back(io::open_for_read(f, io::DirectMode::automatic, direct));
    fds.push_back(handles.back().get());
  }
  const auto t0 = Clock::now();
  const auto deadline = t0 + std::chrono::duration<double>(seconds);
  uint64_t total = 0;
#ifdef EP_HAVE_URING
  io_uring ring{};
  if (io_uring_queue_init(depth, &ring, 0) == 0) {
    io::AlignedBuffer buf(static_cast<std::size_t>(depth) * block);
    iovec iov{buf.data(), buf.size()};
    const bool fixed_file = io_uring_register_files(&ring, fds.data(), static_cast<unsigned>(fds.size())) == 0;
    const bool fixed_buf = io_uring_register_buffers(&ring, &iov, 1) == 0;
    std::mt19937_64 rng(1000);
    std::uniform_int_distribution<uint64_t> pick(0, objects.count() - 1);
    auto queue = [&](uint32_t slot) {
      io_uring_sqe *sqe = io_uring_get_sqe(&ring);
      std::byte *dst = buf.data() + static_cast<uint64_t>(slot) * block;
      const uint64_t i = pick(rng);
      const uint64_t off = objects.offset(i);
      const uint32_t f = objects.file(i);
      const int file = fixed_file ? static_cast<int>(f) : fds[f];
      if (fixed_buf) io_uring_prep_read_fixed(sqe, file, dst, static_cast<unsigned>(block), off, 0);
      else io_uring_prep_read(sqe, file, dst, static_cast<unsigned>(block), off);
      if (fixed_file) sqe->flags |= IOSQE_FIXED_FILE;
      io_uring_sqe_set_data64(sqe, slot);
    };
    for (uint32_t s = 0; s < depth; ++s) queue(s);
    io_uring_submit(&ring);
    uint32_t in_flight = depth;
    while (in_flight > 0) {
      io_uring_cqe *cqe = nullptr;
      if (io_uring_wait_cqe(&ring, &cqe) != 0) break;
      const auto slot = static_cast<uint32_t>(io_uring_cqe_get_data64(cqe));
      if (cqe->res > 0) total += static_cast<uint64_t>(cqe->res);
      io_uring_cqe_seen(&ring, cqe);
      --in_flight;
      if (Clock::now() < deadline) {
        queue(slot);
        io_uring_submit(&ring);
        ++in_flight;
      }
    }
    io_uring_queue_exit(&ring);
    return static_cast<double>(total) / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9;
  }
#endif
  std::atomic<uint64_t> bytes{0};
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < depth; ++t) {
    threads.emplace_back([&, t] {
      io::AlignedBuffer buf(block);
      std::mt19937_64 rng(1000 + t);
      std::uniform_int_distribution<uint64_t> pick(0, objects.count() - 1);
      while (Clock::now() < deadline) {
        const uint64_t i = pick(rng);
        const ssize_t n = ::pread(fds[objects.file(i)], buf.data(), block, static_cast<off_t>(objects.offset(i)));
        if (n > 0) bytes += static_cast<uint64_t>(n);
      }
    });
  }
  for (auto &t : threads) t.join();
  total = bytes.load();
  return static_cast<double>(total) / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9;
}

namespace {

struct EngineResult {
  double gbps = 0;
  std::string backend;
  bool direct = false;
  uint64_t reads = 0;
};

// The engine: io::Reader with `depth` reads in flight into a registered staging ring.
EngineResult engine_gbps(const PackSource &src, uint64_t block, const io::ReaderOptions &options, double seconds) {
  const Objects objects{src.layout.get()};
  io::ReaderCounters counters;
  auto reader = io::open_reader(src.files.empty() ? std::vector<std::string>{src.path} : src.files, options, counters);
  const uint32_t depth = std::max<uint32_t>(1, options.queue_depth);
  io::AlignedBuffer ring(static_cast<std::size_t>(depth) * block);
  reader->register_buffer(ring.data(), ring.size());
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<uint64_t> pick(0, objects.count() - 1);
  auto submit = [&](uint32_t slot) {
    const uint64_t i = pick(rng);
    io::ReadRequest r;
    r.file = objects.file(i);
    r.offset = objects.offset(i);
    r.bytes = block;
    r.dst = ring.data() + static_cast<uint64_t>(slot) * block;
    r.tag = slot;
    reader->submit(r);
  };
  const auto t0 = Clock::now();
  const auto deadline = t0 + std::chrono::duration<double>(seconds);
  for (uint32_t s = 0; s < depth; ++s) submit(s);
  uint64_t bytes = 0;
  std::vector<io::ReadCompletion> done;
  bool stopping = false;
  while (reader->outstanding() > 0) {
    done.clear();
    reader->wait(done, 1);
    stopping = stopping || Clock::now() >= deadline;
    for (const auto &c : done) {
      if (!c.ok) fail(Status::io, "engine read failed: {}", c.message);
      bytes += block;
      if (!stopping) submit(static_cast<uint32_t>(c.tag));
    }
  }
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  EngineResult r;
  r.gbps = static_cast<double>(bytes) / s / 1e9;
  r.backend = std::string(reader->backend_name());
  r.direct = reader->direct();
  r.reads = counters.reads.load();
  return r;
}

}  // namespace

int cmd_io(const Args &args) {
  const PackSource src = pack_from_args(args);
  const uint64_t block = io::align_up(src.layout->max_object_bytes(), io::kDirectAlignment);
  const auto depth = static_cast<uint32_t>(args.number("queue-depth", 32));
  const double seconds = args.number("seconds", 10);
  io::ReaderOptions options;
  options.backend = io::parse_backend(args.get("backend", "auto"));
  options.queue_depth = depth;
  options.read_splits = static_cast<uint32_t>(args.number("splits", 1));
  options.pread_threads = depth;

  // Rounds alternate the order (raw, engine, engine, raw, ...) so that a cache or a thermal
  // trend below the file system favours neither side; the means are compared.
  const auto rounds = static_cast<uint32_t>(std::max(1.0, args.number("rounds", 2)));
  std::string raw_tool = args.has("no-fio") ? "raw-loop" : "fio";
  std::vector<double> raw_runs, engine_runs;
  EngineResult engine;
  auto run_raw = [&] {
    double gbps = 0;
    std::string why;
    if (raw_tool == "fio" && !fio_gbps(src, block, depth, seconds, gbps, why)) {
      std::fprintf(stderr, "ep-bench io: %s: using the own raw read loop\n", why.c_str());
      raw_tool = "raw-loop";
    }
    if (raw_tool == "raw-loop") gbps = raw_loop_gbps(src, block, depth, seconds);
    raw_runs.push_back(gbps);
  };
  auto run_engine = [&] {
    engine = engine_gbps(src, block, options, seconds);
    engine_runs.push_back(engine.gbps);
  };
  for (uint32_t r = 0; r < rounds; ++r) {
    if (r % 2 == 0) {
      run_raw();
      run_engine();
    } else {
      run_engine();
      run_raw();
    }
  }
  auto mean = [](const std::vector<double> &v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0.0 : s / static_cast<double>(v.size());
  };
  const double raw = mean(raw_runs);
  engine.gbps = mean(engine_runs);
  const double ratio = raw > 0 ? engine.gbps / raw : 0;
  if (args.has("json")) {
    nlohmann::ordered_json j;
    j["bench"] = "io";
    j["pack"] = src.path;
    j["pack_kind"] = src.kind;
    j["object_bytes"] = block;
    j["queue_depth"] = depth;
    j["read_splits"] = options.read_splits;
    j["seconds"] = seconds;
    j["raw_tool"] = raw_tool;
    j["rounds"] = rounds;
    j["raw_gbps"] = raw;
    j["engine_gbps"] = engine.gbps;
    j["raw_runs_gbps"] = raw_runs;
    j["engine_runs_gbps"] = engine_runs;
    j["engine_backend"] = engine.backend;
    j["engine_direct"] = engine.direct;
    j["ratio"] = ratio;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("pack %s (%s), objects of %llu B, queue depth %u, %g s each\n", src.path.c_str(), src.kind.c_str(),
                static_cast<unsigned long long>(block), depth, seconds);
    std::printf("%u round(s), order alternating raw/engine; means:\n", rounds);
    std::printf("raw (%s, O_DIRECT random reads): %.3f GB/s\n", raw_tool.c_str(), raw);
    std::printf("engine (%s%s, %u split(s)):      %.3f GB/s\n", engine.backend.c_str(),
                engine.direct ? " O_DIRECT" : " buffered", options.read_splits, engine.gbps);
    std::printf("ratio engine/raw: %.3f (target >= 0.90)\n", ratio);
  }
  if (!engine.direct)
    std::fprintf(stderr, "ep-bench io: warning: reads were buffered (no O_DIRECT): the numbers measure the page cache\n");
  return 0;
}

}  // namespace ep::bench
