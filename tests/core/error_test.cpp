#include "core/error.hpp"

#include "support/catch.hpp"

#include <cerrno>
#include <iterator>
#include <set>
#include <string>

TEST_CASE("every Status has a distinct C name matching its number", "[core][error]") {
  const ep::Status all[] = {
      ep::Status::ok,          ep::Status::invalid_argument, ep::Status::out_of_memory,
      ep::Status::io,          ep::Status::not_found,        ep::Status::format,
      ep::Status::corrupt,     ep::Status::unsupported,      ep::Status::version,
      ep::Status::struct_size, ep::Status::shape,            ep::Status::cuda,
      ep::Status::no_device,   ep::Status::budget,           ep::Status::cancelled,
      ep::Status::busy,        ep::Status::stale,            ep::Status::internal};
  std::set<std::string> names;
  for (ep::Status s : all) {
    const std::string name = ep::status_name(s);
    CHECK(name.rfind("EP_", 0) == 0);
    names.insert(name);
    CHECK(std::string(ep_status_str(static_cast<ep_status>(s))) == name);
  }
  CHECK(names.size() == std::size(all));
  CHECK(std::string(ep::status_name(static_cast<ep::Status>(-12345))) == "unknown status");
}

TEST_CASE("fail() formats and carries the status", "[core][error]") {
  try {
    ep::fail(ep::Status::format, "{}: offset {} out of bounds", "x.gguf", 42);
    FAIL("fail() returned");
  } catch (const ep::Error &e) {
    CHECK(e.status() == ep::Status::format);
    CHECK(std::string(e.what()) == "x.gguf: offset 42 out of bounds");
  }
}

TEST_CASE("fail_errno maps errno to a status and names the errno", "[core][error]") {
  try {
    ep::fail_errno(ENOENT, "open /nope");
  } catch (const ep::Error &e) {
    CHECK(e.status() == ep::Status::not_found);
    CHECK(std::string(e.what()).find("open /nope: No such file or directory (errno 2)") == 0);
  }
  try {
    ep::fail_errno(EIO, "read pack.epk at offset 4096");
  } catch (const ep::Error &e) {
    CHECK(e.status() == ep::Status::io);
    CHECK(std::string(e.what()).find("read pack.epk at offset 4096: Input/output error") == 0);
  }
}
