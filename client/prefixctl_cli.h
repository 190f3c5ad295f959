// prefixctl: the command line of prefixd, as a function so tests can run it
// without a process. See `prefixctl --help` and docs/client.md.
//
// Exit codes: 0 ok, 1 RPC error (or, for `health`, not SERVING), 2 usage
// error.
#ifndef PREFIXD_CLIENT_PREFIXCTL_CLI_H_
#define PREFIXD_CLIENT_PREFIXCTL_CLI_H_

#include <ostream>

namespace prefixd {

inline constexpr int kExitOk = 0;
inline constexpr int kExitRpcError = 1;
inline constexpr int kExitUsage = 2;

// argv[0] is the program name, argv[1..] global flags, a subcommand and its
// flags. Environment: PREFIXD_TOKEN is the default of --token.
int RunPrefixctl(int argc, char** argv, std::ostream& out, std::ostream& err);

// Makes SIGINT/SIGTERM end a running `watch` cleanly (exit 0); outside a
// stream they keep their default action. For main() only.
void InstallInterruptHandler();

}  // namespace prefixd

#endif  // PREFIXD_CLIENT_PREFIXCTL_CLI_H_
