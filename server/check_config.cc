#include "server/check_config.h"

#include <google/protobuf/text_format.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "core/cache.h"
#include "model/units.h"
#include "server/auth.h"
#include "server/config.h"

namespace prefixd {
namespace {

std::string DerivedSizes(const ServerConfig& c, uint64_t budget_blocks) {
  const CacheOptions& o = c.cache;
  std::string out = ModelAndSizeLines(c, budget_blocks, "# ");
  for (const TenantSpec& t : o.tenants) {
    absl::StrAppend(&out, "# tenant       ", t.name, " reserved ",
                    FormatBytes(t.quota.reserved_bytes), " limit ",
                    FormatBytes(t.quota.limit_bytes), "\n");
  }
  return out;
}

}  // namespace

// The cache's own errors name tenants and byte counts but not the config's
// fields; a user fixes kv_budget or tenants, so those are named here.
absl::Status CacheConfigError(const v1::Config& config,
                              const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat("kv_budget \"", config.kv_budget(),
                                   "\" / tenants: ", status.message()));
}

absl::StatusOr<std::string> CheckConfig(const CommandLine& flags) {
  ASSIGN_OR_RETURN(ServerConfig config, LoadServerConfig(flags));
  absl::StatusOr<std::unique_ptr<PrefixCache>> cache =
      PrefixCache::Create(config.cache);
  if (!cache.ok()) return CacheConfigError(config.proto, cache.status());
  ASSIGN_OR_RETURN(std::unique_ptr<Authorizer> auth,
                   MakeAuthorizer(config.proto));

  std::string text;
  google::protobuf::TextFormat::Printer printer;
  printer.PrintToString(config.proto, &text);
  std::string warnings;
  for (const std::string& w : ExposureWarnings(config))
    absl::StrAppend(&warnings, "# WARNING: ", w, "\n");
  return absl::StrCat("# ", absl::StrJoin(flags.config_paths, " + "),
                      ": OK; the resolved settings follow\n", warnings,
                      DerivedSizes(config, (*cache)->budget_blocks()), text);
}

}  // namespace prefixd
