// The source of ep_test_pch, the target that compiles the test executables' precompiled header
// (test_pch.hpp) once for all of them to reuse (cmake/EpTesting.cmake): a Catch2 runner with no
// test case (its main is the test main's).
