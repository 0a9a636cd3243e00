// The test runner's main for every CPU test executable (Catch2 v2 and v3).
#define CATCH_CONFIG_RUNNER  // Catch2 v2: we provide main()
#include "support/catch.hpp"

int main(int argc, char **argv) { return Catch::Session().run(argc, argv); }
