// Shared by the ep-bench subcommands: argument parsing and the pack to read (a given pack, a
// synthetic pack, or one created with --create-size).
#pragma once

#include "store/object_map.hpp"

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ep::bench {

struct Args {
  std::map<std::string, std::string> options;  // --name value
  std::vector<std::string> flags;              // --name
  bool has(const std::string &flag) const;
  std::string get(const std::string &name, const std::string &fallback) const;
  double number(const std::string &name, double fallback) const;
};

/// Parses argv[start..]; names in @p flags take no value.
Args parse_args(int argc, char **argv, int start, const std::vector<std::string> &flags);

struct PackSource {
  std::string path;
  /// The files the objects lie in (ObjectMap::object_file() indexes them): a striped pack's
  /// parts, else {path}.
  std::vector<std::string> files;
  std::shared_ptr<const store::ObjectMap> layout;
  std::string kind;  ///< "expert-pack", "synthetic", "raw" (--object-bytes over a plain file)
};

/// --pack PATH (an Expert Pack, a synthetic pack, or any file with --object-bytes [--data-start]) or
/// --create-size SIZE [--create-path PATH] [--object-bytes N] [--experts N].
PackSource pack_from_args(const Args &args);

/// DeepSeek-V4-Flash's routed expert: gate+up+down FP4 with UE8M0 scales (3 x 4456448 B).
inline constexpr uint64_t kDefaultObjectBytes = 13369344;

/// The disk's raw random-read bandwidth (GB/s) over @p src's objects: @p depth O_DIRECT reads of
/// @p block bytes in flight for @p seconds (io_uring with fixed file and buffer, else pread threads).
double raw_loop_gbps(const PackSource &src, uint64_t block, uint32_t depth, double seconds);

/// Runs a shell command and returns its stdout (empty on failure); @p rc gets the exit status.
std::string run_command(const std::string &command, int &rc);

}  // namespace ep::bench
