// ep-bench h2d: the store's staging → VRAM copy path (pinned staging ring, transfer stream,
// per-slot ready events, staging reuse after its copy event) against plain pinned
// cudaMemcpyAsync of the same objects on one stream.
#include "bench_common.hpp"

#include "core/error.hpp"
#include "io/file.hpp"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>

#ifdef EP_HAVE_CUDA
#include "gpu/check.hpp"
#include "store/device.hpp"

#include <cuda_runtime.h>
#endif

namespace ep::bench {

int cmd_h2d(const Args &args) {
#ifndef EP_HAVE_CUDA
  (void)args;
  std::fprintf(stderr, "ep-bench h2d: this build has no CUDA backend (EP_WITH_CUDA=OFF)\n");
  return 2;
#else
  using Clock = std::chrono::steady_clock;
  uint64_t object_bytes = static_cast<uint64_t>(args.number("object-bytes", kDefaultObjectBytes));
  std::string source = "default object size";
  if (args.options.count("pack") || args.options.count("create-size")) {
    const PackSource src = pack_from_args(args);
    object_bytes = src.layout->max_object_bytes();
    source = src.path;
  }
  const uint64_t slot_bytes = io::align_up(object_bytes, io::kDirectAlignment);
  const auto slots = static_cast<uint32_t>(args.number("slots", 64));
  const auto staging = static_cast<uint32_t>(args.number("staging", 16));
  const uint64_t total = static_cast<uint64_t>(args.number("bytes", 16.0 * (1ull << 30)));
  const uint64_t copies = std::max<uint64_t>(1, total / object_bytes);

  // Plain pinned copies.
  void *host = nullptr, *dev = nullptr;
  cudaStream_t stream = nullptr;
  EP_CUDA_CHECK(cudaSetDevice(0));
  EP_CUDA_CHECK(cudaHostAlloc(&host, staging * slot_bytes, cudaHostAllocPortable));
  EP_CUDA_CHECK(cudaMalloc(&dev, slots * slot_bytes));
  EP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::memset(host, 0x5A, staging * slot_bytes);
  auto plain = [&] {
    for (uint64_t i = 0; i < copies; ++i)
      EP_CUDA_CHECK(cudaMemcpyAsync(static_cast<char *>(dev) + (i % slots) * slot_bytes,
                                    static_cast<char *>(host) + (i % staging) * slot_bytes, object_bytes,
                                    cudaMemcpyHostToDevice, stream));
    EP_CUDA_CHECK(cudaStreamSynchronize(stream));
  };
  plain();  // warm-up
  auto t0 = Clock::now();
  plain();
  const double plain_s = std::chrono::duration<double>(Clock::now() - t0).count();
  EP_CUDA_CHECK(cudaStreamDestroy(stream));
  EP_CUDA_CHECK(cudaFree(dev));
  EP_CUDA_CHECK(cudaFreeHost(host));

  // The store's device path.
  auto device = store::make_cuda_device(0, nullptr);
  store::DeviceShape shape;
  shape.num_slots = slots;
  shape.slot_bytes = slot_bytes;
  shape.staging_slots = staging;
  shape.staging_slot_bytes = slot_bytes;
  shape.tables = 1;
  shape.table_entries = 1;
  device->allocate(shape);
  std::memset(device->staging_base(), 0x5A, staging * slot_bytes);
  auto through_store = [&] {
    for (uint64_t i = 0; i < copies; ++i) {
      const auto st = static_cast<uint32_t>(i % staging);
      device->wait_staging(st);  // as the store does before reading into a staging slot again
      const ep::store::CopySegment whole{0, 0, object_bytes};
      device->copy_to_slot(static_cast<uint32_t>(i % slots), st, {&whole, 1});
    }
    device->synchronize();
  };
  through_store();
  t0 = Clock::now();
  through_store();
  const double store_s = std::chrono::duration<double>(Clock::now() - t0).count();

  const double bytes = static_cast<double>(copies * object_bytes);
  const double raw = bytes / plain_s / 1e9, engine = bytes / store_s / 1e9;
  if (args.has("json")) {
    nlohmann::ordered_json j;
    j["bench"] = "h2d";
    j["object_bytes"] = object_bytes;
    j["source"] = source;
    j["copies"] = copies;
    j["staging_slots"] = staging;
    j["raw_gbps"] = raw;
    j["engine_gbps"] = engine;
    j["ratio"] = engine / raw;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%llu copies of %llu B (%s), %u staging slots\n", static_cast<unsigned long long>(copies),
                static_cast<unsigned long long>(object_bytes), source.c_str(), staging);
    std::printf("plain pinned cudaMemcpyAsync: %.2f GB/s\n", raw);
    std::printf("store staging -> slot path:   %.2f GB/s\n", engine);
    std::printf("ratio store/plain: %.3f (target >= 0.90)\n", engine / raw);
  }
  return 0;
#endif
}

}  // namespace ep::bench
