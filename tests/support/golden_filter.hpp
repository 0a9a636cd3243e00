// Which goldens a model test runs: all of them, or the ones EP_TEST_GOLDENS names (a comma-separated
// list, e.g. "deepseek_v4_b"). scripts/dev/gpu-check sets it to give each golden of a long test case its own
// sanitizer job; a name the test does not know fails the test (a typo must not run nothing).
#pragma once

#include "support/catch.hpp"

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace ep::test {

/// The entries of @p all (each with a `name` reached through @p name_of) that EP_TEST_GOLDENS
/// selects, in their order; every entry when the variable is unset or empty.
template <class T, size_t N, class NameOf>
std::vector<T> selected_goldens(const T (&all)[N], NameOf name_of) {
  const char *env = std::getenv("EP_TEST_GOLDENS");
  std::vector<T> out;
  if (!env || !*env) return std::vector<T>(all, all + N);
  std::stringstream list(env);
  for (std::string want; std::getline(list, want, ',');) {
    bool found = false;
    for (const T &g : all)
      if (want == name_of(g)) {
        out.push_back(g);
        found = true;
      }
    INFO("EP_TEST_GOLDENS names '" << want << "', which this test does not have");
    REQUIRE(found);
  }
  std::printf("EP_TEST_GOLDENS=%s: %zu of %zu goldens\n", env, out.size(), N);
  return out;
}

}  // namespace ep::test
