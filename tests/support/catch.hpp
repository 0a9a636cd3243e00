// Catch2 v2 (Debian 12) and v3 (Ubuntu 24.04) behind one include.
#pragma once
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
#define EP_CATCH_V3 1
#else
#include <catch2/catch.hpp>
#endif
