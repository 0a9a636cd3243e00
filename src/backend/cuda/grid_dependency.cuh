// Programmatic dependent launch from device code (sm_90+): the two PTX instructions of a kernel
// launched with cudaLaunchAttributeProgrammaticStreamSerialization — the stream decode GEMV
// kernel (gemv_stream.cu). Below sm_90
// both are no-ops (the launchers set the attribute only there).
#pragma once

namespace ep::backend::cuda {

/// Waits until the grid this one was launched after has completed and its memory writes are
/// visible (griddepcontrol.wait): read the previous kernel's output only after it.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

/// Lets the next grid on the stream start its blocks (griddepcontrol.launch_dependents); they run
/// up to their own grid_dependency_wait().
__device__ __forceinline__ void grid_dependents_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

}  // namespace ep::backend::cuda
