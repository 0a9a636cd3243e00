// The test runner's main for every CPU test executable (Catch2 v2 and v3: catch_session.cpp).
#include "support/catch_session.hpp"

int main(int argc, char **argv) { return ep::test::run_catch(argc, argv); }
