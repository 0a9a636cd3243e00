#include "store/store_settings.hpp"

#include "store/expert_store.hpp"

#include <unistd.h>

namespace ep::store {

std::unique_ptr<StoreDevice> configure_store(const StoreSettings &settings, int cuda_device, void *cuda_stream,
                                             uint64_t cuda_reserve_bytes, StoreOptions &options) {
  const bool all = settings.cache_budget_bytes == 0;
  options.cache_bytes = settings.cache_budget_bytes;
  options.policy = settings.cache_policy;
  options.host_cache_bytes = settings.host_cache_bytes;
  options.prefetch = settings.prefetch;
  if (settings.staging_slots) options.staging_slots = settings.staging_slots;
  if (settings.queue_depth) options.reader.queue_depth = settings.queue_depth;
  if (settings.read_splits) options.reader.read_splits = settings.read_splits;
  options.reader.direct = settings.direct_io < 0 ? io::DirectMode::automatic
                          : settings.direct_io   ? io::DirectMode::direct
                                                 : io::DirectMode::buffered;
  options.reserve_bytes = 0;
  if (cuda_device >= 0) {
    if (all) options.reserve_bytes = cuda_reserve_bytes;
    return make_cuda_device(cuda_device, cuda_stream);
  }
  // A full-size model's experts do not fit in RAM: "every expert" means at most half of it.
  HostDevice::Options host;
  if (all) {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && page > 0) host.free_bytes = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / 2;
  }
  return std::make_unique<HostDevice>(host);
}

}  // namespace ep::store
