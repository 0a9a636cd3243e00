// Device discovery. Safe to call without a driver: reports 0 devices and why.
#pragma once

#include <string>

namespace ep::gpu {

/// Number of usable CUDA devices; 0 without a driver or device, with the reason in @p why.
int device_count(std::string *why);

/// One line describing device @p index (name, compute capability, memory, SMs).
std::string describe_device(int index);

}  // namespace ep::gpu
