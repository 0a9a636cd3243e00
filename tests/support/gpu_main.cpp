// The main of every GPU test executable. Without a usable device it prints why and exits 77,
// which CTest reports as "Skipped" (never "Passed"). With EP_REQUIRE_GPU=1 (set by
// scripts/dev/gpu-check) a missing device is a failure instead.
#include <expertpack/expertpack.h>

#include "support/catch_session.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>

int main(int argc, char **argv) {
  // Listing the test cases (--list-tests, --list-test-names-only, ...) needs no device.
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--list", 6) == 0) return ep::test::run_catch(argc, argv);
  int32_t devices = 0;
  if (ep_cuda_device_count(&devices) != EP_OK || devices == 0) {
    const char *require = std::getenv("EP_REQUIRE_GPU");
    const bool required = require && std::strcmp(require, "1") == 0;
    std::printf("%s: %s\n", required ? "FAIL" : "SKIP", ep_last_error());
    return required ? 1 : 77;
  }
  return ep::test::run_catch(argc, argv);
}
