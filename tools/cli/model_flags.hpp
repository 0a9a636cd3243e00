// The model-option flags that every program opening a model takes the same way (ep-run, ep-chat,
// ep-server): one row per ep_model_options field in kModelFlags (the flag is the field's name, with
// a unit where the flag takes MiB and `--no-` where it turns a default-on field off), parsed into
// the C struct; the library validates the values (ep_model_open), the flags only their syntax.
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

/// What the model flags fill: the C options and the strings their `const char *` fields point at.
struct ModelFlagValues {
  ep_model_options options;
  std::string pack_dir, cache_policy, devices;
};

/// One model flag: one row of kModelFlags.
struct ModelFlag {
  const char *name;   ///< "--cache-mib"
  const char *value;  ///< what it takes, for the usage ("MIB"); "" for a switch
  const char *field;  ///< the ep_model_options field it sets
  const char *help;   ///< one line per '\n'; "" for an older spelling kept working (not listed)
  /// Stores @p value (empty for a switch) into @p v; throws FlagError naming @p flag on a bad value.
  void (*set)(ModelFlagValues &v, const std::string &flag, const std::string &value);
};

namespace detail {
/// A whole number in [lo, hi] (the flag's syntax; the library checks the option's range).
inline uint64_t count(const std::string &flag, const std::string &text, uint64_t lo, uint64_t hi) {
  errno = 0;
  char *end = nullptr;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || text[0] == '-' || *end != '\0' || errno == ERANGE || v < lo || v > hi)
    throw FlagError(flag + " takes a whole number from " + std::to_string(lo) + " to " + std::to_string(hi) + ", not '" +
                    text + "'");
  return v;
}
/// MiB (fractions allowed) as bytes, 0 or more: 0 is the option's own 0 (model.h).
inline uint64_t mebibytes(const std::string &flag, const std::string &text) {
  char *end = nullptr;
  const double mib = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(mib) || mib < 0 || mib > 1e12)
    throw FlagError(flag + " takes a size in MiB (0 or more), not '" + text + "'");
  return static_cast<uint64_t>(mib * 1048576.0);
}
/// A whole number that fits the option's int32_t field, any sign: its range is the library's to
/// check (ep_model_open names the field, the value and the range).
inline int32_t int32(const std::string &flag, const std::string &text) {
  errno = 0;
  char *end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE || v < INT32_MIN || v > INT32_MAX)
    throw FlagError(flag + " takes a whole number, not '" + text + "'");
  return static_cast<int32_t>(v);
}
}  // namespace detail

/// Every model flag, one row each: adding an ep_model_options field adds its row here. The
/// defaults are the library's (ep_model_options_init); a flag only changes its field.
inline const ModelFlag kModelFlags[] = {
    {"--device", "D", "device", "auto (default: the GPU when there is one), cpu, or cuda (an error without a GPU)",
     [](ModelFlagValues &v, const std::string &flag, const std::string &d) {
       if (d == "auto") v.options.device = EP_DEVICE_AUTO;
       else if (d == "cpu") v.options.device = EP_DEVICE_CPU;
       else if (d == "cuda") v.options.device = EP_DEVICE_CUDA;
       else throw FlagError(flag + " must be auto, cpu or cuda, not '" + d + "'");
     }},
    {"--device-index", "N", "device_index", "the CUDA device's ordinal (default: 0)",
     [](ModelFlagValues &v, const std::string &flag, const std::string &n) {
       v.options.device_index = detail::int32(flag, n);
     }},
    {"--devices", "LIST", "devices",
     "several devices of one kind: cuda:0,cuda:1 (the experts spread over them, their\ncaches each --cache-mib), or "
     "cpu,cpu; not with --device or --device-index",
     [](ModelFlagValues &v, const std::string &, const std::string &list) { v.devices = list; }},
    {"--cpu-threads", "N", "cpu_threads",
     "threads of the CPU backend, 0 .. 4096 (default 0: EP_CPU_THREADS, else every core);\nresults are identical for any N",
     [](ModelFlagValues &v, const std::string &flag, const std::string &n) {
       v.options.cpu_threads = detail::int32(flag, n);
     }},
    {"--cache-mib", "MIB", "cache_budget_bytes",
     "expert cache budget, fractions allowed (default 0: every expert, at most half the\nphysical memory; on CUDA at "
     "most the free GPU memory less 2 GiB and --kv-mib, or a quarter of it without --kv-mib)",
     [](ModelFlagValues &v, const std::string &flag, const std::string &mib) {
       v.options.cache_budget_bytes = detail::mebibytes(flag, mib);
     }},
    {"--kv-mib", "MIB", "kv_budget_bytes",
     "what all sessions' decode state (KV) may take together, fractions allowed; past it\nan append fails (default 0: the "
     "free GPU memory after the weights and the expert\ncache less 1 GiB, at least a quarter of it less 1 GiB beside a "
     "cache of every\nexpert; on the CPU a quarter of the physical memory)",
     [](ModelFlagValues &v, const std::string &flag, const std::string &mib) {
       v.options.kv_budget_bytes = detail::mebibytes(flag, mib);
     }},
    {"--host-cache-mib", "MIB", "host_cache_bytes",
     "a host-RAM tier below the expert cache (pinned with CUDA): evicted experts\nasked for twice are kept there and "
     "come back without a pack read (default 0: none)",
     [](ModelFlagValues &v, const std::string &flag, const std::string &mib) {
       v.options.host_cache_bytes = detail::mebibytes(flag, mib);
     }},
    {"--pack-dir", "DIR", "pack_dir",
     "where packs of sources live (default $XDG_CACHE_HOME/expertpack, else\n~/.cache/expertpack)",
     [](ModelFlagValues &v, const std::string &, const std::string &dir) { v.pack_dir = dir; }},
    {"--no-pack-build", "", "pack_build", "never build a pack: a missing or stale one is an error",
     [](ModelFlagValues &v, const std::string &, const std::string &) { v.options.pack_build = 0; }},
    {"--no-pack", "", "no_pack",
     "no pack: read the routed experts from the source files themselves, through the\nsame cache, with a small index "
     "in the pack directory (NAME-HASH.epx and its\nmanifest; built on first use by reading and hashing the experts, "
     "with progress);\na source changed since is refused (remove the index to build it again). Not\nwith an Expert "
     "Pack as --model, nor with --resident-experts",
     [](ModelFlagValues &v, const std::string &, const std::string &) { v.options.no_pack = 1; }},
    {"--resident-experts", "", "resident_experts", "no pack: read every routed expert from the source into memory at open",
     [](ModelFlagValues &v, const std::string &, const std::string &) { v.options.resident_experts = 1; }},
    {"--no-overlap-reads", "", "overlap_reads",
     "read a layer's missing experts before computing any (default: compute with the\ncached ones while they are read; "
     "the results are the same)",
     [](ModelFlagValues &v, const std::string &, const std::string &) { v.options.overlap_reads = 0; }},
    {"--no-overlap", "", "overlap_reads", "",
     [](ModelFlagValues &v, const std::string &, const std::string &) { v.options.overlap_reads = 0; }},
    {"--prefetch", "", "prefetch", "read the next layer's predicted experts into spare I/O capacity (default: off)",
     [](ModelFlagValues &v, const std::string &, const std::string &) { v.options.prefetch = 1; }},
    {"--cache-policy", "NAME", "cache_policy", "expert cache policy: decay (default), decay-bypass, lru, sglang-lfu",
     [](ModelFlagValues &v, const std::string &, const std::string &name) { v.cache_policy = name; }},
    {"--policy", "NAME", "cache_policy", "",
     [](ModelFlagValues &v, const std::string &, const std::string &name) { v.cache_policy = name; }},
    {"--staging-slots", "N", "staging_slots", "staging slots for expert reads (default 0: automatic)",
     [](ModelFlagValues &v, const std::string &flag, const std::string &n) {
       v.options.staging_slots = static_cast<uint32_t>(detail::count(flag, n, 0, 1u << 20));
     }},
    {"--queue-depth", "N", "queue_depth", "I/O queue depth (default 0: automatic)",
     [](ModelFlagValues &v, const std::string &flag, const std::string &n) {
       v.options.queue_depth = static_cast<uint32_t>(detail::count(flag, n, 0, 1u << 16));
     }},
    {"--read-splits", "N", "read_splits", "read each expert in N parts (default 0: automatic)",
     [](ModelFlagValues &v, const std::string &flag, const std::string &n) {
       v.options.read_splits = static_cast<uint32_t>(detail::count(flag, n, 0, 1u << 10));
     }},
    {"--direct-io", "0|1", "direct_io", "O_DIRECT reads on or off (default: automatic)",
     [](ModelFlagValues &v, const std::string &flag, const std::string &n) {
       v.options.direct_io = static_cast<int32_t>(detail::count(flag, n, 0, 1));
     }},
};

/// The help text of the model flags, one flag per entry, aligned for a usage message (made from
/// kModelFlags; older spellings are not listed).
inline const char *model_flags_usage() {
  static const std::string text = [] {
    constexpr size_t kColumn = 21;
    std::string out;
    for (const ModelFlag &f : kModelFlags) {
      if (*f.help == '\0') continue;
      std::string head = std::string("  ") + f.name + (*f.value ? std::string(" ") + f.value : std::string());
      head += head.size() + 1 <= kColumn ? std::string(kColumn - head.size(), ' ') : std::string(" ");
      out += head;
      for (const char *c = f.help; *c; ++c) {
        out += *c;
        if (*c == '\n') out += std::string(kColumn, ' ');
      }
      out += '\n';
    }
    return out;
  }();
  return text.c_str();
}

/// Parses the model flags into an ep_model_options; owns the strings it points at.
class ModelFlags {
 public:
  ModelFlags() { ep_model_options_init(&values_.options); }
  ModelFlags(const ModelFlags &) = delete;
  ModelFlags &operator=(const ModelFlags &) = delete;

  /// When argv[i] is a model flag: consumes it and its value (advancing @p i) and returns true.
  /// Returns false for any other argument. Throws FlagError for a missing or bad value.
  bool take(int argc, char **argv, int &i) {
    const std::string a = argv[i];
    for (const ModelFlag &f : kModelFlags) {
      if (a != f.name) continue;
      std::string value;
      if (*f.value) {
        if (i + 1 >= argc) throw FlagError("missing value after " + a);
        value = argv[++i];
      }
      f.set(values_, a, value);
      return true;
    }
    return false;
  }

  /// The options with the string fields pointing at this object's copies: valid while it lives
  /// and no further take() changes them. progress/progress_payload are the caller's to set.
  ep_model_options options() const {
    ep_model_options o = values_.options;
    o.pack_dir = values_.pack_dir.empty() ? nullptr : values_.pack_dir.c_str();
    o.cache_policy = values_.cache_policy.empty() ? nullptr : values_.cache_policy.c_str();
    o.devices = values_.devices.empty() ? nullptr : values_.devices.c_str();
    return o;
  }

 private:
  ModelFlagValues values_;
};

}  // namespace ep::cli
