// prefixctl: talk to a prefixd daemon from the shell. See prefixctl_cli.h.
#include <iostream>

#include "client/prefixctl_cli.h"

int main(int argc, char** argv) {
  prefixd::InstallInterruptHandler();
  return prefixd::RunPrefixctl(argc, argv, std::cout, std::cerr);
}
