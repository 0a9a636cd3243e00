// How much host memory a process may still take: the kernel's MemAvailable, less what the
// cgroup v2 limits of the process's group and its ancestors leave (memory.max − memory.current).
// The host-RAM tier is sized against it, so an oversized tier fails at open with the numbers
// instead of being killed by the OOM killer at the first demotion.
#pragma once

#include <cstdint>
#include <string>

namespace ep::store {

struct HostMemory {
  uint64_t mem_available_bytes = UINT64_MAX;  ///< /proc/meminfo MemAvailable (UINT64_MAX: unknown)
  uint64_t cgroup_room_bytes = UINT64_MAX;    ///< min over the cgroup and its ancestors of max − current (UINT64_MAX: no limit)
  std::string cgroup;                         ///< the limiting cgroup's path ("" when none limits)
  uint64_t available() const { return mem_available_bytes < cgroup_room_bytes ? mem_available_bytes : cgroup_room_bytes; }
  /// "MemAvailable N bytes; cgroup /x: memory.max − memory.current = M bytes" (what is known).
  std::string describe() const;
};

/// Reads /proc/meminfo and /proc/self/cgroup with /sys/fs/cgroup (missing files: unknown).
HostMemory host_memory();

}  // namespace ep::store
