// `prefixd --check_config=FILE`: every check start-up makes of a config,
// short of binding the listeners and reading the snapshot, without serving.
// For CI and for operators editing a config on a running host.
#ifndef PREFIXD_SERVER_CHECK_CONFIG_H_
#define PREFIXD_SERVER_CHECK_CONFIG_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "prefixd/v1/config.pb.h"
#include "server/flags.h"

namespace prefixd {

// Loads flags.config_paths with the other flags over it, as start-up does,
// then builds what start-up builds from it: the cache (budget against the
// tenants' reservations) and the authorizer (principals, TLS files). On
// success, the resolved settings: the derived sizes as `#` comments, then
// the whole config, defaults filled in, as textproto (a valid config file).
// INVALID_ARGUMENT (or NOT_FOUND for an unreadable file) naming the field
// and the offending value otherwise.
absl::StatusOr<std::string> CheckConfig(const CommandLine& flags);

// An error of PrefixCache::Create on `config`'s cache options, naming the
// fields a user changes (kv_budget, tenants) before the cache's own words.
absl::Status CacheConfigError(const v1::Config& config,
                              const absl::Status& status);

}  // namespace prefixd

#endif  // PREFIXD_SERVER_CHECK_CONFIG_H_
