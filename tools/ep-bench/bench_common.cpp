#include "bench_common.hpp"

#include "format/pack_file.hpp"

#include "core/error.hpp"
#include "core/log.hpp"
#include "io/file.hpp"
#include "store/pack_object_map.hpp"
#include "testkit/store_pack.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

namespace ep::bench {

bool Args::has(const std::string &flag) const { return std::find(flags.begin(), flags.end(), flag) != flags.end(); }

std::string Args::get(const std::string &name, const std::string &fallback) const {
  auto it = options.find(name);
  return it == options.end() ? fallback : it->second;
}

double Args::number(const std::string &name, double fallback) const {
  auto it = options.find(name);
  if (it == options.end()) return fallback;
  // A plain number keeps its fraction (--io-seconds 0.3); one with a unit is a size (20G).
  char *end = nullptr;
  const double v = std::strtod(it->second.c_str(), &end);
  if (end != it->second.c_str() && *end == '\0' && std::isfinite(v) && v >= 0) return v;
  return static_cast<double>(testkit::parse_size(it->second));
}

Args parse_args(int argc, char **argv, int start, const std::vector<std::string> &flags) {
  Args a;
  for (int i = start; i < argc; ++i) {
    std::string s = argv[i];
    if (s.rfind("--", 0) != 0) fail(Status::invalid_argument, "unexpected argument '{}'", s);
    s = s.substr(2);
    if (std::find(flags.begin(), flags.end(), s) != flags.end()) {
      a.flags.push_back(s);
    } else {
      if (i + 1 >= argc) fail(Status::invalid_argument, "--{} needs a value", s);
      a.options[s] = argv[++i];
    }
  }
  return a;
}

PackSource pack_from_args(const Args &args) {
  PackSource src;
  const uint64_t object_bytes = static_cast<uint64_t>(args.number("object-bytes", kDefaultObjectBytes));
  if (args.options.count("pack")) {
    src.path = args.get("pack", "");
    src.files = {src.path};
    if (auto spec = testkit::read_synthetic_header(src.path)) {
      src.layout = spec->object_map();
      src.kind = "synthetic";
      return src;
    }
    if (!args.options.count("object-bytes")) {
      // An Expert Pack v1 (structure checked; payload hashes are the validator's job).
      auto pack = store::PackObjectMap::open(src.path, false);
      src.files = pack->pack().data_files();
      src.layout = std::move(pack);
      src.kind = src.files.size() > 1 ? "expert-pack-striped" : "expert-pack";
      return src;
    }
    const uint64_t data_start = static_cast<uint64_t>(args.number("data-start", 0));
    const uint64_t stride = io::align_up(object_bytes, io::kDirectAlignment);
    const uint64_t size = io::file_size_bytes(src.path);
    if (size < data_start + stride) fail(Status::format, "{}: {} bytes hold no object of {} bytes", src.path, size, object_bytes);
    const auto objects = static_cast<uint32_t>((size - data_start) / stride);
    src.layout = std::make_shared<store::UniformObjectMap>(1, objects, object_bytes, stride, data_start);
    src.kind = "raw";
    return src;
  }
  if (!args.options.count("create-size"))
    fail(Status::invalid_argument, "give --pack PATH or --create-size SIZE (e.g. 20G) for a synthetic pack");
  const uint64_t size = testkit::parse_size(args.get("create-size", ""));
  const auto experts = static_cast<uint32_t>(args.number("experts", 256));
  const auto spec = testkit::SyntheticPackSpec::for_size(size, object_bytes, experts, 1);
  src.path = args.get("create-path", "ep-bench.synthetic.pack");
  src.files = {src.path};
  const auto t0 = std::chrono::steady_clock::now();
  const bool wrote = testkit::create_synthetic_pack(src.path, spec, std::max(2u, std::thread::hardware_concurrency()));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "ep-bench: %s synthetic pack %s: %u layers x %u experts x %llu B = %.2f GiB (%.1f s)\n",
               wrote ? "created" : "reusing", src.path.c_str(), spec.num_layers, spec.num_experts,
               static_cast<unsigned long long>(spec.object_bytes),
               static_cast<double>(spec.file_bytes()) / (1ull << 30), s);
  src.layout = spec.object_map();
  src.kind = "synthetic";
  return src;
}

std::string run_command(const std::string &command, int &rc) {
  std::string out;
  rc = -1;
  std::FILE *p = ::popen(command.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

}  // namespace ep::bench
