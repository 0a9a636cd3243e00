# `docs` target: Doxygen over the public headers. Undocumented public symbols are errors
# (docs/Doxyfile sets WARN_AS_ERROR); the test suite runs the same check (tests/docs).
include_guard(GLOBAL)
find_package(Doxygen QUIET)
if(DOXYGEN_FOUND)
  add_custom_target(docs
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_CURRENT_BINARY_DIR}/docs
    COMMAND ${CMAKE_COMMAND} -E env EP_DOCS_OUT=${CMAKE_CURRENT_BINARY_DIR}/docs
            EP_SOURCE_DIR=${CMAKE_CURRENT_SOURCE_DIR} ${DOXYGEN_EXECUTABLE} docs/Doxyfile
    WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}
    COMMENT "Doxygen: public API reference into ${CMAKE_CURRENT_BINARY_DIR}/docs/html"
    VERBATIM)
endif()
