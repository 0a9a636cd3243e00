// Catch2's runner, compiled once for the CPU and the GPU test mains. With Catch2 v2 this is also its
// implementation (the single header compiled with CATCH_CONFIG_RUNNER: everything but a main),
// which each main compiled before; Catch2 v3 ships it as a library.
#if defined(EP_CATCH_V3)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include "support/catch.hpp"
#endif

#include "support/catch_session.hpp"

int ep::test::run_catch(int argc, char **argv) { return Catch::Session().run(argc, argv); }
