// ep-pack: build, validate and inspect Expert Packs; list GGUF files; write synthetic
// checkpoints; benchmark pack building against a raw copy.
#include "core/error.hpp"
#include "format/byte_source.hpp"
#include "format/file_writer.hpp"
#include "format/gguf.hpp"
#include "format/hash.hpp"
#include "format/pack_file.hpp"
#include "format/safetensors.hpp"
#include "pack/builder.hpp"
#include "pack/manifest.hpp"
#include "pack/validate.hpp"
#include "testkit/checkpoint.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

const char *kUsage =
    "usage:\n"
    "  ep-pack build SRC... -o PACK [--alignment N] [--stripe DIR1,DIR2,...] [--quiet]\n"
    "      --stripe: the objects interleaved over one part file per directory (one per drive);\n"
    "      PACK keeps the header and index and opens like any pack\n"
    "      SRC: a GGUF (any shard finds the rest; any name, e.g. an Ollama blob), safetensors\n"
    "      files, a model.safetensors.index.json, or a directory holding them (recognised by\n"
    "      their bytes, not their names)\n"
    "  ep-pack validate PACK [--full] [--no-sources]\n"
    "  ep-pack inspect PACK [--json]\n"
    "  ep-pack gguf-info FILE [--all]\n"
    "  ep-pack synth -o PATH [--arch deepseek4|kimi-k3] [--layers N] [--first-moe N] [--experts N]\n"
    "      [--top-k N] [--embd D] [--ff F] [--type mxfp4] [--down-type T] [--seed S] [--shards K]\n"
    "      [--safetensors fused|per_expert|w123]\n"
    "  ep-pack bench --dir DIR [--gb 8] [--keep]\n"
    "      writes a synthetic GGUF of at least GB GiB in DIR, times a raw sequential copy of it and\n"
    "      a pack build of it, prints both throughputs and their ratio, then deletes the files\n";

struct Args {
  std::vector<std::string> positional;
  std::vector<std::pair<std::string, std::string>> options;  // --name value ("" for flags)
  bool has(const std::string &name) const {
    for (const auto &o : options)
      if (o.first == name) return true;
    return false;
  }
  std::string get(const std::string &name, const std::string &def = "") const {
    for (const auto &o : options)
      if (o.first == name) return o.second;
    return def;
  }
  uint64_t get_u64(const std::string &name, uint64_t def) const {
    const std::string v = get(name);
    if (v.empty()) return def;
    size_t used = 0;
    const unsigned long long x = std::stoull(v, &used);
    if (used != v.size()) ep::fail(ep::Status::invalid_argument, "--{}: '{}' is not a number", name, v);
    return x;
  }
};

Args parse_args(int argc, char **argv, int start, const std::vector<std::string> &flags) {
  Args a;
  for (int i = start; i < argc; ++i) {
    std::string s = argv[i];
    if (s == "-o") s = "--output";
    if (s.rfind("--", 0) == 0) {
      const std::string name = s.substr(2);
      if (std::find(flags.begin(), flags.end(), name) != flags.end()) {
        a.options.emplace_back(name, "");
      } else {
        if (i + 1 >= argc) ep::fail(ep::Status::invalid_argument, "option {} needs a value", s);
        a.options.emplace_back(name, argv[++i]);
      }
    } else {
      a.positional.push_back(s);
    }
  }
  return a;
}

std::string human_bytes(double b) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return fmt::format("{:.2f} {}", b, units[u]);
}

ep::format::GgmlType parse_type(const std::string &name) {
  auto t = ep::format::ggml_type_by_name(name);
  if (!t) ep::fail(ep::Status::invalid_argument, "unknown ggml type '{}'", name);
  return t->type;
}

std::function<void(const ep::pack::BuildProgress &)> progress_printer(bool quiet) {
  if (quiet) return {};
  auto last = std::make_shared<Clock::time_point>(Clock::now());
  const bool tty = isatty(2);
  return [last, tty](const ep::pack::BuildProgress &p) {
    const auto now = Clock::now();
    const bool end = p.done_bytes == p.total_bytes;
    if (!end && now - *last < std::chrono::milliseconds(tty ? 250 : 5000)) return;
    *last = now;
    std::fprintf(stderr, "%s  %s / %s  %s/s  ETA %.0f s%s", tty ? "\r" : "", human_bytes(static_cast<double>(p.done_bytes)).c_str(),
                 human_bytes(static_cast<double>(p.total_bytes)).c_str(), human_bytes(p.rate_bytes_per_s).c_str(), p.eta_s,
                 tty && !end ? "   " : "\n");
  };
}

int cmd_build(const Args &a) {
  const std::string out = a.get("output");
  if (out.empty() || a.positional.empty()) ep::fail(ep::Status::invalid_argument, "build needs SRC... and -o PACK");
  ep::pack::BuildOptions opt;
  opt.alignment = static_cast<uint32_t>(a.get_u64("alignment", 4096));
  opt.progress = progress_printer(a.has("quiet"));
  const std::string stripe = a.get("stripe");
  for (size_t at = 0; at < stripe.size();) {
    const size_t comma = std::min(stripe.find(',', at), stripe.size());
    if (comma > at) opt.stripe_dirs.push_back(stripe.substr(at, comma - at));
    at = comma + 1;
  }
  if (!stripe.empty() && opt.stripe_dirs.size() < 2)
    ep::fail(ep::Status::invalid_argument, "--stripe needs at least two directories (comma-separated), got '{}'", stripe);
  const auto r = ep::pack::build_pack(a.positional, out, opt);
  fmt::print("built {}: {} layers x {} experts, {} file bytes, {} payload bytes in {:.3f} s ({:.1f} MiB/s), "
             "manifest {} (generation {})\n",
             r.pack_path, r.num_layers, r.num_experts, r.file_bytes, r.payload_bytes, r.seconds,
             r.payload_bytes_per_s / 1048576.0, r.manifest_path, r.generation);
  for (size_t k = 0; k < r.part_paths.size(); ++k) fmt::print("  part {}: {}\n", k, r.part_paths[k]);
  return 0;
}

int cmd_validate(const Args &a) {
  if (a.positional.size() != 1) ep::fail(ep::Status::invalid_argument, "validate needs one PACK");
  ep::pack::ValidateOptions opt;
  opt.full = a.has("full");
  opt.check_sources = !a.has("no-sources");
  const auto r = ep::pack::validate_pack(a.positional[0], opt);
  fmt::print("{}: OK ({} validation: {} objects, {} hashed; manifest {}; sources {}) in {:.3f} s\n", a.positional[0],
             opt.full ? "full" : "sampled", r.objects_hashed, human_bytes(static_cast<double>(r.bytes_hashed)),
             r.manifest_checked ? "checked" : "absent", r.sources_checked ? "checked" : "not checked", r.seconds);
  return 0;
}

int cmd_inspect(const Args &a) {
  if (a.positional.size() != 1) ep::fail(ep::Status::invalid_argument, "inspect needs one PACK");
  auto pack = ep::format::PackFile::open(a.positional[0], ep::format::ValidationLevel::structure);
  std::unique_ptr<ep::pack::Manifest> m;
  const std::string mp = ep::pack::manifest_path(a.positional[0]);
  if (fs::exists(mp)) m = std::make_unique<ep::pack::Manifest>(ep::pack::Manifest::load(mp));
  if (a.has("json")) {
    fmt::print("{}\n", ep::pack::inspect_json(*pack, m.get()).dump(2));
  } else {
    fmt::print("{}", ep::pack::inspect_text(*pack, m.get()));
  }
  return 0;
}

int cmd_gguf_info(const Args &a) {
  if (a.positional.size() != 1) ep::fail(ep::Status::invalid_argument, "gguf-info needs one FILE");
  const auto set = ep::format::GgufSet::open(a.positional[0]);
  const auto &f = set.first();
  fmt::print("{}: GGUF v{}, {} shard(s), {} tensors, alignment {}\n", f.path(), f.version(), set.shards().size(),
             set.tensor_count(), f.alignment());
  const size_t max_elems = a.has("all") ? SIZE_MAX : 8;
  for (const auto &[k, v] : f.metadata())
    fmt::print("  {:<48} {:<7} {}\n", k, ep::format::gguf_type_name(v.type), v.to_string(max_elems));
  for (const auto &shard : set.shards()) {
    if (set.shards().size() > 1) fmt::print("shard {} ({} bytes, data at {})\n", shard.path(), shard.file_size(), shard.data_offset());
    for (const auto &t : shard.tensors()) {
      std::string shape;
      for (uint32_t d = 0; d < t.n_dims; ++d) shape += (d ? ", " : "") + std::to_string(t.ne[d]);
      fmt::print("  {:<40} {:<8} [{}] at {} ({} bytes)\n", t.name, ep::format::ggml_type_info(static_cast<uint32_t>(t.type))->name,
                 shape, t.file_offset, t.nbytes);
    }
  }
  return 0;
}

ep::testkit::SyntheticSpec spec_from(const Args &a) {
  ep::testkit::SyntheticSpec s;
  s.arch = a.get("arch", "deepseek4");
  s.num_layers = static_cast<uint32_t>(a.get_u64("layers", 2));
  s.first_moe_layer = static_cast<uint32_t>(a.get_u64("first-moe", s.arch == "kimi-k3" ? 1 : 0));
  s.num_experts = static_cast<uint32_t>(a.get_u64("experts", 4));
  s.top_k = static_cast<uint32_t>(a.get_u64("top-k", 2));
  s.n_embd = a.get_u64("embd", 256);
  s.n_ff = a.get_u64("ff", 128);
  s.expert_type = parse_type(a.get("type", "mxfp4"));
  s.down_type = parse_type(a.get("down-type", a.get("type", "mxfp4")));
  s.seed = a.get_u64("seed", 1);
  s.n_shards = static_cast<uint32_t>(a.get_u64("shards", 1));
  s.small_extras = !a.has("no-extras");
  return s;
}

int cmd_synth(const Args &a) {
  const std::string out = a.get("output");
  if (out.empty()) ep::fail(ep::Status::invalid_argument, "synth needs -o PATH");
  const auto spec = spec_from(a);
  if (a.has("safetensors")) {
    const std::string l = a.get("safetensors");
    const auto layout = l == "fused" ? ep::testkit::StLayout::fused
                        : l == "w123" ? ep::testkit::StLayout::per_expert_w123
                                      : ep::testkit::StLayout::per_expert;
    fmt::print("{}\n", ep::testkit::write_synthetic_safetensors(spec, out, layout));
  } else {
    for (const auto &p : ep::testkit::write_synthetic_gguf(spec, out)) fmt::print("{}\n", p);
  }
  return 0;
}

void drop_caches(bool &dropped) {
  ::sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  if (f) {
    f << "3\n";
    f.flush();
    dropped = dropped && static_cast<bool>(f);
  } else {
    dropped = false;
  }
}

int cmd_bench(const Args &a) {
  const std::string dir = a.get("dir");
  if (dir.empty()) ep::fail(ep::Status::invalid_argument, "bench needs --dir DIR");
  fs::create_directories(dir);
  const double gib = static_cast<double>(a.get_u64("gb", 8));
  // DeepSeek-V4-Flash expert geometry: 4096 x 2048 MXFP4, 256 experts per layer (~13.4 MiB
  // per expert object, ~3.4 GiB per layer).
  ep::testkit::SyntheticSpec spec;
  spec.arch = "deepseek4";
  spec.n_embd = 4096;
  spec.n_ff = 2048;
  spec.num_experts = static_cast<uint32_t>(a.get_u64("experts", 256));
  spec.top_k = 6;
  spec.expert_type = spec.down_type = ep::format::GgmlType::mxfp4;
  const double layer_bytes = 3.0 * 4096 / 32 * 17 * 2048 * spec.num_experts;
  spec.num_layers = static_cast<uint32_t>(std::ceil(gib * 1073741824.0 / layer_bytes));
  spec.seed = 7;
  const std::string src = (fs::path(dir) / "bench-source.gguf").string();
  const std::string copy = (fs::path(dir) / "bench-copy.bin").string();
  const std::string pack = (fs::path(dir) / "bench.epk").string();
  fmt::print("bench: writing synthetic GGUF {} ({} layers x {} experts of 4096x2048 MXFP4)\n", src, spec.num_layers,
             spec.num_experts);
  auto t0 = Clock::now();
  ep::testkit::write_synthetic_gguf(spec, src);
  const uint64_t src_bytes = fs::file_size(src);
  fmt::print("bench: source {} bytes ({}) written in {:.1f} s\n", src_bytes, human_bytes(static_cast<double>(src_bytes)),
             std::chrono::duration<double>(Clock::now() - t0).count());
  bool dropped = true;
  drop_caches(dropped);
  // Raw sequential copy: read 16 MiB chunks, write them, fsync: the floor any builder pays.
  t0 = Clock::now();
  {
    ep::format::FileSource in(src);
    auto out = ep::format::create_output_file(copy);
    std::vector<uint8_t> buf(16u << 20);
    for (uint64_t off = 0; off < in.size();) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), in.size() - off));
      in.read(off, buf.data(), n);
      out->write(buf.data(), n);
      off += n;
    }
    out->sync();
  }
  const double copy_s = std::chrono::duration<double>(Clock::now() - t0).count();
  fs::remove(copy);
  drop_caches(dropped);
  ep::pack::BuildOptions opt;
  opt.progress = progress_printer(a.has("quiet"));
  const auto r = ep::pack::build_pack(std::vector<std::string>{src}, pack, opt);
  const double copy_rate = static_cast<double>(src_bytes) / copy_s;
  fmt::print("bench: page cache dropped between phases: {}\n", dropped ? "yes" : "no (not permitted)");
  fmt::print("bench: raw copy  {} in {:.2f} s = {:.1f} MiB/s\n", human_bytes(static_cast<double>(src_bytes)), copy_s,
             copy_rate / 1048576.0);
  fmt::print("bench: pack build {} payload in {:.2f} s = {:.1f} MiB/s (copy loop {:.2f} s)\n",
             human_bytes(static_cast<double>(r.payload_bytes)), r.seconds, r.payload_bytes_per_s / 1048576.0,
             r.copy_seconds);
  fmt::print("bench: pack/raw ratio {:.3f}\n", r.payload_bytes_per_s / copy_rate);
  if (!a.has("keep")) {
    fs::remove(src);
    fs::remove(pack);
    fs::remove(ep::pack::manifest_path(pack));
  }
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  try {
    if (cmd == "build") return cmd_build(parse_args(argc, argv, 2, {"quiet"}));
    if (cmd == "validate") return cmd_validate(parse_args(argc, argv, 2, {"full", "no-sources"}));
    if (cmd == "inspect") return cmd_inspect(parse_args(argc, argv, 2, {"json"}));
    if (cmd == "gguf-info") return cmd_gguf_info(parse_args(argc, argv, 2, {"all"}));
    if (cmd == "synth") return cmd_synth(parse_args(argc, argv, 2, {"no-extras"}));
    if (cmd == "bench") return cmd_bench(parse_args(argc, argv, 2, {"keep", "quiet"}));
    std::fprintf(stderr, "ep-pack: unknown command '%s'\n%s", cmd.c_str(), kUsage);
    return 2;
  } catch (const ep::Error &e) {
    std::fprintf(stderr, "ep-pack: %s: %s\n", ep::status_name(e.status()), e.what());
    return e.status() == ep::Status::invalid_argument ? 2 : 1;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "ep-pack: %s\n", e.what());
    return 1;
  }
}
