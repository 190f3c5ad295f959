// prefixctl: the command line of prefixd, as a function so tests can run it
// without a process. See `prefixctl --help` and docs/client.md.
//
// Exit codes (base/flag_parser.h, shared with prefixd): kExitOk, 1 on an
// RPC error (or, for `health`, not SERVING), kExitUsage.
#ifndef PREFIXD_CLIENT_PREFIXCTL_CLI_H_
#define PREFIXD_CLIENT_PREFIXCTL_CLI_H_

#include <ostream>

#include "base/flag_parser.h"

namespace prefixd {

// prefixctl's kExitFailure: the daemon answered with an error.
inline constexpr int kExitRpcError = kExitFailure;

// argv[0] is the program name, argv[1..] global flags, a subcommand and its
// flags. Environment: PREFIXD_TOKEN is the default of --token.
int RunPrefixctl(int argc, char** argv, std::ostream& out, std::ostream& err);

// Makes SIGINT/SIGTERM end a running `watch` cleanly (exit 0); outside a
// stream they keep their default action. For main() only.
void InstallInterruptHandler();

}  // namespace prefixd

#endif  // PREFIXD_CLIENT_PREFIXCTL_CLI_H_
