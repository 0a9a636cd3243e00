#include <expertpack/expertpack.h>

#include <iostream>
#include <string>

int main() {
  if (ep_version_number() != EP_VERSION_NUMBER) return 1;
  if (std::string(ep_status_str(EP_ERR_IO)) != "EP_ERR_IO") return 1;
  std::cout << "consumer (C++): expertpack " << ep_version_string() << "\n";
  return 0;
}
