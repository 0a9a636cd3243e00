// Device discovery. Safe to call without a driver: reports 0 devices and why.
#pragma once

#include <cstdint>
#include <string>

namespace ep::gpu {

/// Number of usable CUDA devices; 0 without a driver or device, with the reason in @p why.
int device_count(std::string *why);

/// Free memory of device @p index now (cudaMemGetInfo), in bytes.
uint64_t free_memory_bytes(int index);
/// Lets device @p from read and write device @p to's memory directly (peer copies over NVLink or
/// PCIe without a host bounce) when the hardware can; false when it cannot (peer copies still
/// work, through the host). Enabling it twice is not an error.
bool enable_peer_access(int from, int to);

/// One line describing device @p index (name, compute capability, memory, SMs).
std::string describe_device(int index);

}  // namespace ep::gpu
