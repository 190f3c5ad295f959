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
// Thread safety: Next on one thread (the pool's); lookups and names from
// any (atomics).
#ifndef PREFIXD_INDEX_POOL_RESOLVER_H_
#define PREFIXD_INDEX_POOL_RESOLVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace prefixd {

// What a pool's lookups came to, for /metrics.
struct PoolLookups {
  std::string source;      // the pool's source name
  uint64_t answered = 0;   // lookups the resolver answered, even with none
  uint64_t failed = 0;     // lookups it could not answer
  uint64_t addresses = 0;  // in the last answer
};

class PoolResolver {
 public:
  using Resolve = std::function<absl::StatusOr<std::vector<std::string>>(
      const std::string& host)>;

  // `source` is the pool's source name, `pool` names the pool in the log
  // ("SGLang pool sg (http://sg:30000)"); `resolve` is index/zmq_dial.h's
  // ResolveHost unless a test gives one.
  PoolResolver(std::string source, std::string pool, std::string host,
               Resolve resolve = {});
  PoolResolver(const PoolResolver&) = delete;
  PoolResolver& operator=(const PoolResolver&) = delete;

  // Resolves the host again: its addresses when this is the first answer
  // or they differ from the last one, else nullopt (the same answer, or
  // none: the last one stands).
  std::optional<std::vector<std::string>> Next();

  PoolLookups lookups() const;

 private:
  void Log(const std::string& what) const;

  const std::string source_;
  const std::string pool_;
  const std::string host_;
  const Resolve resolve_;
  std::vector<std::string> addresses_;  // the last answer, if any
  bool failing_ = false;                // the last lookup was not answered
  std::atomic<uint64_t> answered_lookups_{0};  // > 0: addresses_ is one
  std::atomic<uint64_t> failed_lookups_{0};
  std::atomic<uint64_t> address_count_{0};  // addresses_.size()
};

}  // namespace prefixd

#endif  // PREFIXD_INDEX_POOL_RESOLVER_H_
