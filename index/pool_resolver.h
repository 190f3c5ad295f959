// A pool's host name, resolved round after round: what an answer means to
// the pool, for event pools (index/ingest.h) and SGLang pools
// (server/sglang_discovery.h) alike, and the one home of the log line.
//
// An answer is the pool's addresses from then on, even an empty one: the
// resolver says the name has no addresses (NXDOMAIN, as for a headless
// Service without a ready pod). A lookup the resolver could not answer (no
// DNS server reachable, a timeout, SERVFAIL) changes nothing: the last
// answer stands, so a DNS outage does not retire every worker of the pool
// and cost each a full catch-up when it ends.
//
// Logged to stderr: the first answer (even of nothing), every change, the
// first failure of a run of failures and the answer that ends the run.
//
// Thread safety: none; each pool is resolved on one thread.
#ifndef PREFIXD_INDEX_POOL_RESOLVER_H_
#define PREFIXD_INDEX_POOL_RESOLVER_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace prefixd {

class PoolResolver {
 public:
  using Resolve = std::function<absl::StatusOr<std::vector<std::string>>(
      const std::string& host)>;

  // `pool` names the pool in the log ("SGLang pool sg (http://sg:30000)");
  // `resolve` is index/zmq_dial.h's ResolveHost unless a test gives one.
  PoolResolver(std::string pool, std::string host, Resolve resolve = {});

  // Resolves the host again: its addresses when this is the first answer
  // or they differ from the last one, else nullopt (the same answer, or
  // none: the last one stands).
  std::optional<std::vector<std::string>> Next();

  const std::string& host() const { return host_; }

 private:
  void Log(const std::string& what) const;

  const std::string pool_;
  const std::string host_;
  const Resolve resolve_;
  std::vector<std::string> addresses_;  // the last answer
  bool answered_ = false;
  bool failing_ = false;  // the last lookup was not answered
};

}  // namespace prefixd

#endif  // PREFIXD_INDEX_POOL_RESOLVER_H_
