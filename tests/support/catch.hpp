// Catch2 v2 (Debian 12) and v3 (Ubuntu 24.04) behind one include. CMake defines
// EP_CATCH_V3 from the version find_package(Catch2) found, so headers and library always match
// (a machine can have both installed).
#pragma once
#if defined(EP_CATCH_V3)
#include <catch2/catch_all.hpp>
#else
#include <catch2/catch.hpp>
#endif
