// Checks that a call throws ep::Error with a given status and a message containing a needle:
// the tests pin both the code a C caller sees and the words a person reads.
#pragma once

#include "core/error.hpp"
#include "support/catch.hpp"

#include <string>

namespace ep::test {

template <typename F>
void expect_error(F &&f, ep::Status status, const std::string &needle) {
  try {
    f();
    FAIL("no error; expected " << ep::status_name(status) << " containing '" << needle << "'");
  } catch (const ep::Error &e) {
    INFO(e.what());
    CHECK(e.status() == status);
    CHECK(std::string(e.what()).find(needle) != std::string::npos);
  }
}

}  // namespace ep::test
