#include <expertpack/expertpack.h>
#include <stdio.h>

int main(void) {
  if (ep_version_number() != EP_VERSION_NUMBER) return 1;
  printf("consumer (C): expertpack %s, status %s\n", ep_version_string(), ep_status_str(EP_OK));
  return 0;
}
