#include "store/host_memory.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace ep::store {
namespace {

/// The first number of a one-line cgroup file ("max" or missing: UINT64_MAX).
uint64_t read_limit(const std::filesystem::path &file) {
  std::ifstream f(file);
  std::string word;
  if (!(f >> word) || word == "max") return UINT64_MAX;
  try {
    return std::stoull(word);
  } catch (const std::exception &) {
    return UINT64_MAX;
  }
}

/// active_file + inactive_file of a memory.stat file (0 when missing).
uint64_t read_page_cache(const std::filesystem::path &file) {
  std::ifstream f(file);
  std::string key;
  uint64_t value = 0, sum = 0;
  while (f >> key >> value)
    if (key == "active_file" || key == "inactive_file") sum += value;
  return sum;
}

}  // namespace

std::string HostMemory::describe() const {
  std::string s = mem_available_bytes == UINT64_MAX ? std::string("MemAvailable unknown")
                                                    : fmt::format("MemAvailable {} bytes", mem_available_bytes);
  if (cgroup_room_bytes != UINT64_MAX)
    s += fmt::format("; cgroup {}: memory.max - memory.current + page cache {} = {} bytes", cgroup, cgroup_file_bytes,
                     cgroup_room_bytes);
  return s;
}

HostMemory host_memory() {
  HostMemory m;
  {
    std::ifstream f("/proc/meminfo");
    std::string line;
    while (std::getline(f, line)) {
      std::istringstream ls(line);
      std::string key;
      uint64_t kib = 0;
      if (ls >> key >> kib && key == "MemAvailable:") {
        m.mem_available_bytes = kib * 1024;
        break;
      }
    }
  }
  // cgroup v2: the "0::/path" line; every ancestor's limit applies too.
  std::ifstream f("/proc/self/cgroup");
  std::string line, rel;
  while (std::getline(f, line))
    if (line.rfind("0::", 0) == 0) rel = line.substr(3);
  if (!rel.empty()) apply_cgroup_limits(m, "/sys/fs/cgroup", rel);
  return m;
}

void apply_cgroup_limits(HostMemory &m, const std::string &root_dir, const std::string &group) {
  const std::filesystem::path root = root_dir;
  std::filesystem::path dir = root / std::filesystem::path(group).relative_path();
  for (;;) {
    const uint64_t max = read_limit(dir / "memory.max");
    if (max != UINT64_MAX) {
      const uint64_t current = read_limit(dir / "memory.current");
      const uint64_t cache = read_page_cache(dir / "memory.stat");
      const uint64_t held = current == UINT64_MAX ? max : current - std::min(current, cache);
      const uint64_t room = held >= max ? 0 : max - held;
      if (room < m.cgroup_room_bytes) {
        m.cgroup_room_bytes = room;
        m.cgroup_file_bytes = current == UINT64_MAX ? 0 : std::min(current, cache);
        m.cgroup = dir.string();
      }
    }
    if (dir == root || !dir.has_parent_path() || dir.parent_path() == dir) break;
    dir = dir.parent_path();
    if (dir.string().size() < root.string().size()) break;
  }
}

}  // namespace ep::store
