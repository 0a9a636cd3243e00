// How much host memory a process may still take: the kernel's MemAvailable, less what the
// cgroup v2 limits of the process's group and its ancestors leave: memory.max − memory.current,
// plus the group's page cache (memory.stat active_file + inactive_file), which the kernel
// reclaims before it would refuse an allocation (a model's weights read through the page cache
// are charged to the group but do not stand in the way of pinning a host tier).
// The host-RAM tier is sized against it, so an oversized tier fails at open with the numbers
// instead of being killed by the OOM killer at the first demotion.
#pragma once

#include <cstdint>
#include <string>

namespace ep::store {

struct HostMemory {
  uint64_t mem_available_bytes = UINT64_MAX;  ///< /proc/meminfo MemAvailable (UINT64_MAX: unknown)
  /// min over the cgroup and its ancestors of max − current + page cache (UINT64_MAX: no limit)
  uint64_t cgroup_room_bytes = UINT64_MAX;
  uint64_t cgroup_file_bytes = 0;             ///< the limiting cgroup's page cache, counted as room
  std::string cgroup;                         ///< the limiting cgroup's path ("" when none limits)
  uint64_t available() const { return mem_available_bytes < cgroup_room_bytes ? mem_available_bytes : cgroup_room_bytes; }
  /// "MemAvailable N bytes; cgroup /x: memory.max - memory.current + page cache F = M bytes"
  /// (what is known).
  std::string describe() const;
};

/// Reads /proc/meminfo and /proc/self/cgroup with /sys/fs/cgroup (missing files: unknown).
HostMemory host_memory();

/// The cgroup part of host_memory(): walks from @p group up to @p root (a cgroup v2 tree) and
/// fills cgroup_room_bytes, cgroup_file_bytes and cgroup of @p m from each level's memory.max,
/// memory.current and memory.stat.
void apply_cgroup_limits(HostMemory &m, const std::string &root, const std::string &group);

}  // namespace ep::store
