// The model-option flags that every program opening a model takes the same way (ep-run, ep-chat,
// ep-server): device, cache and host tier, pack placement or no pack, reads, overlap, prefetch,
// policy.
// Header-only on the public C API, so that the example hosts, which link only the shared
// library, share it with the tools.
//
//   ep::cli::ModelFlags flags;
//   for (int i = 1; i < argc; ++i) {
//     if (flags.take(argc, argv, i)) continue;   // throws ep::cli::FlagError on a bad value
//     ...the program's own flags...
//   }
//   ep_model_options mopt = flags.options();     // valid while flags lives
#pragma once

#include <expertpack/expertpack.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace ep::cli {

/// A model flag with a missing or bad value; what() names the flag and says what it takes.
class FlagError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The help text of the model flags, one flag per entry, aligned for a usage message.
inline const char *model_flags_usage() {
  return "  --device D         auto (default: the GPU when there is one), cpu, or cuda (an error without a GPU)\n"
         "  --cpu-threads N    threads of the CPU backend (default: EP_CPU_THREADS, else every core); results\n"
         "                     are identical for any N\n"
         "  --cache-mib MIB    expert cache budget, fractions allowed (default: every expert, at most half the\n"
         "                     physical memory; on CUDA at most the free GPU memory less 2 GiB)\n"
         "  --host-cache-mib MIB  a host-RAM tier below the expert cache (pinned with CUDA): evicted experts\n"
         "                     asked for twice are kept there and come back without a pack read (default: none)\n"
         "  --pack-dir DIR     where packs of sources live (default $XDG_CACHE_HOME/expertpack, else\n"
         "                     ~/.cache/expertpack)\n"
         "  --no-pack-build    never build a pack: a missing or stale one is an error\n"
         "  --no-pack          no pack: read the routed experts from the source files themselves, through the\n"
         "                     same cache, with a small index in the pack directory (NAME-HASH.epx and its\n"
         "                     manifest; built on first use by reading and hashing the experts, with progress);\n"
         "                     a source changed since is refused (remove the index to build it again). Not\n"
         "                     with an Expert Pack as --model, nor with --resident-experts\n"
         "  --resident-experts no pack: read every routed expert from the source into memory at open\n"
         "  --no-overlap       read a layer's missing experts before computing any (default: compute with the\n"
         "                     cached ones while they are read; the results are the same)\n"
         "  --prefetch         read the next layer's predicted experts into spare I/O capacity (default: off)\n"
         "  --policy NAME      expert cache policy: decay (default), decay-bypass, lru, sglang-lfu\n"
         "  --staging-slots N  staging slots for expert reads (default: automatic)\n"
         "  --queue-depth N    I/O queue depth (default: automatic)\n"
         "  --read-splits N    read each expert in N parts (default: automatic)\n"
         "  --direct-io 0|1    O_DIRECT reads on or off (default: automatic)\n";
}

/// Parses the model flags into an ep_model_options; owns the strings it points at.
class ModelFlags {
 public:
  ModelFlags() { ep_model_options_init(&options_); }
  ModelFlags(const ModelFlags &) = delete;
  ModelFlags &operator=(const ModelFlags &) = delete;

  /// When argv[i] is a model flag: consumes it and its value (advancing @p i) and returns true.
  /// Returns false for any other argument. Throws FlagError for a missing or bad value.
  bool take(int argc, char **argv, int &i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw FlagError("missing value after " + a);
      return argv[++i];
    };
    if (a == "--device") {
      const std::string d = value();
      if (d == "auto") options_.device = EP_DEVICE_AUTO;
      else if (d == "cpu") options_.device = EP_DEVICE_CPU;
      else if (d == "cuda") options_.device = EP_DEVICE_CUDA;
      else throw FlagError("--device must be auto, cpu or cuda, not '" + d + "'");
    } else if (a == "--cpu-threads") options_.cpu_threads = static_cast<int32_t>(count(a, value(), 0, 4096));
    else if (a == "--cache-mib") options_.cache_budget_bytes = mebibytes(a, value(), false);
    else if (a == "--host-cache-mib") options_.host_cache_bytes = mebibytes(a, value(), true);
    else if (a == "--pack-dir") pack_dir_ = value();
    else if (a == "--no-pack-build") options_.pack_build = 0;
    else if (a == "--no-pack") options_.no_pack = 1;
    else if (a == "--resident-experts") options_.resident_experts = 1;
    else if (a == "--no-overlap") options_.overlap_reads = 0;
    else if (a == "--prefetch") options_.prefetch = 1;
    else if (a == "--policy") policy_ = value();
    else if (a == "--staging-slots") options_.staging_slots = static_cast<uint32_t>(count(a, value(), 0, 1u << 20));
    else if (a == "--queue-depth") options_.queue_depth = static_cast<uint32_t>(count(a, value(), 0, 1u << 16));
    else if (a == "--read-splits") options_.read_splits = static_cast<uint32_t>(count(a, value(), 0, 1u << 10));
    else if (a == "--direct-io") options_.direct_io = static_cast<int32_t>(count(a, value(), 0, 1));
    else return false;
    return true;
  }

  /// The options with the string fields pointing at this object's copies: valid while it lives
  /// and no further take() changes them. progress/progress_payload are the caller's to set.
  ep_model_options options() const {
    ep_model_options o = options_;
    o.pack_dir = pack_dir_.empty() ? nullptr : pack_dir_.c_str();
    o.cache_policy = policy_.empty() ? nullptr : policy_.c_str();
    return o;
  }

 private:
  /// A whole number in [lo, hi].
  static uint64_t count(const std::string &flag, const std::string &text, uint64_t lo, uint64_t hi) {
    errno = 0;
    char *end = nullptr;
    const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
    if (text.empty() || text[0] == '-' || *end != '\0' || errno == ERANGE || v < lo || v > hi)
      throw FlagError(flag + " takes a whole number from " + std::to_string(lo) + " to " + std::to_string(hi) +
                      ", not '" + text + "'");
    return v;
  }
  /// MiB (fractions allowed) as bytes: positive, or also zero when @p zero_ok.
  static uint64_t mebibytes(const std::string &flag, const std::string &text, bool zero_ok) {
    char *end = nullptr;
    const double mib = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0' || !std::isfinite(mib) || mib < 0 || (!zero_ok && !(mib > 0)) || mib > 1e12)
      throw FlagError(flag + " takes " + (zero_ok ? "a size in MiB (0 or more)" : "a positive size in MiB") +
                      ", not '" + text + "'");
    return static_cast<uint64_t>(mib * 1048576.0);
  }

  ep_model_options options_;
  std::string pack_dir_, policy_;
};

}  // namespace ep::cli
