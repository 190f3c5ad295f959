#include "index/pool_resolver.h"

#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "index/zmq_dial.h"

namespace prefixd {
namespace {

std::string Addresses(const std::vector<std::string>& addresses) {
  return absl::StrCat(
      addresses.size(), addresses.size() == 1 ? " address" : " addresses",
      addresses.empty() ? "" : ": ", absl::StrJoin(addresses, ", "));
}

}  // namespace

PoolResolver::PoolResolver(std::string source, std::string pool,
                           std::string host, Resolve resolve)
    : source_(std::move(source)),
      pool_(std::move(pool)),
      host_(std::move(host)),
      resolve_(resolve ? std::move(resolve) : Resolve(ResolveHost)) {}

std::optional<std::vector<std::string>> PoolResolver::Next() {
  absl::StatusOr<std::vector<std::string>> now = resolve_(host_);
  // Only this thread adds to it; others read it for /metrics.
  const bool answered = answered_lookups_.load(std::memory_order_relaxed) > 0;
  if (!now.ok()) {
    failed_lookups_.fetch_add(1, std::memory_order_relaxed);
    if (!failing_) {
      Log(absl::StrCat(
          now.status().message(), "; ",
          answered ? absl::StrCat("its last answer (", Addresses(addresses_),
                                  ") stands until it resolves")
                   : "no address is followed until it resolves"));
    }
    failing_ = true;
    return std::nullopt;
  }
  answered_lookups_.fetch_add(1, std::memory_order_relaxed);
  const bool recovered = failing_;
  failing_ = false;
  if (answered && *now == addresses_) {
    if (recovered) {
      Log(absl::StrCat(host_, " resolves again, to ", Addresses(addresses_)));
    }
    return std::nullopt;
  }
  addresses_ = *std::move(now);
  address_count_.store(addresses_.size(), std::memory_order_relaxed);
  Log(absl::StrCat(host_, recovered ? " resolves again, to " : " resolves to ",
                   Addresses(addresses_)));
  return addresses_;
}

PoolLookups PoolResolver::lookups() const {
  PoolLookups out;
  out.source = source_;
  out.answered = answered_lookups_.load(std::memory_order_relaxed);
  out.failed = failed_lookups_.load(std::memory_order_relaxed);
  out.addresses = address_count_.load(std::memory_order_relaxed);
  return out;
}

void PoolResolver::Log(const std::string& what) const {
  std::fprintf(stderr, "prefixd: %s: %s\n", pool_.c_str(), what.c_str());
}

}  // namespace prefixd
