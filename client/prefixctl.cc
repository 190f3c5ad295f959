// prefixctl: talk to a prefixd daemon from the shell. See prefixctl_cli.h.
#include <grpc/support/log.h>

#include <cstdlib>
#include <iostream>

#include "client/prefixctl_cli.h"

namespace {

void DiscardGrpcLog(gpr_log_func_args*) {}

}  // namespace

int main(int argc, char** argv) {
  // gRPC logs transport failures (a TLS handshake with a plaintext port) on
  // stderr on its own; prefixctl prints them as one line that says what to
  // change (client/connect_error.h). GRPC_VERBOSITY brings the log back.
  if (std::getenv("GRPC_VERBOSITY") == nullptr)
    gpr_set_log_function(DiscardGrpcLog);
  prefixd::InstallInterruptHandler();
  return prefixd::RunPrefixctl(argc, argv, std::cout, std::cerr);
}
