// Catch2's runner behind one function, so that the test mains (catch_main.cpp, gpu_main.cpp) need
// not compile Catch2 v2's implementation each (catch_session.cpp compiles it once).
#pragma once

namespace ep::test {

/// Runs the test cases the command line selects (Catch::Session().run); returns the exit code.
int run_catch(int argc, char **argv);

}  // namespace ep::test
