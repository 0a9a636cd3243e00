#include <expertpack/expertpack.h>

#include "core/log.hpp"
#include "expertpack/build_config.h"
#include "support/catch.hpp"

#include <string>
#include <thread>

TEST_CASE("the header's version equals the library's version and the build's", "[capi]") {
  CHECK(ep_version_number() == EP_VERSION_NUMBER);
  CHECK(EP_VERSION_MAJOR == EP_BUILD_VERSION_MAJOR);
  CHECK(EP_VERSION_MINOR == EP_BUILD_VERSION_MINOR);
  CHECK(EP_VERSION_PATCH == EP_BUILD_VERSION_PATCH);
  CHECK(std::string(ep_version_string()) == EP_BUILD_VERSION);
}

TEST_CASE("status strings", "[capi]") {
  CHECK(std::string(ep_status_str(EP_OK)) == "EP_OK");
  CHECK(std::string(ep_status_str(EP_ERR_CORRUPT)) == "EP_ERR_CORRUPT");
  CHECK(std::string(ep_status_str(static_cast<ep_status>(-999))) == "unknown status");
}

TEST_CASE("ep_last_error is per thread and names the bad argument", "[capi]") {
  REQUIRE(ep_log_configure(nullptr) == EP_ERR_INVALID_ARGUMENT);
  const std::string here = ep_last_error();
  CHECK(here.find("ep_log_configure") != std::string::npos);
  CHECK(here.find("'options'") != std::string::npos);
  std::string there = "unset";
  std::thread([&] { there = ep_last_error(); }).join();
  CHECK(there.empty());
  CHECK(std::string(ep_last_error()) == here);
}

TEST_CASE("options structs: struct_size is checked", "[capi]") {
  ep_log_options options;
  ep_log_options_init(&options);
  CHECK(options.struct_size == sizeof(ep_log_options));
  CHECK(options.callback == nullptr);
  options.struct_size = 4;
  CHECK(ep_log_configure(&options) == EP_ERR_STRUCT_SIZE);
  CHECK(std::string(ep_last_error()).find("ep_log_options.struct_size is 4") != std::string::npos);
  options.struct_size = sizeof(ep_log_options) + 8;
  CHECK(ep_log_configure(&options) == EP_ERR_STRUCT_SIZE);
  ep_log_options_init(&options);
  options.min_level = static_cast<ep_log_level>(42);
  CHECK(ep_log_configure(&options) == EP_ERR_INVALID_ARGUMENT);
}

namespace {
void count_calls(ep_log_level, const char *, void *payload) { ++*static_cast<int *>(payload); }
}  // namespace

TEST_CASE("log configuration through the C API reaches the callback", "[capi]") {
  int calls = 0;
  ep_log_options options;
  ep_log_options_init(&options);
  options.min_level = EP_LOG_INFO;
  options.callback = count_calls;
  options.payload = &calls;
  REQUIRE(ep_log_configure(&options) == EP_OK);
  ep::log::info("one");
  ep::log::debug("dropped: below the level");
  CHECK(calls == 1);
  REQUIRE(ep_set_log_level(EP_LOG_DEBUG) == EP_OK);  // keeps the callback
  ep::log::debug("two");
  CHECK(calls == 2);
  ep_set_log_callback(nullptr, nullptr);  // back to stderr, level kept
  ep::log::trace("not delivered to the callback");
  CHECK(calls == 2);
  ep_log_options_init(&options);
  REQUIRE(ep_log_configure(&options) == EP_OK);
}

TEST_CASE("device count never fails; without a device it says why", "[capi]") {
  int32_t devices = -1;
  REQUIRE(ep_cuda_device_count(&devices) == EP_OK);
  CHECK(devices >= 0);
  if (devices == 0) CHECK(std::string(ep_last_error()).find("CUDA") != std::string::npos);
  CHECK(ep_cuda_device_count(nullptr) == EP_ERR_INVALID_ARGUMENT);
}

TEST_CASE("build features reflect the build", "[capi]") {
  const uint32_t features = ep_build_features();
#ifdef EP_HAVE_CUDA
  CHECK((features & EP_FEATURE_CUDA) != 0);
#else
  CHECK((features & EP_FEATURE_CUDA) == 0);
#endif
#ifdef EP_HAVE_URING
  CHECK((features & EP_FEATURE_IO_URING) != 0);
#else
  CHECK((features & EP_FEATURE_IO_URING) == 0);
#endif
}
