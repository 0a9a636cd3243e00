#include "core/log.hpp"

#include "support/catch.hpp"

#include <string>
#include <vector>

namespace {
struct Captured {
  std::vector<std::pair<ep_log_level, std::string>> lines;
};
void capture(ep_log_level level, const char *message, void *payload) {
  static_cast<Captured *>(payload)->lines.emplace_back(level, message);
}
}  // namespace

TEST_CASE("log levels parse case-insensitively and reject unknown names", "[core][log]") {
  ep_log_level level = EP_LOG_OFF;
  CHECK(ep::log::parse_level("DEBUG", level));
  CHECK(level == EP_LOG_DEBUG);
  CHECK(ep::log::parse_level("off", level));
  CHECK(level == EP_LOG_OFF);
  CHECK_FALSE(ep::log::parse_level("loud", level));
}

TEST_CASE("messages below the level are dropped; the rest reach the callback", "[core][log]") {
  Captured captured;
  ep::log::configure(EP_LOG_INFO, capture, &captured);
  ep::log::debug("hidden {}", 1);
  ep::log::info("opened {} with {} experts", "pack.epk", 256);
  ep::log::error("failed");
  ep::log::configure(EP_LOG_WARN, nullptr, nullptr);
  REQUIRE(captured.lines.size() == 2);
  CHECK(captured.lines[0].first == EP_LOG_INFO);
  CHECK(captured.lines[0].second == "opened pack.epk with 256 experts");
  CHECK(captured.lines[1].first == EP_LOG_ERROR);
}
