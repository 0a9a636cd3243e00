// The precompiled header of the test executables (cmake/EpTesting.cmake): the third-party and
// standard headers most tests include, parsed once per build instead of once per test source.
// Only headers that do not change with the project: a test still includes what it uses (the
// build with -DEP_TEST_PCH=OFF shows a missing include).
#pragma once

#include "support/catch.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
