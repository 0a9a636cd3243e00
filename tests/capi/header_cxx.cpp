// Compiled as C++11 with -Wall -Wextra -pedantic -Werror: the header must work from C++ and
// declare everything extern "C".
#include <expertpack/expertpack.h>

#include <cstdio>
#include <cstring>

int main() {
  static_assert(sizeof(ep_status) == 4, "ep_status must be 32 bits");
  static_assert(sizeof(ep_log_level) == 4, "ep_log_level must be 32 bits");
  if (std::strcmp(ep_status_str(EP_ERR_FORMAT), "EP_ERR_FORMAT") != 0) return 1;
  if (ep_set_log_level(static_cast<ep_log_level>(99)) != EP_ERR_INVALID_ARGUMENT) return 1;
  std::printf("C++ consumer: expertpack %s\n", ep_version_string());
  return 0;
}
